"""The engine controller with the real model: one job at a time, a new request cancels the old."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from PySide6.QtCore import QThread

from app.runtime.costs import CostSnapshot
from app.runtime.engine_controller import EngineController
from engine import SamplingConfig, SpecDeckError
from engine.core.events import GenerationResult
from engine.api import Comparison
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, STRICT_QT_LOG

pytestmark = STRICT_QT_LOG
LONG = SamplingConfig(max_tokens=400)
CHAT = [{"role": "user", "content": "Write a long story about a lighthouse."}]


@pytest.fixture
def controller(qtbot):
    controller = EngineController()
    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        controller.load(FAST_CONFIG)
    yield controller
    controller.shutdown()


def test_signals_arrive_on_the_gui_thread(qtbot, controller):
    threads = set()
    controller.sig_step.connect(lambda label, event: threads.add(QThread.currentThread()))
    steps = []
    controller.sig_step_stats.connect(lambda label, event, stats: steps.append((event, stats)))

    with qtbot.waitSignal(controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        controller.chat(CHAT, SamplingConfig(max_tokens=6))

    assert isinstance(finished.args[1], GenerationResult)
    assert threads == {QThread.currentThread()}
    # Each step again, with the n-gram drafter's statistics copied on the worker thread after it.
    assert [event for event, _ in steps] == list(finished.args[1].events)
    lookups = [stats["lookups"] for _, stats in steps]
    assert lookups == sorted(lookups) and lookups[-1] > 0


def test_a_comparison_requested_mid_reply_cancels_the_reply_then_runs(qtbot, controller):
    finished = []
    controller.sig_run_finished.connect(lambda kind, result: finished.append((kind, result)))
    with qtbot.waitSignal(controller.sig_step, timeout=REPLY_TIMEOUT_MS):
        controller.chat(CHAT, LONG)

    compared = []
    controller.sig_run_started.connect(lambda kind: compared.clear())  # the comparison's steps only
    controller.sig_step_stats.connect(lambda label, event, stats: compared.append((label, stats)))
    controller.compare(CHAT, SamplingConfig(max_tokens=6))
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=REPLY_TIMEOUT_MS)

    (first_kind, reply), (second_kind, comparison) = finished
    assert (first_kind, reply.finish_reason) == ("chat", "cancelled")
    assert second_kind == "compare" and isinstance(comparison, Comparison)
    assert comparison.vanilla.stats.tokens > 0 and comparison.speculative.stats.tokens > 0
    # The plain run has no drafter statistics; the speculative one has them at every step.
    assert {stats is None for label, stats in compared if label == "vanilla"} == {True}
    assert {isinstance(stats, dict) for label, stats in compared if label == "speculative"} == {True}
    assert len(compared) == comparison.vanilla.stats.steps + comparison.speculative.stats.steps


def test_stop_keeps_a_load_queued_behind_a_reply(qtbot, controller):
    with qtbot.waitSignal(controller.sig_step, timeout=REPLY_TIMEOUT_MS):
        controller.chat(CHAT, LONG)
    old_engine = controller.engine

    controller.load(FAST_CONFIG)  # queued: the reply is still running
    assert controller.engine is None  # the old engine is retired at once: nothing new may use it
    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        controller.stop()

    assert controller.engine is not None and controller.engine is not old_engine
    qtbot.waitUntil(lambda: not controller.busy)  # the load's thread ends just after it reported


def test_without_a_model_a_chat_is_an_error_message(qtbot):
    controller = EngineController()
    with qtbot.waitSignal(controller.sig_error, timeout=10_000) as error:
        controller.chat(CHAT, LONG)
    controller.shutdown()

    assert "No model is loaded" in error.args[0]


def test_each_step_brings_a_frozen_copy_of_the_cost_model_taken_on_the_worker_thread(qtbot, controller, monkeypatch):
    engine = controller.engine
    taken = []
    real_of = CostSnapshot.of

    def of(cls, costs):
        taken.append((costs is engine.costs, threading.current_thread()))
        return real_of(costs)

    monkeypatch.setattr(CostSnapshot, "of", classmethod(of))
    snapshots = []
    controller.sig_step_stats.connect(lambda label, event, stats, costs: snapshots.append(costs))
    with qtbot.waitSignal(controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        controller.chat(CHAT, SamplingConfig(max_tokens=6))
    monkeypatch.undo()

    steps = finished.args[1].stats.steps
    assert len(snapshots) == steps and all(isinstance(s, CostSnapshot) for s in snapshots)
    assert taken == [(True, taken[0][1])] * steps and taken[0][1] is not threading.main_thread()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshots[-1].draft_s_per_token = 1.0
    assert snapshots[-1] == CostSnapshot.of(engine.costs)  # the run is over: nothing changes it now
    assert dict(snapshots[-1].verify_s), "the steps' own timings are in the snapshot"


def test_what_the_window_shows_about_the_pair_is_copied_at_load(controller):
    loaded = controller.loaded
    assert loaded.config == FAST_CONFIG and loaded.speculative
    assert loaded.target == controller.engine.target.info and loaded.costs == CostSnapshot.of(controller.engine.costs)


def test_a_job_lent_the_engine_gets_the_windows_own_for_its_pair(qtbot, controller):
    engine = controller.engine
    returned = []
    controller.lend("bench", FAST_CONFIG, lambda lent, cancel, report: lent,
                    connect=lambda worker: worker.sig_returned.connect(returned.append))  # fmt: skip
    qtbot.waitUntil(lambda: bool(returned), timeout=REPLY_TIMEOUT_MS)
    assert returned[0] is engine and controller.engine is engine and controller.loaded is not None
    qtbot.waitUntil(lambda: not controller.busy)


def test_a_job_on_another_pair_runs_after_the_windows_engine_was_freed(qtbot, controller):
    engine, closed = controller.engine, []
    real_close = engine.close
    engine.close = lambda: (closed.append(True), real_close())
    other = dataclasses.replace(FAST_CONFIG, k=3)

    def job(lent, cancel, report):
        return lent, list(closed)  # what the job found when it started

    returned = []
    with qtbot.waitSignal(controller.sig_unloaded, timeout=REPLY_TIMEOUT_MS) as unloaded:
        controller.lend("bench", other, job, connect=lambda worker: worker.sig_returned.connect(returned.append))
    qtbot.waitUntil(lambda: bool(returned), timeout=REPLY_TIMEOUT_MS)

    assert unloaded.args == [FAST_CONFIG]  # the freed pair, to load again later
    assert returned[0] == (None, [True])  # the window's engine was closed before the job ran
    assert controller.engine is None and controller.loaded is None
    qtbot.waitUntil(lambda: not controller.busy)


def test_a_job_is_not_lent_the_engine_while_a_load_waits(qtbot, controller):
    with qtbot.waitSignal(controller.sig_step, timeout=REPLY_TIMEOUT_MS):
        controller.chat(CHAT, LONG)
    controller.load(FAST_CONFIG)  # queued behind the reply: a lent job must not replace it

    with pytest.raises(SpecDeckError, match="about to load"):
        controller.lend("bench", FAST_CONFIG, lambda lent, cancel, report: lent, connect=lambda worker: None)
    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        pass
    qtbot.waitUntil(lambda: not controller.busy)
