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

Drafter statistics (`Drafter.stats()`: lookahead's n-gram pool, the early-exit
layer...) are read by the job itself, on the worker thread, right after each
step of a speculative run, while the decode loop waits at its `yield`; the
copy travels with the step (`sig_step_stats`). Nothing on the GUI thread ever
calls into the drafter while it decodes.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from engine import Engine, EngineConfig, SamplingConfig, SpecDeckError
from engine.api import collect
from app.runtime.worker import GeneratorWorker, TaskRunner

LOAD, CHAT, COMPARE = "load", "chat", "compare"
log = logging.getLogger(__name__)


class EngineController(QObject):
    """Loads the engine and runs chat replies and comparisons, one at a time."""

    sig_load_progress = Signal(str, float)
    """What loading is doing, and the fraction done."""

    sig_loaded = Signal(object)
    """An engine is ready; the argument is its EngineConfig."""

    sig_run_started = Signal(str)
    """A chat reply ("chat") or a comparison ("compare") started decoding."""

    sig_step = Signal(str, object)
    """One decoding step: the run's label ("speculative" or "vanilla") and the StepEvent."""

    sig_step_stats = Signal(str, object, object)
    """The same step (emitted just before sig_step) with the drafter's statistics just after it:
    a dict copied on the worker thread, or None (a plain run, no drafter, stats() failed)."""

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
        self.engine: Engine | None = None
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
        return self.engine is not None and self.engine.drafter is not None

    # -- requests ----------------------------------------------------------------------

    def load(self, config: EngineConfig) -> None:
        """Replace the engine with one loaded from `config`; the old one is closed first."""
        if self.engine is not None:
            # Free the old model before loading the new one: two large models side by
            # side is how a machine runs out of memory. A running job may still use it,
            # so it is closed once no thread is running (at the latest in _on_done).
            self._retired.append(self.engine)
            self.engine = None
            if not self._runner.busy:
                self._close_retired()

        def job(cancel: threading.Event, report) -> Engine:
            return Engine.load(config, progress=lambda message, fraction: report((message, fraction)))

        self._start(LOAD, job)

    def chat(self, messages: list[dict], sampling: SamplingConfig) -> None:
        # Jobs read self.engine when they start, not now: a chat queued behind a load
        # must use the engine that load produces.
        def job(cancel: threading.Event, report):
            engine = self._require_engine()
            label = "speculative" if engine.drafter is not None else "vanilla"
            drafter = engine.drafter if label == "speculative" else None
            events = []
            for event in engine.stream(engine.prompt_ids(messages), sampling, speculative=label == "speculative",
                                       cancel=cancel):  # fmt: skip
                events.append(event)
                report((label, event, drafter_snapshot(drafter)))
            return collect(events)

        self._start(CHAT, job)

    def compare(self, messages: list[dict], sampling: SamplingConfig) -> None:
        def job(cancel: threading.Event, report):
            engine = self._require_engine()
            prompt = engine.prompt_ids(messages)

            def on_event(label: str, event) -> None:  # on this thread, between two steps
                drafter = engine.drafter if label == "speculative" else None
                report((label, event, drafter_snapshot(drafter)))

            return engine.compare(prompt, sampling, cancel=cancel, on_event=on_event)

        self._start(COMPARE, job)

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
        if last is not None and isinstance(last.result, Engine) and last.result is not self.engine:
            last.result.close()
        if self.engine is not None:
            self.engine.close()
            self.engine = None

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
        if worker.name != LOAD:
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
            label, event, stats = value
            # The charts (on sig_step_stats) have the step by the time sig_step's listeners run.
            self.sig_step_stats.emit(label, event, stats)
            self.sig_step.emit(label, event)

    @Slot(object)
    def _on_returned(self, result: Any) -> None:
        worker = self._runner.current
        if worker is None:
            return
        if worker.name == LOAD:
            self.engine = result
            self.sig_loaded.emit(result.config)
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

    def _close_retired(self) -> None:
        while self._retired:
            self._retired.pop().close()

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.sig_busy_changed.emit(busy)


_failed_stats: set[type] = set()  # drafter classes whose stats() raised: logged once each


def drafter_snapshot(drafter) -> dict | None:
    """A private deep copy of `drafter.stats()`, or None without a drafter.

    Call it on the thread that decodes, between two steps: the copy shares nothing
    with the drafter, so the GUI thread may read it while decoding goes on. A
    drafter whose stats() fails is logged once and charted without its numbers;
    the run itself goes on.
    """
    if drafter is None:
        return None
    try:
        return copy.deepcopy(dict(drafter.stats()))
    except Exception:  # noqa: BLE001 - a statistics bug must not end a reply
        if type(drafter) not in _failed_stats:
            _failed_stats.add(type(drafter))
            log.exception("%s.stats() failed; its numbers are left out of the charts", type(drafter).__name__)
        return None
