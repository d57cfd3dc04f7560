"""A separate, smaller draft model on either backend.

The draft model keeps its own KV cache in step with the committed text: before
drafting it rolls back to the longest prefix it shares with the context (which
drops the drafts the target rejected and keeps the accepted ones), feeds what is
missing, then decodes k tokens one at a time. After a drafting step at most two
tokens are missing (the last draft when all were kept, and the target's token);
more means plain steps went by (automatic k chose 0) or a new prompt came, and
those go in first as one prefill, timed apart as `ChainDraft.catch_up_s`: a prefill of
n tokens costs far less than n decodes, and charging it per drafted token made a
probe after plain steps look like drafting cost ten times what it does. q for each token is the draft's
distribution after the same processing as the target's (temperature, top-k,
top-p), in the target's vocabulary width.
"""

from __future__ import annotations

import time

import torch

from engine.backends.base import Backend, common_prefix_length
from engine.core.draft_length import measure_draft_cost
from engine.core.sampling import SamplingConfig, draw
from engine.drafters.base import EMPTY_DRAFT, ChainDraft, Draft, Drafter, MeasuresCost
from engine.errors import IncompatiblePairError

STEP_LEFTOVER = 2  # tokens a drafting step leaves for the next one to feed (see the docstring)


class ModelDrafter(Drafter):
    name = "draft model"
    capabilities = frozenset({MeasuresCost})

    def __init__(self, backend: Backend, target_vocab_size: int) -> None:
        self.backend = backend
        self.target_vocab_size = target_vocab_size
        if backend.vocab_size < target_vocab_size - 128 or backend.vocab_size > target_vocab_size + 1024:
            raise IncompatiblePairError(
                f"The draft model's vocabulary has {backend.vocab_size} entries and the target's "
                f"{target_vocab_size}: they are not the same tokenizer. Pick a draft model from the "
                "target's family (run the pair check to see what differs)."
            )

    def reset(self) -> None:
        """At the start of each generation: the draft model's threads follow the free cores too."""
        self.backend.prepare_threads()

    def _to_target_width(self, logits: torch.Tensor) -> torch.Tensor:
        """Cut or pad (with -inf) the draft's logits to the target's vocabulary width."""
        width = self.target_vocab_size
        if logits.shape[-1] == width:
            return logits
        if logits.shape[-1] > width:
            return logits[..., :width]
        pad = torch.full((*logits.shape[:-1], width - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        k = min(k, self.backend.n_ctx - len(context))
        if k <= 0:
            return EMPTY_DRAFT
        # Sync the cache: keep the shared prefix, but always feed at least the last token.
        keep = min(common_prefix_length(self.backend.tokens, context), len(context) - 1)
        self.backend.rollback(keep)
        missing = context[keep:]
        catch_up_s = 0.0
        if len(missing) > STEP_LEFTOVER:  # catching up after plain steps: one prefill, timed apart
            start = time.perf_counter()
            self.backend.forward(missing[:-1], all_logits=False)
            catch_up_s = time.perf_counter() - start
            missing = missing[-1:]
        logits = self.backend.forward(missing, all_logits=False)[-1]
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        q_token: list[float] = []
        for i in range(k):
            token, q, p = draw(self._to_target_width(logits), sampling, generator)
            tokens.append(token)
            q_token.append(p)
            if q is not None:
                q_rows.append(q)
            if i + 1 < k:
                logits = self.backend.forward([token])[-1]
        q = torch.stack(q_rows) if q_rows else None
        return ChainDraft(tokens=tokens, q=q, q_token=tuple(q_token), catch_up_s=catch_up_s)

    def measure_token_cost(self) -> float:
        return measure_draft_cost(self.backend)

    def close(self) -> None:
        self.backend.close()
