"""Prompt lookup: draft by copying what followed the last n tokens earlier in the text.

No model and no distribution: when a reply quotes, edits or summarizes its input,
the tokens after an earlier occurrence of the current n-gram are often exactly
what comes next. Verified as a point mass (see verify.py), so it is lossless at
any temperature.

Search order: the longest n-gram first (max_ngram down to min_ngram), and among
its occurrences the most recent one, which tracks what the reply is doing now.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from engine.core.sampling import SamplingConfig
from engine.drafters.base import EMPTY_DRAFT, ChainDraft, Draft, Drafter, FreeToAsk
from engine.drafters.ngram_spec import NgramStats
from engine.errors import ConfigError


class NgramDrafter(Drafter):
    name = "ngram"
    capabilities = frozenset({FreeToAsk})  # a lookup in the text: a chain may ask every step

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram <= 16:
            raise ConfigError(f"n-gram sizes must satisfy 1 <= min <= max <= 16, got min={min_ngram}, max={max_ngram}.")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.lookups = 0
        self.hits = 0

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        if k <= 0 or len(context) < 2:
            return EMPTY_DRAFT
        self.lookups += 1
        ids = np.asarray(context, dtype=np.int64)
        for n in range(min(self.max_ngram, len(ids) - 1), self.min_ngram - 1, -1):
            # Windows end before the last token, so every match has at least one token after it.
            windows = sliding_window_view(ids[:-1], n)  # (len - n, n)
            matches = np.flatnonzero((windows == ids[-n:]).all(axis=1))
            if matches.size:
                start = int(matches[-1]) + n
                self.hits += 1
                return ChainDraft(tokens=ids[start : start + k].tolist())
        return EMPTY_DRAFT

    def reset(self) -> None:
        self.lookups = 0
        self.hits = 0

    def stats(self) -> NgramStats:
        return NgramStats(lookups=self.lookups, hits=self.hits)
