"""A remote server's streamed reply as the engine's own `StepEvent`s.

A SpecDeck engine reports each step; other servers report less, and each adapter
feeds `StepBuilder` what its server does say, chunk by chunk:

- `tokens`: how many tokens the chunk carries (llama-server's `timings.predicted_n`,
  vLLM's and SGLang's running `usage.completion_tokens`), or None when unknown (then 1);
- `drafted` / `accepted`: the running totals of draft tokens proposed and accepted,
  where the server sends them per chunk (llama-server with `timings_per_token`);
- `step_per_chunk`: the server sends each decoding step as one chunk (vLLM, SGLang),
  so a chunk of m tokens is a step that accepted m - 1 drafts.

From running totals the steps are rebuilt exactly as the engine makes them: a step
whose totals rose by d drafted and a accepted gave a accepted drafts and then the
target's own token, the bonus when a == d, else the token resampled after the
rejection; a step whose totals did not move drafted nothing (a plain token). p and q
never come over these APIs: each token's p is NaN and q None, and the notes say so.

The totals keep RunStats' identity, tokens = steps + accepted (engine/core/events.py): a
step cut short (the end-of-turn token or the limit came inside its accepted drafts; servers
do not send the end token) counts its last token as its own and the accepted drafts before
it, and when the server's own totals for the run replace the chunks' at the end, the steps
are what those totals imply: tokens - accepted.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from engine.core.events import GenerationResult, RunStats, Source, StepEvent, TokenInfo, collect

UNKNOWN_ID = -1  # OpenAI's streams carry text, not token ids


@dataclass
class _Totals:
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class _Open:
    """The step being filled: what it drafted and accepted, and the tokens it has so far."""

    drafted: int | None
    accepted: int | None
    slots: int  # tokens the step gives: accepted + 1 (one for a step of unknown make-up)
    texts: list[str] = field(default_factory=list)


@dataclass
class StepBuilder:
    """Collects one run's chunks; `add` returns the StepEvents they complete, `finish` the result."""

    notes: tuple[str, ...] = ()
    run: str | None = None  # "speculative" or "vanilla": the run the steps belong to (StepEvent.run)
    step_per_chunk: bool = False
    draft_length: int = 0  # the server's k, where known: names a step's last token bonus or resampled
    clock: object = time.perf_counter
    steps: list[StepEvent] = field(default_factory=list)
    _seen: _Totals = field(default_factory=_Totals)
    _open: _Open | None = None
    _stats: RunStats = field(default_factory=RunStats)
    _start: float = 0.0
    _first_token_s: float = 0.0

    def __post_init__(self) -> None:
        self._start = self.clock()
        self._stats = RunStats(notes=self.notes)

    def add(
        self, text: str, *, tokens: int | None = None, drafted: int | None = None, accepted: int | None = None
    ) -> list[StepEvent]:
        """One chunk: its text, and the running totals the server sent with it (None: not sent).
        Returns the steps it completes (none for a chunk that carries no token, or ends no step)."""
        new = (tokens - self._seen.tokens) if tokens is not None else (1 if text else 0)
        if new <= 0:
            return []
        if not self._first_token_s:
            self._first_token_s = self.clock() - self._start
        done: list[StepEvent] = []
        texts = [text] + [""] * (new - 1)  # a chunk's text cannot be split among its tokens: the first has it
        if accepted is None:  # no running counters: each chunk is one step
            a = new - 1 if self.step_per_chunk else None
            d = (max(self.draft_length, a) if self.draft_length else None) if a is not None else None
            self._seen.tokens += new
            return [self._close(_Open(d, a, new, texts))]
        d, a = max(0, (drafted or 0) - self._seen.drafted), max(0, accepted - self._seen.accepted)
        self._seen = _Totals(self._seen.tokens + new, self._seen.drafted + d, self._seen.accepted + a)
        if d or a:  # a verification: its drafts were counted before its tokens were sent
            if self._open is not None:
                done.append(self._close(self._open))
            self._open = _Open(d, a, a + 1)
        for piece in texts:
            if self._open is None:
                self._open = _Open(0, 0, 1)  # nothing drafted: one plain token
            self._open.texts.append(piece)
            if len(self._open.texts) >= self._open.slots:
                done.append(self._close(self._open))
        return done

    def flush(self) -> list[StepEvent]:
        """The step being filled, closed as it is (a stream that broke off inside it)."""
        return [self._close(self._open)] if self._open is not None else []

    def finish(
        self,
        reason: str,
        *,
        wall_s: float | None = None,
        prefill_s: float | None = None,
        drafted: int | None = None,
        accepted: int | None = None,
        depth_tested: tuple[int, ...] | None = None,
        depth_accepted: tuple[int, ...] | None = None,
    ) -> GenerationResult:
        """End the run: `reason` ("stop", "length", "cancelled"...), the server's own timings (seconds)
        where it sent them, and its own totals for the run where it has them (they replace what the
        chunks suggested: two steps sent as one chunk read as one), per draft position too."""
        if self._open is not None:
            self._close(self._open)  # a step cut short: the end-of-turn token or the limit came first
        stats = self._stats
        changes: dict = {"wall_s": wall_s if wall_s else max(0.0, self.clock() - self._start - self._first_token_s)}
        if prefill_s is not None:
            changes["prefill_s"] = prefill_s
        if drafted is not None:
            changes["drafted"] = drafted
        if accepted is not None:
            # Every step gave its accepted drafts and one token of its own: a run of t tokens accepted
            # at most t - 1 drafts in at least one step (and no more than were drafted).
            accepted = max(0, min(accepted, stats.tokens - 1, changes.get("drafted", stats.drafted)))
            rejections = stats.tested - stats.accepted  # the rejections the chunks showed
            changes["accepted"] = accepted
            changes["tested"] = min(accepted + rejections, changes.get("drafted", stats.drafted))
            if stats.tokens:
                changes["steps"] = stats.tokens - accepted
        if depth_tested is not None and depth_accepted is not None:
            changes["depth_tested"], changes["depth_accepted"] = tuple(depth_tested), tuple(depth_accepted)
        stats = replace(stats, **changes)
        if not self.steps:
            self.steps.append(StepEvent(0, (), "", 0, 0, 0, 0.0, 0.0, 0.0, stats, finish_reason=reason, run=self.run))
        else:
            self.steps[-1] = replace(self.steps[-1], stats=stats, finish_reason=reason)
        return collect(self.steps)

    # -- one step -------------------------------------------------------------------------

    def _close(self, step: _Open) -> StepEvent:
        if step is self._open:
            self._open = None
        now = self.clock() - self._start
        count = len(step.texts)
        infos = tuple(
            TokenInfo(UNKNOWN_ID, piece, source, math.nan, None)
            for piece, source in zip(step.texts, _sources(count, step.drafted, step.accepted))
        )
        # A step cut short inside its accepted drafts: its last token is its own (RunStats' identity).
        d, a = step.drafted or 0, min(step.accepted or 0, max(count - 1, 0))
        tested = a if (step.accepted or 0) > a else a + (1 if d > a else 0)
        stats = self._stats
        self._stats = stats = replace(
            stats,
            steps=stats.steps + 1,
            tokens=stats.tokens + count,
            drafted=stats.drafted + d,
            accepted=stats.accepted + a,
            tested=stats.tested + tested,
            k=d,
            tree_nodes=d,
            time_to_first_token_s=stats.time_to_first_token_s or self._first_token_s,
            wall_s=max(0.0, now - self._first_token_s),
        )
        event = StepEvent(len(self.steps), infos, "".join(step.texts), d, d, a, 0.0, 0.0, 0.0, stats, run=self.run)
        self.steps.append(event)
        return event


def _sources(count: int, drafted: int | None, accepted: int | None) -> list[Source]:
    """Where each of a step's `count` tokens came from, given what the step drafted and accepted."""
    if accepted is None:
        return [Source.UNREPORTED] * count
    accepted = min(accepted, count)
    if drafted is None:  # k unknown: the last token was the bonus, or resampled, or plain
        last = Source.UNREPORTED
    elif not drafted and not accepted:
        return [Source.PLAIN] * count
    else:
        last = Source.BONUS if accepted >= drafted else Source.RESAMPLED
    tail = [last] + [Source.PLAIN] * (count - accepted - 1)  # more than a + 1: steps run together
    return [Source.ACCEPTED] * accepted + tail[: count - accepted]
