"""The one object that owns the engine: loads it, runs generations, reports back.

Views never touch the `Engine` directly. They call `load`, `chat`, `compare` or
`stop` here, and listen to signals that arrive on the GUI thread. Every job runs
on a worker thread through one `TaskRunner`, so there is never more than one
thing using the model: a new request cancels the running one (the engine stops
at its next step) and starts once the old thread has ended. Tokenizing the
prompt happens in the job too, since it uses the model the previous job may
still hold.

Every `SpecDeckError` becomes `sig_error` with the engine's own message; any
other exception is a bug, reported the same way with its type so that the
window survives it.

Replies and comparisons run through the engine's own layers (`Engine.generate`
and `Engine.compare` with `on_event`). Their callback runs on the worker thread
between two steps, while the decode loop waits at its `yield`, and there the
job copies what the GUI shows beside the step: the drafter's statistics
(`Drafter.stats()`: lookahead's n-gram pool, the early-exit layer...) and the
cost model (`CostSnapshot`), which both keep changing as decoding goes on. The
copies travel with the step (`sig_step_stats`). What the window shows about the
loaded pair is copied the same way when it loads (`LoadedPair`). Nothing on the
GUI thread reads the engine, its drafter or its cost model while they decode.

Other work on the engine (the benchmark) borrows it through `lend`, in turn
with everything else: the window's engine when it was loaded from the same
configuration, else none, after the window's engine has been freed, so that a
machine never holds two copies of the models.
"""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal, Slot

from engine import DrafterStats, Engine, EngineConfig, SamplingConfig, SpecDeckError
from app.runtime.costs import CostSnapshot
from app.runtime.worker import GeneratorWorker, TaskRunner

LOAD, CHAT, COMPARE = "load", "chat", "compare"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedPair:
    """What the window shows about the loaded engine, copied on the worker thread when it loaded."""

    config: EngineConfig
    target: Any  # the target's ModelInfo (name, dtype, backend...)
    speculative: bool  # there is a drafter
    notes: tuple[str, ...]  # Engine.notes: e.g. a tree drafter cut to one branch on llama.cpp
    costs: CostSnapshot  # the cost model as measured at load


def loaded_pair(engine: Engine) -> LoadedPair:
    """`engine`'s LoadedPair; call it on the thread that loaded it, before anything decodes."""
    return LoadedPair(engine.config, engine.target.info, engine.drafter is not None,
                      tuple(str(note) for note in engine.notes if note), CostSnapshot.of(engine.costs))  # fmt: skip


