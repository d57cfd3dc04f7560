"""The "none" drafter: plain decoding, every token from the target alone."""

from __future__ import annotations

from dataclasses import dataclass

from engine.drafters.registry import DrafterSpec


@dataclass(frozen=True)
class NoOptions:
    """A drafter without settings."""


def make(target, options: NoOptions, load) -> None:
    return None  # no drafter: Engine.stream refuses speculative runs, plain decoding works


def preflight(ctx, options: NoOptions) -> list:
    from engine.models.doctor import Finding

    return [
        Finding(
            "info",
            "No drafter",
            "Every token comes from the target alone: speculative runs are refused, plain decoding works. "
            "Choose n-gram lookup or a draft model to decode speculatively.",
        )
    ]


DRAFTER = DrafterSpec(
    name="none",
    label="None: plain decoding",
    summary="No drafting: every token comes from the target alone.",
    options=NoOptions,
    make=make,
    preflight=preflight,
    order=0,
    short_name="no drafter",
)
