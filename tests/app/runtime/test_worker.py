"""Workers: values arrive in order on the GUI thread, errors become signals, one job at a time."""

from __future__ import annotations

import threading
import time

import pytest
from PySide6.QtCore import QThread

from app.runtime.worker import GeneratorWorker, TaskRunner
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG


@pytest.fixture
def runner(qtbot):
    runner = TaskRunner()
    yield runner
    runner.shutdown()


def counting_job(n: int, delay: float = 0.0, seen_threads: list | None = None):
    def job(cancel: threading.Event, report):
        if seen_threads is not None:
            seen_threads.append(threading.current_thread())
        for i in range(n):
            if cancel.is_set():
                return "cancelled"
            time.sleep(delay)
            yield i
        return "done"

    return job


def test_yielded_values_arrive_in_order_on_the_gui_thread_then_the_return_value(qtbot, runner):
    threads, received = [], []
    worker = GeneratorWorker(counting_job(50, seen_threads=threads))
    worker.sig_yielded.connect(lambda value: received.append((value, QThread.currentThread())))

    with qtbot.waitSignal(worker.sig_returned, timeout=10_000) as returned:
        runner.start(worker)

    assert returned.args == ["done"]
    assert [value for value, _ in received] == list(range(50))
    assert {thread for _, thread in received} == {QThread.currentThread()}  # delivered on the GUI thread
    assert threads and threads[0] is not threading.main_thread()  # but computed elsewhere


def test_an_exception_becomes_a_signal_and_the_thread_ends(qtbot, runner):
    def failing(cancel, report):
        yield 1
        raise ValueError("bad input")

    worker = GeneratorWorker(failing)
    with qtbot.waitSignal(runner.sig_done, timeout=10_000), qtbot.waitSignal(worker.sig_errored) as errored:
        runner.start(worker)

    assert isinstance(errored.args[0], ValueError)
    assert not runner.busy


def test_report_works_for_jobs_that_are_not_generators(qtbot, runner):
    def loading(cancel, report):
        report(("half", 0.5))
        return 42

    worker = GeneratorWorker(loading)
    with (
        qtbot.waitSignal(worker.sig_returned, timeout=10_000) as returned,
        qtbot.waitSignal(worker.sig_yielded) as yielded,
    ):
        runner.start(worker)

    assert yielded.args == [("half", 0.5)] and returned.args == [42]


def test_a_new_job_cancels_the_running_one_and_starts_after_it_ended(qtbot, runner):
    log = []
    first = GeneratorWorker(counting_job(10_000, delay=0.005), name="first")
    second = GeneratorWorker(counting_job(3), name="second")
    first.sig_returned.connect(lambda value: log.append(("first", value)))
    second.sig_returned.connect(lambda value: log.append(("second", value)))
    runner.sig_started.connect(lambda worker: log.append(("started", worker.name)))

    with qtbot.waitSignal(first.sig_yielded, timeout=10_000):
        runner.start(first)
    with qtbot.waitSignal(second.sig_returned, timeout=10_000):
        runner.start(second)

    assert log == [("started", "first"), ("first", "cancelled"), ("started", "second"), ("second", "done")]


def test_only_the_newest_queued_job_runs(qtbot, runner):
    started = []
    runner.sig_started.connect(lambda worker: started.append(worker.name))
    jobs = [GeneratorWorker(counting_job(10_000, delay=0.005), name=name) for name in ("a", "b", "c")]

    with qtbot.waitSignal(jobs[0].sig_yielded, timeout=10_000):
        runner.start(jobs[0])
    runner.start(jobs[1])
    with qtbot.waitSignal(jobs[2].sig_yielded, timeout=10_000):
        runner.start(jobs[2])

    assert started == ["a", "c"]


def test_shutdown_cancels_and_joins_the_thread(qtbot, runner):
    worker = GeneratorWorker(counting_job(100_000, delay=0.005))
    with qtbot.waitSignal(worker.sig_yielded, timeout=10_000):
        runner.start(worker)

    last = runner.shutdown()

    assert last is worker and worker.cancelled and worker.result == "cancelled"
    assert not runner.busy
    runner.start(GeneratorWorker(counting_job(1)))  # a closed runner starts nothing
    assert not runner.busy


def test_cancel_can_keep_the_queued_job(qtbot, runner):
    started = []
    runner.sig_started.connect(lambda worker: started.append(worker.name))
    running = GeneratorWorker(counting_job(10_000, delay=0.005), name="running")
    queued = GeneratorWorker(counting_job(2), name="queued")
    with qtbot.waitSignal(running.sig_yielded, timeout=10_000):
        runner.start(running)
    runner.start(queued)

    with qtbot.waitSignal(queued.sig_returned, timeout=10_000):
        runner.cancel(keep_pending=True)

    assert started == ["running", "queued"] and running.result == "cancelled"


def test_prepare_runs_on_the_gui_thread_once_the_previous_job_has_ended(qtbot, runner):
    log = []
    first = GeneratorWorker(counting_job(10_000, delay=0.005), name="first")
    first.sig_returned.connect(lambda value: log.append(("first ended", value)))
    second = GeneratorWorker(
        counting_job(1), name="second", prepare=lambda: log.append(("prepare", threading.current_thread()))
    )
    with qtbot.waitSignal(first.sig_yielded, timeout=10_000):
        runner.start(first)
    with qtbot.waitSignal(second.sig_returned, timeout=10_000):
        runner.start(second)

    assert log == [("first ended", "cancelled"), ("prepare", threading.main_thread())]


def test_what_prepare_raises_ends_the_job_as_an_error(qtbot, runner):
    ran = []

    def prepare():
        raise RuntimeError("cannot prepare")

    worker = GeneratorWorker(lambda cancel, report: ran.append(1), prepare=prepare)
    with qtbot.waitSignal(worker.sig_errored, timeout=10_000) as errored:
        runner.start(worker)

    assert str(errored.args[0]) == "cannot prepare" and ran == []