class EngineController(QObject):
    """Loads the engine and runs chat replies and comparisons, one at a time."""

    sig_load_progress = Signal(str, float)
    """What loading is doing, and the fraction done."""

    sig_loaded = Signal(object)
    """An engine is ready; the argument is its EngineConfig (and `loaded` says the rest)."""

    sig_unloaded = Signal(object)
    """The engine was freed for a job on another pair (`lend`); the argument is the freed engine's
    EngineConfig, for loading it again afterwards."""

    sig_run_started = Signal(str)
    """A chat reply ("chat") or a comparison ("compare") started decoding."""

    sig_step = Signal(str, object)
    """One decoding step: the run's label ("speculative" or "vanilla") and the StepEvent."""

    sig_step_stats = Signal(str, object, object, object)
    """The same step (emitted just before sig_step) with what was copied on the worker thread just
    after it: the drafter's statistics (a dict, or None: a plain run, no drafter, stats() failed)
    and the cost model (a CostSnapshot)."""

    sig_run_finished = Signal(str, object)
    """A run ended: its kind and its result (GenerationResult / Comparison), None if it failed."""

    sig_load_failed = Signal(str)
    """Loading failed, with the message for the user; no engine is loaded now."""

    sig_busy_changed = Signal(bool)
    """Whether a job is running or queued."""

    sig_error = Signal(str)
    """A run failed: a message for the user, saying what went wrong and what to do."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.engine: Engine | None = None  # used by jobs, on the worker thread; the GUI reads `loaded`
        self.loaded: LoadedPair | None = None  # set and cleared with `engine`
        self._runner = TaskRunner(self)
        self._runner.sig_started.connect(self._on_started)
        self._runner.sig_done.connect(self._on_done)
        self._retired: list[Engine] = []  # replaced engines, closed when no job can be using them
        self._busy = False

    # -- state -------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._runner.busy

    @property
    def loading(self) -> bool:
        current = self._runner.current
        return current is not None and current.name == LOAD

    @property
    def speculative(self) -> bool:
        """Whether chat replies are decoded speculatively (there is a drafter)."""
        return self.loaded is not None and self.loaded.speculative

    # -- requests ----------------------------------------------------------------------

    def load(self, config: EngineConfig) -> None:
        """Replace the engine with one loaded from `config`; the old one is closed first."""
        if self.engine is not None:
            # Free the old model before loading the new one: two large models side by
            # side is how a machine runs out of memory. A running job may still use it,
            # so it is closed once no thread is running (at the latest in _on_done).
            self._retire_engine()
            if not self._runner.busy:
                self._close_retired()

        def job(cancel: threading.Event, report) -> tuple[Engine, LoadedPair]:
            engine = Engine.load(config, progress=lambda message, fraction: report((message, fraction)))
            return engine, loaded_pair(engine)

        self._start(LOAD, job)

    def chat(self, messages: list[dict], sampling: SamplingConfig) -> None:
        # Jobs read self.engine when they start, not now: a chat queued behind a load
        # must use the engine that load produces.
        def job(cancel: threading.Event, report):
            engine = self._require_engine()
            speculative = engine.drafter is not None
            label = "speculative" if speculative else "vanilla"
            on_event = _step_reporter(engine, report)
            return engine.generate(engine.prompt_ids(messages), sampling, speculative=speculative, cancel=cancel,
                                   on_event=lambda event: on_event(label, event))  # fmt: skip

        self._start(CHAT, job)

    def compare(self, messages: list[dict], sampling: SamplingConfig) -> None:
        def job(cancel: threading.Event, report):
            engine = self._require_engine()
            prompt = engine.prompt_ids(messages)
            return engine.compare(prompt, sampling, cancel=cancel, on_event=_step_reporter(engine, report))

        self._start(COMPARE, job)

    def lend(self, name: str, config: EngineConfig, job: Callable[[Engine | None, threading.Event, Any], Any],
             connect: Callable[[GeneratorWorker], None]) -> GeneratorWorker:  # fmt: skip
        """Run `job(engine, cancel, report)` on the worker thread, in turn with loads and replies
        (a running reply is cancelled first, as by any new request); returns its worker. Its
        signals are the caller's: `connect(worker)` connects them before it starts (this
        controller reports none of them).

        `engine` is the window's own when it was loaded from `config`: it stays open, loaded,
        and no one else uses it until the job ends. For any other pair it is None: the
        window's engine is freed first (sig_unloaded), and the job loads and closes its own,
        so the machine never holds two copies of the models. Raises SpecDeckError while a load
        waits behind a running job: only the newest request waits, and the load must not be lost.
        """
        pending = self._runner.pending
        if pending is not None and pending.name == LOAD:
            raise SpecDeckError("The window is about to load a model pair: try again once it has loaded.")
        lent: list[Engine | None] = []

        def prepare() -> None:  # on the GUI thread, when no job runs (TaskRunner._launch)
            if self.engine is not None and self.engine.config != config:
                freed = self.engine.config
                self._retire_engine()
                self._close_retired()
                self.sig_unloaded.emit(freed)
            lent.append(self.engine)

        worker = GeneratorWorker(lambda cancel, report: job(lent[0], cancel, report), name=name, prepare=prepare)
        connect(worker)
        self._runner.start(worker)
        self._set_busy(True)
        return worker

    def stop(self) -> None:
        """Stop the running generation and drop a queued one; a queued load still happens.

        A load cannot be interrupted (llama.cpp and transformers give no way to): a
        running one finishes, and only then does anything queued behind it start.
        """
        pending = self._runner.pending
        self._runner.cancel(keep_pending=pending is not None and pending.name == LOAD)

    def shutdown(self) -> None:
        """Stop everything, wait for the worker thread, close the engine. Call once, on close."""
        last = self._runner.shutdown()
        self._close_retired()
        # A load that finished after the window said goodbye: its result was never adopted.
        if last is not None and last.name == LOAD and last.result is not None and last.result[0] is not self.engine:
            last.result[0].close()
        if self.engine is not None:
            self.engine.close()
            self.engine = self.loaded = None

    # -- plumbing ----------------------------------------------------------------------

    def _require_engine(self) -> Engine:
        if self.engine is None:
            raise SpecDeckError("No model is loaded. Choose a model pair (Models ▸ Model pair…) and load it.")
        return self.engine

    def _start(self, kind: str, job) -> None:
        worker = GeneratorWorker(job, name=kind)
        worker.sig_yielded.connect(self._on_yielded)
        worker.sig_returned.connect(self._on_returned)
        worker.sig_errored.connect(self._on_errored)
        self._runner.start(worker)
        self._set_busy(True)

    @Slot(object)
    def _on_started(self, worker: GeneratorWorker) -> None:
        if worker.name in (CHAT, COMPARE):
            self.sig_run_started.emit(worker.name)

    # Worker signals are queued to this (GUI) thread. Only one worker runs at a time and
    # its signals are all delivered before the next one starts, so `current` says whose
    # signal this is.
    @Slot(object)
    def _on_yielded(self, value: Any) -> None:
        worker = self._runner.current
        if worker is None:
            return
        if worker.name == LOAD:
            self.sig_load_progress.emit(*value)
        else:
            label, event, stats, costs = value
            # The charts (on sig_step_stats) have the step by the time sig_step's listeners run.
            self.sig_step_stats.emit(label, event, stats, costs)
            self.sig_step.emit(label, event)

    @Slot(object)
    def _on_returned(self, result: Any) -> None:
        worker = self._runner.current
        if worker is None:
            return
        if worker.name == LOAD:
            self.engine, self.loaded = result
            self.sig_loaded.emit(self.loaded.config)
        else:
            self.sig_run_finished.emit(worker.name, result)

    @Slot(object)
    def _on_errored(self, error: BaseException) -> None:
        worker = self._runner.current
        if isinstance(error, SpecDeckError):
            message = str(error)
        elif isinstance(error, MemoryError):
            message = "Out of memory. Choose smaller models, a shorter context, or close other programs."
        else:
            log.error("unexpected error in a %s job", worker.name if worker else "finished", exc_info=error)
            message = f"Unexpected error ({type(error).__name__}: {error}). Please report it."
        if worker is not None and worker.name == LOAD:
            self.sig_load_failed.emit(message)
            return
        self.sig_error.emit(message)
        if worker is not None:
            self.sig_run_finished.emit(worker.name, None)

    @Slot(object)
    def _on_done(self, worker: GeneratorWorker) -> None:
        self._close_retired()  # no thread runs between one job's end and the next one's start
        self._set_busy(self._runner.busy)

    def _retire_engine(self) -> None:
        """Nothing new may use the engine; it is closed once no job can be using it."""
        self._retired.append(self.engine)
        self.engine = self.loaded = None

    def _close_retired(self) -> None:
        while self._retired:
            self._retired.pop().close()

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.sig_busy_changed.emit(busy)


def _step_reporter(engine: Engine, report) -> Callable[[str, Any], None]:
    """The `on_event` of Engine.generate / compare: each step with its copies of the drafter's
    statistics and the cost model, taken here, on the worker thread, between two steps."""

    def on_event(label: str, event) -> None:
        drafter = engine.drafter if label == "speculative" else None
        report((label, event, drafter_snapshot(drafter), CostSnapshot.of(engine.costs)))

    return on_event


_failed_stats: set[type] = set()  # drafter classes whose stats() raised: logged once each


def drafter_snapshot(drafter) -> dict | None:
    """`drafter.stats()` as plain data (its DrafterStats' fields, nested records as dicts), a
    private deep copy; None without a drafter.

    Call it on the thread that decodes, between two steps: the copy shares nothing
    with the drafter, so the GUI thread may read it while decoding goes on. The
    charts read its fields by the drafter's stats type (app/charts/data.py). A
    drafter whose stats() fails is logged once and charted without its numbers;
    the run itself goes on.
    """
    if drafter is None:
        return None
    try:
        stats = drafter.stats()
        return copy.deepcopy(stats.as_dict() if isinstance(stats, DrafterStats) else dict(stats))
    except Exception:  # noqa: BLE001 - a statistics bug must not end a reply
        if type(drafter) not in _failed_stats:
            _failed_stats.add(type(drafter))
            log.exception("%s.stats() failed; its numbers are left out of the charts", type(drafter).__name__)
        return None
