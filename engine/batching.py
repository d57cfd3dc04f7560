"""`EngineBatch`: several generations of one loaded Engine decoded together (a server's --parallel N).

The step itself is engine/core/batch.py's; this adds what `Engine.stream` adds to one
generation: the drafter, the draft length, the events' snapshots, the out-of-memory sentence.

Every sequence needs a drafter of its own (a drafter keeps state for the text it drafts
for). They come from a pool that starts with the engine's loaded drafter and grows as more
sequences run at once, each new one made like it: a drafter that loads nothing (n-gram,
suffix, lookahead) is made anew; a draft model's drafter gets a slot of the draft model
(one more sequence on the same weights). A drafter returns to the pool when its sequence
ends, keeping its state (a draft model's cache, a suffix tree's replies) for the next. Drafters
that read one sequence's hidden states or run the target's own layers, or weights made for the
target (Medusa, EAGLE, MTP, early exit, the Gemma 4 assistant, chains with a draft model) serve
one sequence at a time:
`check_batchable` refuses them for --parallel above 1 before anything loads.
"""

from __future__ import annotations

import dataclasses
import threading

from engine.backends.capabilities import Slots, TreeForward, has
from engine.core.batch import Batch
from engine.core.decode import run_notes
from engine.core.draft_length import DraftLength
from engine.core.events import SPECULATIVE, VANILLA, StepEvent
from engine.core.sampling import SamplingConfig
from engine.core.sequence import Sequence
from engine.drafters.base import Drafter, drafter_stats, share_costs
from engine.drafters.per_request import made_per_request
from engine.drafters.registry import drafter_names, drafter_spec, make_drafter
from engine.errors import ConfigError
from engine.models.memory_errors import model_out_of_memory, unexplained_allocation_failure

MODEL_DRAFTER = "model"


def batchable(name: str | None) -> bool:
    """Whether drafter `name` (a registry name; None or "none": plain decoding) can draft for several
    sequences at once: a draft model (whose slots batch), or a drafter that loads nothing and asks the
    target for nothing but a masked forward. One that runs the target's own layers or reads its states
    (early exit: LayerExit) would read the first sequence's cache while drafting for another."""
    if name in (None, "none", MODEL_DRAFTER):
        return True
    spec = drafter_spec(name)
    return made_per_request(spec) and set(spec.needs) <= {TreeForward}


def check_batchable(drafter: str | None, parallel: int) -> None:
    """ConfigError, before anything loads, for a --parallel N the config cannot serve."""
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ConfigError(
            f"--parallel must be a whole number of 1 or more (sequences decoded together), got {parallel!r}."
        )
    if parallel > 1 and not batchable(drafter):
        usable = ", ".join(n for n in drafter_names() if n != "none" and batchable(n))
        raise ConfigError(
            f"The {drafter} drafter reads one sequence's hidden states or weights made for the target, so it "
            f"drafts for one sequence at a time: serve it with --parallel 1, or choose a drafter that batches "
            f"({usable}) for --parallel {parallel}."
        )


class EngineBatch:
    """Up to `engine.config.parallel` generations of `engine`, stepped together (`step`)."""

    def __init__(self, engine, capacity: int | None = None) -> None:
        self.engine = engine
        capacity = capacity or engine.config.parallel
        check_batchable(engine.config.drafter if engine.drafter is not None else None, capacity)
        self.batch = Batch(engine.target, engine.costs, capacity=capacity)
        self._pool: list[Drafter] = [engine.drafter] if engine.drafter is not None else []
        self._made: list[Drafter] = []  # drafters this batch made, closed with it
        self._lent: dict[int, tuple[Drafter, bool]] = {}  # id(sequence) -> (drafter, back to the pool)

    @property
    def full(self) -> bool:
        return self.batch.full

    @property
    def sequences(self) -> list[Sequence]:
        return self.batch.sequences

    def join(
        self,
        prompt: list[int],
        sampling: SamplingConfig,
        *,
        speculative: bool = True,
        drafter: Drafter | None = None,
        draft_length: DraftLength | None = None,
        cancel: threading.Event | None = None,
        tag=None,
    ) -> Sequence:
        """A generation joins (as `Engine.stream` takes it: `drafter` one made for this request alone,
        else one of the loaded kind from the pool); it starts at the next step."""
        engine = self.engine
        if speculative and drafter is None and engine.drafter is None:
            raise ConfigError("No drafter is loaded: choose n-gram lookup or a draft model to decode speculatively.")
        pooled = speculative and drafter is None
        if pooled:
            drafter = self._pool.pop() if self._pool else self._make()
        if not speculative:
            drafter = None
        if drafter is not None and draft_length is None:
            draft_length = DraftLength(engine.config.k, engine.config.k_max)
        try:
            sequence = self.batch.join(
                prompt,
                sampling,
                drafter=drafter,
                draft_length=draft_length,
                cancel=cancel,
                notes=run_notes(engine.target, drafter),
                tag=tag,
            )
        except BaseException:
            if pooled:
                self._pool.append(drafter)
            raise
        if drafter is not None:
            self._lent[id(sequence)] = (drafter, pooled)
        return sequence

    def _make(self) -> Drafter:
        """One more drafter of the loaded kind, for one more sequence at once."""
        engine = self.engine
        loaded = engine.drafter
        backend = getattr(loaded, "backend", None)
        if engine.config.drafter == MODEL_DRAFTER and has(backend, Slots):
            drafter = type(loaded)(backend.open_slot(), loaded.target_vocab_size, owner=backend)
        else:
            drafter = make_drafter(engine.target, engine.config)
        share_costs(drafter, engine.costs)
        self._made.append(drafter)
        return drafter

    def step(self, snapshots: bool = False) -> list[tuple[Sequence, StepEvent | BaseException]]:
        """One step of every sequence (engine/core/batch.py `Batch.step`), each event with its run and,
        given `snapshots`, the drafter's statistics and the cost model as they stand after it."""
        outcomes = []
        for sequence, outcome in self.batch.step():
            if isinstance(outcome, StepEvent):
                run = SPECULATIVE if sequence.drafter is not None else VANILLA
                extra = {"drafter_stats": drafter_stats(sequence.drafter), "costs": self.engine.costs.snapshot()}
                outcome = dataclasses.replace(outcome, run=run, **(extra if snapshots else {}))
            elif unexplained_allocation_failure(outcome):
                target = self.engine.target
                said = model_out_of_memory(
                    f"generate with {target.info.name}", target.info, target.n_ctx, "a shorter prompt"
                )
                said.__cause__ = outcome
                outcome = said
            if sequence not in self.batch.sequences:
                self._give_back(sequence)
            outcomes.append((sequence, outcome))
        return outcomes

    def _give_back(self, sequence: Sequence) -> None:
        drafter, pooled = self._lent.pop(id(sequence), (None, False))
        if drafter is not None and pooled:
            self._pool.append(drafter)

    def close(self) -> None:
        """End every sequence and free what the batch made (never the engine's own drafter or models)."""
        for sequence in list(self.batch.sequences):
            self._give_back(sequence)
        self.batch.close()
        for drafter in self._made:
            drafter.close()
        self._made.clear()
        self._pool = []
