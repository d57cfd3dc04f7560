"""Several generations decoded together: one target forward per step over all of them.

A `Batch` holds up to `capacity` sequences (engine/core/sequence.py), each on a slot of
the target (engine/backends/capabilities.py Slots: the target itself is the first).
Sequences join and leave between steps (continuous batching: a server's requests come
and go while the others decode). Each step:

    1. every sequence still running gets its draft length (engine/core/batch_k.py: at B = 1
       the sequence's own DraftLength, as always; above, the lengths that maximize the
       batch's expected tokens per second, down to 0 for all) and drafts; draft models on
       slots of one model draft together, one draft forward per position (DraftsTogether);
    2. ONE target forward runs the rows of every sequence (`run_calls`: one sequence alone
       goes through its slot's own forward, so B = 1 is the single-sequence decoding it
       always was);
    3. each sequence judges its rows with the lossless rule, commits its own cache and
       makes its StepEvent (`Sequence.finish`).

The cost model hears the forward's total rows and seconds, T(rows): the same curve one
sequence's steps measure, so the load-time curve and every step teach automatic k what a
batch of that many rows costs. A sequence that joined since the last step is prefilled
first, on its own (a prompt is many rows of one sequence; the others wait for it once).
An error in one sequence's drafter or sampling ends that sequence only. An out-of-memory
error of the shared forward (a cache that grew past the memory) goes to the sequence that
joined last, and the others run again without it; any other error of the shared forward
ends them all, since none has its rows.
"""

from __future__ import annotations

import threading
import time

from engine.backends.base import Backend, common_prefix_length
from engine.backends.capabilities import Slots, has
from engine.backends.slots import SlotsFull, run_calls
from engine.core.batch_k import choose_draft_lengths
from engine.core.draft_length import CostModel, DraftLength
from engine.core.events import StepEvent
from engine.core.sampling import SamplingConfig
from engine.core.sequence import Sequence
from engine.drafters.base import Drafter, DraftsTogether
from engine.errors import ConfigError, OutOfMemoryError

Outcome = StepEvent | BaseException  # what a step made for one sequence: its event, or what ended it


