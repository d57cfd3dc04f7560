"""Running engine work off the GUI thread: one worker per job, one job at a time.

`GeneratorWorker` follows superqt's worker of the same name: it runs a job on a
QThread, emits one signal per value the job yields (a StepEvent, a progress
report), then one for the return value or the exception. A job is a callable
`job(cancel, report)`; it may return a generator (each yielded value is
reported) or a plain value. Cancellation is cooperative: `cancel` is a
`threading.Event` the job hands to the engine, which checks it between steps
and ends the run with a last "cancelled" step, so the worker never abandons a
generator half way (its `finally:` blocks roll the model's cache back).

A worker may bring a `prepare` callable: the runner calls it on the GUI thread
just before the job's thread starts, the one moment when no job runs, so it may
change what the jobs share (the engine controller frees or lends its engine there).

The worker object itself stays on the GUI thread; only its `run()` executes
on the job's QThread. That is superqt's arrangement too, and it matters: a
signal connected to a lambda or any plain callable is delivered in the thread
of the *sender*, so a worker moved to its thread would call such slots on the
worker thread (pytest-qt's waitSignal among them). With the sender on the GUI
thread every connection is queued to the GUI thread.

`TaskRunner` keeps the rule "one job at a time": starting a job while another
runs cancels the running one and queues the new one until the old thread has
finished. It holds a reference to every worker and thread until the thread has
finished (Spyder's rule: a QThread collected while running takes the process
down), and `shutdown()` cancels, then `wait()`s.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

Job = Callable[[threading.Event, Callable[[Any], None]], Any]


class GeneratorWorker(QObject):
    """Runs one job (on a _JobThread) and reports through signals delivered on the GUI thread."""

    sig_yielded = Signal(object)
    """A value the job yielded or reported (emitted from the worker thread)."""

    sig_returned = Signal(object)
    """The job's return value, once it completed without an exception."""

    sig_errored = Signal(object)
    """The exception that ended the job."""

    sig_finished = Signal()
    """The job ended, whichever way; always the last signal."""

    def __init__(self, job: Job, name: str = "job", prepare: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.name = name
        self._job = job
        self._prepare = prepare
        self._prepare_error: BaseException | None = None
        self._cancel = threading.Event()
        # Kept so that whoever shuts down after the thread finished can still see
        # what the job produced even if the queued sig_returned is never delivered.
        self.result: Any = None
        self.error: BaseException | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Ask the job to stop at its next check (thread-safe)."""
        self._cancel.set()

    def prepare(self) -> None:
        """`prepare`, on the GUI thread, before the job's thread starts. What it raises ends the
        job the usual way (sig_errored), on the job's thread, so its listeners need no second path."""
        if self._prepare is not None:
            try:
                self._prepare()
            except Exception as error:  # noqa: BLE001 - reported by run()
                self._prepare_error = error

    def run(self) -> None:
        """The job, start to end; called on the worker thread."""
        try:
            if self._prepare_error is not None:
                raise self._prepare_error
            outcome = self._job(self._cancel, self.sig_yielded.emit)
            if inspect.isgenerator(outcome):
                outcome = yield_all(outcome, self.sig_yielded.emit)
            self.result = outcome
            self.sig_returned.emit(outcome)
        except Exception as error:  # noqa: BLE001 - every failure becomes a signal, never a dead thread
            self.error = error
            self.sig_errored.emit(error)
        finally:
            self.sig_finished.emit()


def yield_all(generator, emit: Callable[[Any], None]) -> Any:
    """Emit every value of `generator`; return its return value."""
    while True:
        try:
            value = next(generator)
        except StopIteration as stop:
            return stop.value
        emit(value)


class TaskRunner(QObject):
    """Starts workers on their own QThread, at most one running at a time."""

    sig_started = Signal(object)
    """A worker's thread started (the worker is the argument)."""

    sig_done = Signal(object)
    """A worker's thread finished and was joined (the worker is the argument)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._current: tuple[GeneratorWorker, QThread] | None = None
        self._pending: GeneratorWorker | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return self._current is not None or self._pending is not None

    @property
    def current(self) -> GeneratorWorker | None:
        return self._current[0] if self._current else None

    @property
    def pending(self) -> GeneratorWorker | None:
        return self._pending

    def start(self, worker: GeneratorWorker) -> None:
        """Run `worker` now, or as soon as the running one has stopped (which is asked to)."""
        if self._closed:
            return
        if self._current is None:
            self._launch(worker)
            return
        self._current[0].cancel()
        # Only the newest request matters: one the user already replaced never starts.
        self._pending = worker

    def cancel(self, keep_pending: bool = False) -> None:
        """Stop the running job, and drop the queued one unless told to keep it."""
        if not keep_pending:
            self._pending = None
        if self._current is not None:
            self._current[0].cancel()

    def shutdown(self) -> GeneratorWorker | None:
        """Cancel, then block until the thread has ended; returns the last worker, if any ran."""
        self._closed = True
        self.cancel()
        if self._current is None:
            return None
        worker, thread = self._current
        thread.wait()
        self._current = None
        return worker

    def _launch(self, worker: GeneratorWorker) -> None:
        worker.prepare()  # no job runs now: the previous thread has been joined
        thread = _JobThread(worker)
        # Queued to this thread, after everything the worker emitted (posted earlier).
        thread.finished.connect(self._on_thread_finished)
        self._current = (worker, thread)
        thread.start()
        self.sig_started.emit(worker)

    @Slot()
    def _on_thread_finished(self) -> None:
        if self._current is None:  # already joined by shutdown()
            return
        worker, thread = self._current
        # finished is emitted just before the thread really ends: join it before the
        # last reference to the QThread goes away.
        thread.wait()
        self._current = None
        self.sig_done.emit(worker)
        pending, self._pending = self._pending, None
        if pending is not None and not self._closed:
            self._launch(pending)


class _JobThread(QThread):
    """A thread that runs one worker's job and ends; it needs no event loop of its own."""

    def __init__(self, worker: GeneratorWorker) -> None:
        super().__init__()
        self.setObjectName(f"specdeck-{worker.name}")
        self._worker = worker

    def run(self) -> None:
        self._worker.run()
