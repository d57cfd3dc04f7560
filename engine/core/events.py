"""What a generation run reports as it goes: one `StepEvent` per target forward.

A UI draws these as they arrive: each token says where it came from and with what
probabilities; each step carries its timings and a snapshot of the running
statistics, including the speedup the article's formula predicts from them.

A step read on another thread or in another process (the desktop app, a server's
client) also says which run it belongs to and carries copies of what keeps changing
as decoding goes on, taken on the engine's thread right after the step: the
drafter's statistics and the cost model (`Engine.stream(snapshots=True)`). That one
record is what the server sends and its client rebuilds (engine/service/wire.py),
and what the chat, the charts and the side by side read.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from engine.core.costs import CostSnapshot
from engine.errors import SpecDeckError


class Source(str, enum.Enum):
    """Where an emitted token came from."""

    ACCEPTED = "accepted"  # a draft token the target accepted
    RESAMPLED = "resampled"  # drawn from norm(max(0, p - q)) after a rejection (greedy: the target's argmax)
    BONUS = "bonus"  # drawn from p after all drafted tokens were accepted
    PLAIN = "plain"  # an ordinary target token: nothing was drafted this step
    UNREPORTED = "unreported"  # from a remote server that does not say (engine/remote/steps.py)


SPECULATIVE, VANILLA = "speculative", "vanilla"  # the runs of a reply and of a comparison (StepEvent.run)


@dataclass(frozen=True)
class TokenInfo:
    id: int
    text: str  # what this token added to the reply (may be "" for part of a UTF-8 character)
    source: Source
    p: float  # target probability of the token (processed when sampling, softmax when greedy)
    q: float | None  # draft probability, None when the drafter has no distribution or nothing was drafted
    # The target's best candidates in the row that produced this token (greedy runs): used to explain
    # why a batched verification and a one-token decode chose different tokens.
    top_ids: tuple[int, ...] = ()
    top_logits: tuple[float, ...] = ()

    @property
    def acceptance(self) -> float | None:
        """min(1, p/q) for a drafted token, None otherwise."""
        if self.q is None or self.source in (Source.PLAIN, Source.UNREPORTED):
            return None
        return 1.0 if self.q <= 0 else min(1.0, self.p / self.q)


@dataclass(frozen=True)
class RunStats:
    """A run's running totals, and the figures derived from them.

    Every step (one target forward) gives the reply its accepted drafts and then exactly one
    token of its own (the bonus, the token resampled after a rejection, or a plain token), so

        tokens == steps + accepted,   accepted <= tested <= drafted,   tokens / steps >= 1.

    The token that ends a run counts as a token of the step that made it, though the reply does
    not show it: the end-of-generation token (`StepEvent.end_token`) and the tokens of a stop
    string (`StepEvent.stop_tokens`) are tokens the target generated, as vLLM's and llama.cpp's
    counts have them. When that end came at a draft the target accepted, that draft is the
    step's own token and the drafts accepted after it are dropped unused: the step counts the
    drafts before the end as accepted (and tested), the ones after it as drafted only. So the
    tokens shown plus the end tokens are `tokens`, and no figure contradicts another.
    """

    steps: int = 0  # target forwards in the decode loop
    tokens: int = 0  # tokens generated: the reply's, plus the end token or stop string that ended it
    drafted: int = 0  # draft tokens sent to the target
    accepted: int = 0  # draft tokens accepted and used (not those after the end of the reply)
    tested: int = 0  # draft tokens the rule looked at and counted (accepted + one per rejection)
    wall_s: float = 0.0  # decode loop time (prefill excluded)
    prefill_s: float = 0.0
    time_to_first_token_s: float = 0.0  # from the start of the prefill to the first token shown (0: none yet)
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    draft_cost_ratio: float = 0.0  # time to draft one token / time of one single-token target forward
    verify_cost_ratio: float = 1.0  # time to verify the last k+1 tokens / one single-token forward
    predicted_speedup: float = 1.0  # (1 - a^(k+1)) / (1 - a) / (1 + c), from the measured a and costs
    k: int = 0  # draft length used in the last step
    # Tree drafts (Medusa, EAGLE): per depth d = 1, 2, ... (index d - 1) how many steps
    # offered a node at that depth on the path accepted so far, and how many accepted one.
    # For Medusa, depth d is head d's prediction: accepted/tested is that head's acceptance.
    depth_tested: tuple[int, ...] = ()
    depth_accepted: tuple[int, ...] = ()
    tree_nodes: int = 0  # draft nodes verified in the last step (= drafted for a chain)
    # Plain sentences about how this run differs from what the user may expect, for the UI to
    # show as they are (e.g. a tree drafter on a backend that verifies only chains). Set from
    # the first step on.
    notes: tuple[str, ...] = ()

    @property
    def acceptance_rate(self) -> float:
        """Per-token acceptance a: accepted / tested (the geometric model's estimate, the formula's a)."""
        return self.accepted / self.tested if self.tested else 0.0

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted / drafted: what vLLM and llama.cpp call the draft acceptance rate. Lower than
        acceptance_rate, since the drafts after a rejection were never tested."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target forward (vLLM's mean acceptance length): accepted drafts plus the one
        token every forward gives."""
        return self.tokens_per_step

    @property
    def depth_acceptance(self) -> tuple[float, ...]:
        """Per depth (per Medusa head, per chain position): accepted / tested there."""
        return tuple(a / t if t else 0.0 for a, t in zip(self.depth_accepted, self.depth_tested))

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "draft_acceptance_rate": round(self.draft_acceptance_rate, 4),
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "tokens_per_step": round(self.tokens_per_step, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "wall_s": round(self.wall_s, 4),
            "prefill_s": round(self.prefill_s, 4),
            "time_to_first_token_s": round(self.time_to_first_token_s, 4),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "other_s": round(self.other_s, 4),
            "draft_cost_ratio": round(self.draft_cost_ratio, 4),
            "verify_cost_ratio": round(self.verify_cost_ratio, 4),
            "predicted_speedup": round(self.predicted_speedup, 4),
            "depth_tested": list(self.depth_tested),
            "depth_accepted": list(self.depth_accepted),
            "depth_acceptance": [round(a, 4) for a in self.depth_acceptance],
            "tree_nodes": self.tree_nodes,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class StepEvent:
    index: int  # 0-based step number
    tokens: tuple[TokenInfo, ...]
    text: str  # text this step added
    k: int  # draft length asked for
    drafted: int  # draft tokens actually proposed (a drafter may find fewer than k)
    accepted: int
    draft_s: float
    verify_s: float
    other_s: float
    stats: RunStats
    finish_reason: str | None = None  # "stop" | "length" | "context" | "stop_string" | "cancelled"
    end_token: TokenInfo | None = None  # the end-of-generation token that finished the run, not shown
    stop_tokens: tuple[TokenInfo, ...] = ()  # the stop string's tokens that finished the run, not shown
    batch: int = 1  # sequences whose rows this step's target forward ran (engine/core/batch.py)
    # Set where the step is recorded for a reader elsewhere (Engine.stream(snapshots=True), a
    # remote server's steps); the decoding loop leaves them unset.
    run: str | None = None  # "speculative" or "vanilla": the run of a reply or a comparison it belongs to
    # The drafter's stats() right after this step: a frozen DrafterStats of the type its registry
    # entry names (engine/drafters/registry.py); None in a plain run, or where not recorded.
    drafter_stats: Any = None
    costs: CostSnapshot | None = None  # the engine's cost model right after this step

    @property
    def ended_with(self) -> int:
        """Tokens the target generated that end the run and are not shown (counted in RunStats.tokens)."""
        return len(self.stop_tokens) + (self.end_token is not None)


@dataclass(frozen=True)
class Divergence:
    """Where a speculative greedy run first differs from the vanilla run, and why."""

    index: int  # position in the generated tokens
    speculative_token: int
    vanilla_token: int
    explained: bool
    reason: str

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "speculative_token": self.speculative_token,
            "vanilla_token": self.vanilla_token,
            "explained": self.explained,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class GenerationResult:
    text: str
    tokens: tuple[int, ...]
    stats: RunStats
    finish_reason: str
    events: tuple[StepEvent, ...] = field(default=(), repr=False)

    @property
    def token_infos(self) -> tuple[TokenInfo, ...]:
        return tuple(info for event in self.events for info in event.tokens)


@dataclass(frozen=True)
class Comparison:
    vanilla: GenerationResult
    speculative: GenerationResult
    divergence: Divergence | None  # greedy runs only; None when identical

    @property
    def identical(self) -> bool:
        if -1 in self.vanilla.tokens or -1 in self.speculative.tokens:  # a remote server's: text, no ids
            return self.vanilla.text == self.speculative.text
        return self.vanilla.tokens == self.speculative.tokens

    @property
    def speedup(self) -> float:
        v, s = self.vanilla.stats.tokens_per_s, self.speculative.stats.tokens_per_s
        return s / v if v > 0 else 0.0


def collect(events: list[StepEvent]) -> GenerationResult:
    if not events:
        raise SpecDeckError("The generation produced no steps.")
    tokens = tuple(info.id for event in events for info in event.tokens)
    text = "".join(event.text for event in events)
    last = events[-1]
    return GenerationResult(text, tokens, last.stats, last.finish_reason or "length", tuple(events))