class Batch:
    """Up to `capacity` generations on one target, stepped together."""

    def __init__(self, target: Backend, costs: CostModel | None = None, *, capacity: int = 1) -> None:
        if capacity < 1:
            raise ConfigError(f"A batch holds at least one sequence, not {capacity}.")
        limit = getattr(target, "max_slots", 1) if has(target, Slots) else 1
        if capacity > limit:
            raise ConfigError(
                f"{target.info.name} was loaded for {limit} sequence{'s' if limit != 1 else ''} at once and "
                f"{capacity} were asked for: load it with --parallel {capacity}."
            )
        self.target = target
        self.capacity = capacity
        self.costs = costs if costs is not None else CostModel()
        self.costs.replays = target.replays_on_rollback  # a rejection costs a restore and a replay
        self.sequences: list[Sequence] = []
        self._idle: list[Backend] = [target]  # slots without a sequence, each keeping its cache
        self._opened: list[Backend] = []  # slots opened on the target, closed with the batch

    @property
    def full(self) -> bool:
        return len(self.sequences) >= self.capacity

    def join(
        self,
        prompt: list[int],
        sampling: SamplingConfig,
        *,
        drafter: Drafter | None = None,
        draft_length: DraftLength | None = None,
        cancel: threading.Event | None = None,
        notes: tuple[str, ...] = (),
        tag=None,
    ) -> Sequence:
        """Add a generation; it starts (is prefilled) at the next step. Raises what its checks find (an
        empty or too long prompt, a drafter the target cannot serve), SlotsFull when the batch is full,
        an out-of-memory error when a new slot's cache does not fit; the sequences running go on."""
        if self.full:
            raise SlotsFull(f"All {self.capacity} sequences of this batch are in use.")
        slot = self._slot_for(prompt)
        try:
            sequence = Sequence(
                slot,
                prompt,
                sampling,
                drafter=drafter,
                draft_length=draft_length,
                costs=self.costs,
                cancel=cancel,
                notes=notes,
                tag=tag,
            )
        except BaseException:
            self._idle.append(slot)
            raise
        self.sequences.append(sequence)
        return sequence

    def _slot_for(self, prompt: list[int]) -> Backend:
        """The idle slot whose cache shares the longest prefix with `prompt` (its prefill then reuses
        it, as one sequence's next reply reuses its chat so far); a new slot when none is idle."""
        if self._idle:
            best = max(self._idle, key=lambda slot: common_prefix_length(slot.tokens, prompt))
            self._idle.remove(best)
            return best
        slot = self.target.open_slot()
        self._opened.append(slot)
        return slot

    def step(self) -> list[tuple[Sequence, Outcome]]:
        """One step of every sequence: their events (or errors) in join order. Sequences that ended
        (their event has a finish reason, or an error) have left the batch when this returns."""
        outcomes: dict[int, Outcome] = {}
        for sequence in self.sequences:
            if sequence.started:
                continue
            if sequence.cancelled:  # before the prefill, the step's first costly part
                outcomes[id(sequence)] = sequence.end_early("cancelled")
                continue
            failed = _attempt(sequence.start)
            if failed is not None:
                outcomes[id(sequence)] = failed
        running = [s for s in self.sequences if id(s) not in outcomes]
        planning = []
        for sequence in running:
            if sequence.cancelled:
                outcomes[id(sequence)] = sequence.end_early("cancelled")
            elif sequence.room < 0:
                outcomes[id(sequence)] = sequence.end_early("context")
            else:
                planning.append(sequence)
        feeds = {}
        ks = choose_draft_lengths(planning, self.costs)
        drafted = _draft_together(planning, ks, outcomes)
        for sequence, k in zip(planning, ks):
            if id(sequence) in outcomes:  # its drafter failed drafting with the others
                continue
            feed = _attempt(sequence.plan, k, drafted.get(id(sequence)))
            if isinstance(feed, BaseException):
                outcomes[id(sequence)] = feed
            else:
                feeds[id(sequence)] = (sequence, feed)
        ran = self._forward(list(feeds.values()), outcomes)
        for sequence, logits, verify_s, batch in ran:
            outcomes[id(sequence)] = _attempt(sequence.finish, logits, verify_s, batch)
        results = [(s, outcomes[id(s)]) for s in self.sequences if outcomes.get(id(s)) is not None]
        for sequence, outcome in results:
            if isinstance(outcome, BaseException) or sequence.ended:
                self._leave(sequence)
        return results

    def _forward(self, planned: list, outcomes: dict) -> list:
        """2. of the step: (sequence, its rows l_0..l_n, the forward's seconds, the sequences it ran) for
        each planned one.
        The feeds that can join a batch run in one forward; an early-exit feed runs its own."""
        together = [(s, f) for s, f in planned if f.batchable]
        ran = []
        while together:
            calls = [feed.call(sequence.slot, sequence.context[-1]) for sequence, feed in together]
            begin = time.perf_counter()
            try:
                blocks = run_calls(self.target, calls)
            except OutOfMemoryError as error:
                if len(together) == 1:
                    outcomes[id(together[0][0])] = error
                    break
                # The batch grew past the memory: the sequence that joined last gets the error, and the
                # others, whose caches the failed forward left as they were, run without it.
                newest, _ = together.pop()
                outcomes[id(newest)] = error
                continue
            except Exception as error:  # the shared forward failed: no sequence has its rows
                for sequence, _ in together:
                    outcomes[id(sequence)] = error
                break
            verify_s = time.perf_counter() - begin
            self.costs.observe_verify(sum(f.rows for _, f in together), verify_s)  # T(rows of the batch)
            batched = len(together) > 1
            ran += [(s, f.receive(b, batched), verify_s, len(together)) for (s, f), b in zip(together, blocks)]
            break
        for sequence, feed in planned:
            if feed.batchable:
                continue
            begin = time.perf_counter()
            logits = _attempt(feed.forward, sequence.slot, sequence.context[-1])
            if isinstance(logits, BaseException):
                outcomes[id(sequence)] = logits
                continue
            verify_s = time.perf_counter() - begin
            self.costs.observe_verify(feed.rows, verify_s)
            ran.append((sequence, logits, verify_s, 1))
        return ran

    def _leave(self, sequence: Sequence) -> None:
        sequence.leave()
        self.sequences.remove(sequence)
        self._idle.append(sequence.slot)

    def close(self) -> None:
        """Free the slots this batch opened (never the target itself); the batch is unusable after."""
        for sequence in list(self.sequences):
            self._leave(sequence)
        for slot in self._opened:
            slot.close()
        self._opened.clear()
        self._idle = []


def _draft_together(sequences: list[Sequence], ks: list[int], outcomes: dict) -> dict:
    """Drafts of the sequences whose drafters draft together (DraftsTogether: a draft model's slots),
    made in shared forwards: id(sequence) -> (draft, its share of the seconds). A failure ends every
    sequence of that group."""
    groups: dict = {}
    for sequence, k in zip(sequences, ks):
        if k > 0 and has(sequence.drafter, DraftsTogether):
            groups.setdefault(sequence.drafter.together_key(), []).append((sequence, k))
    drafted = {}
    for group in groups.values():
        if len(group) < 2:
            continue  # alone: its own propose, in plan
        members = [s for s, _ in group]
        begin = time.perf_counter()
        drafts = _attempt(
            type(members[0].drafter).propose_together,
            [s.drafter for s in members],
            [s.context for s in members],
            [k for _, k in group],
            [s.sampling for s in members],
            [s.generator for s in members],
        )
        share = (time.perf_counter() - begin) / len(members)
        for i, sequence in enumerate(members):
            if isinstance(drafts, BaseException):
                outcomes[id(sequence)] = drafts
            else:
                drafted[id(sequence)] = (drafts[i], share)
    return drafted


def _attempt(function, *args):
    """function(*args), or the Exception it raised (one sequence's failure is that sequence's);
    a KeyboardInterrupt and the like go through."""
    try:
        return function(*args)
    except Exception as error:  # noqa: BLE001 - handed to the sequence's reader, who says it
        return error
