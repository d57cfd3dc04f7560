"""A toy drafter in one module: it proposes the last token again, `copies` times.

The registry test (tests/engine/drafters/test_registry.py) puts this folder on
`engine.drafters.__path__`; nothing else registers it. It is a drafter like any
other: options with their settings, a preflight rule, typed statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.drafters.base import EMPTY_DRAFT, ChainDraft, Draft, Drafter
from engine.drafters.registry import DrafterSpec, DrafterStats, setting, stat


@dataclass(frozen=True)
class RepeatOptions:
    copies: int = setting(2, label="Copies", minimum=1, maximum=8, help="repeat: times the last token is proposed")


@dataclass(frozen=True)
class RepeatStats(DrafterStats):
    proposals: int = stat(label="Proposals", unit="drafts")


class RepeatDrafter(Drafter):
    name = "repeat"

    def __init__(self, copies: int) -> None:
        self.copies = copies
        self.proposals = 0

    def propose(self, context, k, sampling, generator) -> Draft:
        if k <= 0 or not context:
            return EMPTY_DRAFT
        self.proposals += 1
        return ChainDraft(tokens=[context[-1]] * min(k, self.copies))

    def stats(self) -> RepeatStats:
        return RepeatStats(proposals=self.proposals)


def make(target, options: RepeatOptions, load) -> RepeatDrafter:
    return RepeatDrafter(options.copies)


def preflight(ctx, options: RepeatOptions) -> list:
    from engine.models.doctor import Finding

    return [
        Finding(
            "ok",
            "The repeat drafter needs nothing",
            f"It proposes the last token {options.copies} times; the target keeps what it agrees with.",
        )
    ]


DRAFTER = DrafterSpec(
    name="repeat",
    label="Repeat the last token",
    summary="Proposes the last token again (a test drafter).",
    options=RepeatOptions,
    make=make,
    preflight=preflight,
    stats=RepeatStats,
)
