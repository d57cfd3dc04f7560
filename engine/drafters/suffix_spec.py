"""The suffix decoding drafter's registry entry; the algorithm is suffix.py."""

from __future__ import annotations

from dataclasses import dataclass

from engine.drafters.registry import DrafterSpec, DrafterStats, setting, stat
from engine.lazy import named


@dataclass(frozen=True)
class SuffixOptions:
    max_depth: int = setting(
        24,
        label="Longest draft",
        minimum=1,
        maximum=64,
        cli="--suffix-depth",
        help="suffix: most tokens drafted past the match (default 24)",
    )
    spec_factor: float = setting(
        8.0,
        label="Draft per matched token",
        minimum=0.1,
        maximum=32.0,
        cli="--suffix-factor",
        help="suffix: draft at most this many tokens per token of the match (default 8)",
    )
    min_prob: float = setting(
        0.2,
        label="Least share",
        minimum=0.0,
        maximum=1.0,
        cli="--suffix-min-prob",
        help="suffix: draft a token only where at least this share of the earlier "
        "occurrences continued with it (default 0.2)",
    )
    history_tokens: int = setting(
        200_000,
        label="Earlier replies kept",
        minimum=0,
        maximum=10_000_000,
        cli="--suffix-history",
        help="suffix: tokens of earlier replies searched besides the text (0: the text only; default 200000)",
    )


@dataclass(frozen=True)
class SuffixStats(DrafterStats):
    lookups: int = stat(label="Lookups", chart=False)
    hits: int = stat(label="Drafts", chart=False)
    from_history: int = stat(label="Drafts from earlier replies", chart=False)
    match_length: int = stat(label="Match length", unit="tokens")
    draft_size: int = stat(label="Draft size", unit="tokens")
    history_tokens: int = stat(label="Earlier replies", unit="tokens", chart=False)


def make(target, options: SuffixOptions, load):
    from engine.backends.capabilities import TreeForward, has

    SuffixDrafter = named("engine.drafters.suffix:SuffixDrafter")  # suffix.py imports this module

    return SuffixDrafter(
        trees=has(target, TreeForward),
        max_depth=options.max_depth,
        spec_factor=options.spec_factor,
        min_prob=options.min_prob,
        history_tokens=options.history_tokens,
    )


def preflight(ctx, options: SuffixOptions) -> list:
    from engine.models.doctor import Finding

    return [
        Finding(
            "ok",
            "Suffix decoding needs no draft model",
            "Draft tokens are what followed the longest earlier match of the text's end, in this conversation "
            "and in earlier replies, so nothing can mismatch. It drafts long where it has long matches "
            "(code edits, repeated formats, quoting) and little elsewhere.",
        )
    ]


DRAFTER = DrafterSpec(
    name="suffix",
    label="Suffix decoding (no draft model)",
    summary="Drafts what followed the longest earlier match of the text's end, in this conversation and "
    "in earlier replies, as many tokens as the match supports.",
    options=SuffixOptions,
    make=make,
    preflight=preflight,
    stats=SuffixStats,
    trees=True,
    order=20,
    short_name="suffix decoding",
    default_on=("torch",),  # ahead of n-gram lookup on PyTorch on every prompt kind (docs/benchmarks.md)
)
