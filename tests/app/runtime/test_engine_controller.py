"""The engine controller with the real model in the engine process: one job at a time, a new
request cancels the old, every step from the stream."""

from __future__ import annotations

import dataclasses
import math

import pytest
from PySide6.QtCore import QThread

from app.runtime.engine_controller import EngineController, shares_cores
from engine import (
    CPU_BATCH_S,
    CostSnapshot,
    DrafterStats,
    EngineClient,
    LoadedPair,
    SamplingConfig,
    Source,
    SpecDeckError,
)
from engine.api import Comparison
from engine.core.events import GenerationResult
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, STRICT_QT_LOG, unloaded

pytestmark = STRICT_QT_LOG
LONG = SamplingConfig(max_tokens=400)
CHAT = [{"role": "user", "content": "Write a long story about a lighthouse."}]


@pytest.fixture
def controller(qtbot, engine_process):
    controller = EngineController(process=unloaded(engine_process))
    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        controller.load(FAST_CONFIG)
    yield controller
    controller.shutdown()


def test_signals_arrive_on_the_gui_thread_with_every_token_s_provenance(qtbot, controller):
    threads = set()
    controller.sig_steps.connect(lambda batch: threads.add(QThread.currentThread()))
    steps = []
    controller.sig_steps.connect(lambda batch: steps.extend((step, step.drafter_stats) for step in batch))

    with qtbot.waitSignal(controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        controller.chat(CHAT, SamplingConfig(max_tokens=12))

    result = finished.args[1]
    assert isinstance(result, GenerationResult) and result.stats.tokens > 0
    assert threads == {QThread.currentThread()}
    # Each step again, with the n-gram drafter's statistics the engine copied after it.
    assert [event for event, _ in steps] == list(result.events)
    lookups = [stats.lookups for _, stats in steps]
    assert lookups == sorted(lookups) and lookups[-1] > 0
    tokens = [token for event, _ in steps for token in event.tokens]
    assert "".join(token.text for token in tokens) == result.text
    assert all(isinstance(token.source, Source) and 0.0 <= token.p <= 1.0 for token in tokens)
    assert all(token.q is None or 0.0 <= token.q <= 1.0 for token in tokens)


def test_a_reply_decoded_on_this_machines_cores_reaches_the_window_four_times_a_second(qtbot, controller):
    batches = []
    controller.sig_steps.connect(lambda batch: batches.append(len(batch)))
    with qtbot.waitSignal(controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        controller.chat(CHAT, SamplingConfig(max_tokens=96))

    result = finished.args[1]
    assert sum(batches) == len(result.events)  # every step, in fewer hand-overs
    assert len(batches) <= 2 + math.ceil(result.stats.wall_s / CPU_BATCH_S)  # the first and last go at once
    # The window's redraws keep to the smaller budget only where it shares the engine's cores.
    pair = controller.loaded
    on_gpu = dataclasses.replace(pair, target=dataclasses.replace(pair.target, device="cuda"))
    assert controller.shares_cores and not shares_cores(on_gpu, True) and not shares_cores(pair, False)


def test_stop_mid_reply_ends_it_with_the_engines_cancelled_step_and_keeps_the_text(qtbot, controller):
    shown = []
    controller.sig_steps.connect(shown.extend)
    with qtbot.waitSignal(controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        controller.chat(CHAT, LONG)

    with qtbot.waitSignal(controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        controller.stop()

    result = finished.args[1]
    assert result.finish_reason == "cancelled" and 0 < result.stats.tokens < LONG.max_tokens
    assert result.text == "".join(event.text for event in shown)
    qtbot.waitUntil(lambda: not controller.busy)


def test_a_comparison_requested_mid_reply_cancels_the_reply_then_runs(qtbot, controller):
    finished = []
    controller.sig_run_finished.connect(lambda kind, result: finished.append((kind, result)))
    with qtbot.waitSignal(controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        controller.chat(CHAT, LONG)

    compared = []
    controller.sig_run_started.connect(lambda kind: compared.clear())  # the comparison's steps only
    controller.sig_steps.connect(lambda steps: compared.extend((step.run, step.drafter_stats) for step in steps))
    controller.compare(CHAT, SamplingConfig(max_tokens=6))
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=REPLY_TIMEOUT_MS)

    (first_kind, reply), (second_kind, comparison) = finished
    assert (first_kind, reply.finish_reason) == ("chat", "cancelled")
    assert second_kind == "compare" and isinstance(comparison, Comparison)
    assert comparison.vanilla.stats.tokens > 0 and comparison.speculative.stats.tokens > 0
    # The plain run has no drafter statistics; the speculative one has them at every step.
    assert {stats is None for label, stats in compared if label == "vanilla"} == {True}
    assert {isinstance(stats, DrafterStats) for label, stats in compared if label == "speculative"} == {True}
    assert len(compared) == comparison.vanilla.stats.steps + comparison.speculative.stats.steps


def test_stop_keeps_a_load_queued_behind_a_reply(qtbot, controller):
    with qtbot.waitSignal(controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        controller.chat(CHAT, LONG)
    old = controller.loaded

    other = dataclasses.replace(FAST_CONFIG, k=3)
    controller.load(other)  # queued: the reply is still running
    assert controller.loaded is None  # at once: nothing new may use the old pair
    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        controller.stop()

    assert controller.loaded is not old and controller.loaded.config == other
    qtbot.waitUntil(lambda: not controller.busy)  # the load's thread ends just after it reported


def test_without_a_model_a_chat_is_an_error_message_and_no_engine_starts(qtbot):
    controller = EngineController()
    with qtbot.waitSignal(controller.sig_error, timeout=10_000) as error:
        controller.chat(CHAT, LONG)
    qtbot.waitUntil(lambda: not controller.busy)
    controller.shutdown()

    assert "No model is loaded" in error.args[0]
    assert controller.process.pid is None  # the engine process starts with the first load


def test_each_step_brings_a_frozen_copy_of_the_engines_cost_model(qtbot, controller):
    snapshots = []
    controller.sig_steps.connect(lambda steps: snapshots.extend(step.costs for step in steps))
    with qtbot.waitSignal(controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        controller.chat(CHAT, SamplingConfig(max_tokens=6))

    assert len(snapshots) == finished.args[1].stats.steps and all(isinstance(s, CostSnapshot) for s in snapshots)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshots[-1].draft_s_per_token = 1.0
    assert dict(snapshots[-1].verify_s), "the steps' own timings are in the snapshot"
    # The run is over: nothing changes the engine's cost model now, and the last step brought it.
    assert snapshots[-1] == controller.client.loaded().costs


def test_what_the_window_shows_about_the_pair_is_what_the_engine_loaded(controller):
    loaded = controller.loaded
    assert isinstance(loaded, LoadedPair) and loaded.config == FAST_CONFIG and loaded.speculative
    assert "SmolLM2" in loaded.target.name and loaded.target.backend == "llama.cpp"
    assert loaded == controller.client.loaded()


def test_a_job_lent_the_engine_runs_after_the_engine_process_freed_its_models(qtbot, controller):
    def job(lent, cancel, report):
        return lent, controller.client.loaded()  # what the job found when it started

    returned = []
    with qtbot.waitSignal(controller.sig_unloaded, timeout=REPLY_TIMEOUT_MS) as unloaded_signal:
        controller.lend("bench", FAST_CONFIG, job, connect=lambda worker: worker.sig_returned.connect(returned.append))
    qtbot.waitUntil(lambda: bool(returned), timeout=REPLY_TIMEOUT_MS)

    assert unloaded_signal.args == [FAST_CONFIG]  # the freed pair, to load again later
    assert returned[0] == (None, None)  # no engine to borrow, and none loaded in the engine process
    assert controller.loaded is None
    qtbot.waitUntil(lambda: not controller.busy)


def test_a_job_lent_the_engine_process_gets_its_client_and_the_windows_pair_stays(qtbot, controller):
    unloads, returned = [], []
    controller.sig_unloaded.connect(unloads.append)

    def job(client, cancel, report):
        return isinstance(client, EngineClient), client.loaded().config

    worker = controller.lend(
        "bench", FAST_CONFIG, job, on_server=True, connect=lambda worker: worker.sig_returned.connect(returned.append)
    )
    qtbot.waitUntil(lambda: not controller.busy, timeout=REPLY_TIMEOUT_MS)

    assert worker.result == (True, FAST_CONFIG) and returned == [(True, FAST_CONFIG)]
    assert unloads == [] and controller.loaded.config == FAST_CONFIG


def test_a_job_that_leaves_another_pair_in_the_engine_process_frees_the_windows(qtbot, controller):
    other = dataclasses.replace(FAST_CONFIG, k=3)
    with qtbot.waitSignal(controller.sig_unloaded, timeout=LOAD_TIMEOUT_MS) as unloaded_signal:
        controller.lend(
            "bench",
            other,
            lambda client, cancel, report: client.load(other),
            connect=lambda worker: None,
            on_server=True,
        )

    assert unloaded_signal.args == [FAST_CONFIG] and controller.loaded is None
    qtbot.waitUntil(lambda: not controller.busy)


def test_a_job_is_not_lent_the_engine_while_a_load_waits(qtbot, controller):
    with qtbot.waitSignal(controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        controller.chat(CHAT, LONG)
    controller.load(FAST_CONFIG)  # queued behind the reply: a lent job must not replace it

    with pytest.raises(SpecDeckError, match="about to load"):
        controller.lend("bench", FAST_CONFIG, lambda lent, cancel, report: lent, connect=lambda worker: None)
    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        pass
    qtbot.waitUntil(lambda: not controller.busy)
