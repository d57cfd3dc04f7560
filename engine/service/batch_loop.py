"""Generations of several requests decoded together (`specdeck-cli serve --parallel N`, N > 1).

A route describes its generation once, as a `Generation` made by its `Start` on the
engine's thread (tokenizing, the request's drafter, what to do with each step); how it
then runs depends on the loaded engine:

- --parallel 1 (the app's private engine, and the default): `run_alone`, one
  `Engine.stream` per request, exactly as before batching; requests take turns.
- --parallel N > 1: `BatchLoop`. Each request that gets one of the N shared turns
  (turns.py) is handed to the loop, which joins it to the one running `EngineBatch`
  (engine/batching.py) between two steps, steps the batch while it holds any sequence,
  and hands each step (or the error that ended a sequence) to its own request. The
  loop runs on the engine's thread, as every job does (host.py `EngineThread`), and
  returns when the batch is empty; the next request starts it again.

Nothing of a request leaks into another: each sequence has its own sampling settings,
seed, stop strings, draft bounds and drafter (the batch's pool, or one made for the
request), and its own cancel event (its client leaving, its X-SpecDeck-Job cancel, its
time limit), which ends that sequence at the next step and no other. A request whose
prompt does not fit its slot's context, or whose slot's cache cannot be allocated, is
refused with the engine's error while the others decode on. The batch keeps its slots
(and their caches, which a follow-up prompt reuses) between requests; it is closed
before any job that needs the engine alone (`close`, from the Host), so a load, a
benchmark or a training finds only the engine's own models in memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.core.events import StepEvent
from engine.core.sampling_config import SamplingConfig


def _nothing(*_args) -> None:
    return None


@dataclass
class Generation:
    """One request's generation, as its route sets it up on the engine's thread."""

    prompt: list[int]
    sampling: SamplingConfig
    on_step: Callable[[StepEvent], None]  # each step, on the engine's thread (counts it, emits it)
    speculative: bool = True
    drafter: Any = None  # a drafter made for this request alone; None: the loaded kind (when speculative)
    draft_length: Any = None  # the request's DraftLength (its speculative.n_max/n_min/p_min); None: the engine's
    snapshots: bool = False  # steps carry the drafter's statistics and the cost model (Engine.stream's)
    on_start: Callable[[Any, Any], None] = _nothing  # (the slot it decodes on, its drafter), before its first step
    close: Callable[[], None] = _nothing  # after its last step, or its error: frees what the route opened for it


# start(engine, cancel, emit) -> the request's Generation, or None when it was cancelled while being set up
Start = Callable[[Any, threading.Event, Callable[[Any], None]], "Generation | None"]


def run_alone(engine, start: Start, cancel: threading.Event, emit: Callable[[Any], None]) -> None:
    """A generation with the engine to itself: `Engine.stream`, the path of --parallel 1."""
    generation = start(engine, cancel, emit)
    if generation is None:
        return
    try:
        drafter = (generation.drafter or engine.drafter) if generation.speculative else None
        generation.on_start(engine.target, drafter)
        # Only what the request set: the call each route made before batching, word for word.
        given = {"drafter": generation.drafter, "draft_length": generation.draft_length}
        options = {name: value for name, value in given.items() if value is not None}
        if generation.snapshots:
            options["snapshots"] = True
        steps = engine.stream(
            generation.prompt, generation.sampling, speculative=generation.speculative, cancel=cancel, **options
        )
        for step in steps:
            generation.on_step(step)
    finally:
        generation.close()


@dataclass(eq=False)
class Member:
    """A request in the batch: how it starts, its cancel event, and where its steps and its end go."""

    start: Start
    cancel: threading.Event
    gone: threading.Event  # nobody reads its steps any more (its client left while it waited)
    emit: Callable[[Any], None]
    done: Callable[[BaseException | None], None]  # its end: None, or the error to raise in its request
    generation: Generation | None = None
    sequence: Any = None
    failure: BaseException | None = field(default=None)  # what its own route code raised mid-run
    ended: bool = False


class BatchLoop:
    """The running batch of a Host whose engine decodes several sequences together."""

    def __init__(self, host) -> None:
        self.host = host
        self.batch = None  # the EngineBatch, made at the first join, kept between requests
        self._lock = threading.Lock()  # guards _joining and _looping (the event loop adds, the engine thread takes)
        self._joining: list[Member] = []
        self._looping = False
        self._members: list[Member] = []  # joined, decoding (engine thread only)

    def add(self, member: Member) -> None:
        """Hand `member` to the loop (from any thread); it joins between two steps."""
        with self._lock:
            self._joining.append(member)
            if self._looping:
                return
            self._looping = True
        self.host.thread.submit(self._loop)

    def close(self) -> None:
        """Free the batch's slots and drafters (on the engine's thread, with no request in it)."""
        if self.batch is not None:
            batch, self.batch = self.batch, None
            batch.close()

    # -- on the engine's thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        joining: list[Member] = []
        try:
            while True:
                with self._lock:
                    joining, self._joining = self._joining, []
                    if not joining and not self._members:
                        self._looping = False
                        return
                for member in joining:
                    self._join(member)
                if self._members:
                    self._step()
        except BaseException as error:  # a bug here, or Ctrl+C: every request hears it, none hangs
            with self._lock:
                joining += self._joining
                self._joining, self._looping = [], False
            ending, self._members = [*self._members, *joining], []
            for member in ending:
                _end(member, error)
            try:
                self.close()
            finally:
                if not isinstance(error, Exception):
                    raise

    def _join(self, member: Member) -> None:
        if member.gone.is_set():  # its client left while it waited: it never starts
            _end(member, None)
            return
        try:
            engine = self._engine()
            if self.batch is None or self.batch.engine is not engine:
                self.close()
                self.batch = engine.batch()
            member.generation = generation = member.start(engine, member.cancel, member.emit)
            if generation is None:  # cancelled while its prompt was tokenized
                _end(member, None)
                return
            member.sequence = self.batch.join(
                generation.prompt,
                generation.sampling,
                speculative=generation.speculative,
                drafter=generation.drafter,
                draft_length=generation.draft_length,
                cancel=member.cancel,
                tag=member,
            )
        except Exception as error:  # noqa: BLE001 - this request's (a prompt too long, no room for its cache)
            _end(member, self._said(error))
            return
        self._members.append(member)
        try:
            generation.on_start(member.sequence.slot, member.sequence.drafter)
        except Exception as error:  # noqa: BLE001 - ends this request at its next step
            _fail(member, error)

    def _step(self) -> None:
        batch = self.batch
        snapshots = any(m.generation.snapshots for m in self._members)
        for sequence, outcome in batch.step(snapshots=snapshots):
            member = sequence.tag
            if isinstance(outcome, BaseException):
                member.failure = member.failure or outcome
            elif member.failure is None:
                try:
                    member.generation.on_step(outcome)
                except Exception as error:  # noqa: BLE001 - ends this request at its next step
                    _fail(member, error)
        running = set(map(id, batch.sequences))
        for member in [m for m in self._members if id(m.sequence) not in running]:
            self._members.remove(member)
            _end(member, member.failure)

    def _engine(self):
        from engine.service.http import require_engine

        return require_engine(self.host)

    def _said(self, error: Exception) -> Exception:
        """A failed allocation of a new slot's cache, said as the engine says one: what ran out, what to try."""
        from engine.models.memory_errors import model_out_of_memory, unexplained_allocation_failure

        if not unexplained_allocation_failure(error) or self.host.engine is None:
            return error
        target = self.host.engine.target
        running = len(self._members)
        said = model_out_of_memory(
            f"open the cache of one more sequence beside the {running} decoding on {target.info.name}",
            target.info,
            target.n_ctx,
            "again once a reply has ended, or serve with a smaller --parallel",
        )
        said.__cause__ = error
        return said


def _fail(member: Member, error: BaseException) -> None:
    """End `member` at its next step with `error` (its own route code failed); the others go on."""
    member.failure = member.failure or error
    member.cancel.set()


def _end(member: Member, error: BaseException | None) -> None:
    """The request's end (once): what its route opened is closed, then its reader hears how it ended."""
    if member.ended:
        return
    member.ended = True
    try:
        if member.generation is not None:
            member.generation.close()
    except Exception as closing:  # noqa: BLE001 - said to the request, unless it already has an error
        error = error or closing
    member.done(error)
