"""The n-gram (prompt lookup) drafter's registry entry; the algorithm is ngram.py."""

from __future__ import annotations

from dataclasses import dataclass

from engine.drafters.registry import DrafterSpec, DrafterStats, setting, stat
from engine.lazy import named


@dataclass(frozen=True)
class NgramOptions:
    max_ngram: int = setting(
        3,
        label="N-gram length",
        minimum=1,
        maximum=16,
        cli="--ngram-max",
        help="ngram: longest run of recent tokens looked up in the earlier text (default 3)",
    )


@dataclass(frozen=True)
class NgramStats(DrafterStats):
    lookups: int = stat(label="Lookups", chart=False)
    hits: int = stat(label="Hits", chart=False)


def make(target, options: NgramOptions, load):
    NgramDrafter = named("engine.drafters.ngram:NgramDrafter")  # ngram.py imports this module

    return NgramDrafter(max_ngram=options.max_ngram)


def preflight(ctx, options: NgramOptions) -> list:
    from engine.models.doctor import Finding

    return [
        Finding(
            "ok",
            "N-gram lookup needs no draft model",
            "Draft tokens are copied from earlier text in the conversation, so nothing can mismatch. "
            "It helps most when the reply repeats the prompt (code edits, summaries, lists).",
        )
    ]


DRAFTER = DrafterSpec(
    name="ngram",
    label="N-gram lookup (no draft model)",
    summary="Copies what followed the last few tokens earlier in the text: free, and best when the reply "
    "repeats the prompt.",
    options=NgramOptions,
    make=make,
    preflight=preflight,
    stats=NgramStats,
    order=10,
    short_name="n-gram drafter",
    default_on=("llama.cpp",),  # ahead of suffix decoding on llama.cpp's open prompts (docs/benchmarks.md)
)
