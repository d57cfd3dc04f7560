"""The private engine process the app drives, through the client, on the embedded model.

What a user of the window would notice: the reply streamed from the engine
process is the reply the engine makes in process (same tokens, same colours:
source, p and q); a stop ends the reply with what was shown; a wrong path says
so; an engine killed mid-reply is an error that says how it died, not a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from engine import EngineConfig, ModelNotFoundError, SamplingConfig, SpecDeckError
from engine.service.client import EngineClient, EngineUnavailable
from engine.service.process import EngineProcess

PROMPT = [{"role": "user", "content": "Write a short poem about the sea."}]
# One thread count for both sides: the automatic one follows the load, which may differ between
# the two runs, and a sampled reply at another count may round (and so sample) differently. A fixed k
# likewise: automatic k follows the timings, which differ on a busy machine.
CONFIG = EngineConfig(target="default", drafter="ngram", k=3, measure_costs=False, threads=2)
SAMPLED = SamplingConfig(temperature=0.8, seed=7, max_tokens=24)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine_process():
    process = EngineProcess()
    client = process.start()
    client.load(CONFIG)
    yield process
    process.stop()


def test_a_streamed_reply_equals_the_in_process_reply_token_for_token(engine_process):
    from engine import Engine

    steps, batches = [], []
    remote = engine_process.client.generate(
        PROMPT, SAMPLED, on_steps=lambda batch: (batches.append(len(batch)), steps.extend(batch))
    )
    engine = Engine.load(CONFIG)
    try:
        local = engine.generate(engine.prompt_ids(PROMPT), SAMPLED)
    finally:
        engine.close()

    def colours(result):
        return [(t.id, t.text, t.source, t.p, t.q) for t in result.token_infos]

    assert remote.text == local.text and remote.tokens == local.tokens
    assert colours(remote) == colours(local)
    assert [s.drafted for s in remote.events] == [s.drafted for s in local.events]
    assert remote.stats.accepted == local.stats.accepted and remote.stats.steps == local.stats.steps
    assert steps == list(remote.events)  # what on_steps saw is what the result was made of
    assert batches[0] == 1  # the server's batches as they came: the first step at once
    # Each step carries what the charts draw beside it: its run, the n-gram drafter's statistics, the costs.
    assert all(s.run == "speculative" and type(s.drafter_stats).__name__ == "NgramStats" for s in steps)
    assert all(s.costs is not None and s.costs.verify_time(1) > 0 for s in steps)


def test_the_loaded_pair_is_described_and_loading_it_again_is_immediate(engine_process):
    pair = engine_process.client.loaded()
    assert pair.config == CONFIG and pair.speculative and pair.target.backend == "llama.cpp"
    reports = []
    started = time.monotonic()
    again = engine_process.client.load(CONFIG, progress=lambda message, fraction: reports.append(message))
    assert again == pair and time.monotonic() - started < 2.0


def test_a_comparison_runs_vanilla_then_speculative(engine_process):
    labels = []
    comparison = engine_process.client.compare(
        PROMPT, SamplingConfig(max_tokens=16), on_steps=lambda batch: labels.extend(step.run for step in batch)
    )
    assert labels[0] == "vanilla" and labels[-1] == "speculative"
    assert [step.run for step in comparison.vanilla.events] == ["vanilla"] * len(comparison.vanilla.events)
    assert all(step.drafter_stats is None for step in comparison.vanilla.events)  # no drafter in a plain run
    assert comparison.vanilla.stats.drafted == 0
    assert comparison.identical or comparison.divergence.explained


def test_cancelling_ends_the_reply_with_what_was_made(engine_process):
    cancel = threading.Event()
    seen = []

    def on_steps(batch):
        seen.extend(batch)
        if len(seen) >= 3:
            cancel.set()

    result = engine_process.client.generate(PROMPT, SamplingConfig(max_tokens=400), cancel=cancel, on_steps=on_steps)
    assert result.finish_reason == "cancelled"
    assert 3 <= result.stats.steps < 100
    # The engine is free at once for the next request.
    assert engine_process.client.health()["job"] is None


def test_a_wrong_path_is_the_engines_own_error_and_the_loaded_pair_stays(engine_process):
    with pytest.raises(ModelNotFoundError, match="no-such-model.gguf"):
        engine_process.client.load(EngineConfig(target="/nonexistent/no-such-model.gguf"))
    # The old pair was freed before the failed load: the server says so rather than pretending.
    loaded = engine_process.client.loaded()
    assert loaded is None or loaded.config == CONFIG
    engine_process.client.load(CONFIG)


def test_a_bad_sampling_value_says_its_range(engine_process):
    with pytest.raises(SpecDeckError, match="temperature"):
        engine_process.client.request(
            "POST", "/specdeck/generate", {"messages": PROMPT, "sampling": {"temperature": -1}}
        )


def test_the_key_is_required():
    process = EngineProcess()
    client = process.start()
    try:
        stranger = EngineClient(client.url, api_key="wrong")
        with pytest.raises(SpecDeckError, match="API key"):
            stranger.loaded()
        assert stranger.health()["status"] == "no model"  # /health answers anyone: a supervisor polls it
    finally:
        process.stop()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts wake-ups in Linux's /proc")
def test_an_idle_engine_sleeps_and_still_stops_at_once():
    """The app's engine waits beside the window all day: it must not wake ten times a second (each
    wake-up a moment of a core, and a battery's), and the window's stop must not wait for a tick."""

    def wakeups(pid: int) -> int:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                total += sum(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))
        return total

    process = EngineProcess()
    process.start()
    try:
        time.sleep(1.0)  # started: its first requests and imports are over
        before = wakeups(process.pid)
        time.sleep(4.0)
        per_second = (wakeups(process.pid) - before) / 4.0
        assert per_second <= 4  # its loop's housekeeping once a second, the parent check once (was 10+)
    finally:
        started = time.monotonic()
        process.stop()
    assert time.monotonic() - started < 1.0  # SIGTERM wakes the loop: no waiting for the next tick


def test_an_engine_killed_mid_reply_is_an_error_that_says_how_it_died():
    process = EngineProcess()
    client = process.start()
    client.load(CONFIG)
    steps = []

    def on_steps(batch):
        steps.extend(batch)
        if len(steps) >= 2:
            os.kill(process.pid, signal.SIGKILL)

    with pytest.raises(EngineUnavailable):
        client.generate(PROMPT, SamplingConfig(max_tokens=400), on_steps=on_steps)
    process._child.wait(10)
    assert "signal 9 (SIGKILL)" in process.death_message()
    process.stop()


def test_nothing_answers_where_no_engine_runs():
    with pytest.raises(EngineUnavailable, match="connection refused"):
        EngineClient("http://127.0.0.1:9").health()


def test_the_engine_process_ends_with_its_parent(tmp_path):
    parent = textwrap.dedent("""
        import sys
        from engine.service.process import EngineProcess
        process = EngineProcess()
        process.start()
        print(process.pid, flush=True)
        import os
        os._exit(0)  # a crash: no stop()
    """)
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60)
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for init to reap it has ended too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_a_clients_stop_stops_its_own_request_and_no_one_elses(engine_process):
    client = engine_process.client
    first_step = threading.Event()
    results = {}

    def first() -> None:
        results["first"] = client.generate(PROMPT, SamplingConfig(max_tokens=120), on_steps=lambda _: first_step.set())

    running = threading.Thread(target=first)
    running.start()
    assert first_step.wait(30)
    stop_second = threading.Event()
    waiting = threading.Thread(
        target=lambda: results.update(
            second=client.generate(PROMPT, SamplingConfig(max_tokens=120), cancel=stop_second)
        )
    )
    waiting.start()
    time.sleep(0.3)  # the second request now waits for the engine
    stop_second.set()
    running.join(60)
    waiting.join(60)
    assert results["first"].finish_reason != "cancelled" and len(results["first"].tokens) > 20
    assert results["second"].finish_reason == "cancelled" and len(results["second"].tokens) <= 1


def test_the_frozen_app_starts_its_engine_with_its_own_executable(monkeypatch):
    from engine.service import process as process_module

    monkeypatch.setattr(sys, "frozen", True, raising=False)
    command = process_module.engine_command("/usr/bin/python3")
    assert command == [sys.executable, process_module.ENGINE_FLAG]
    # ...and the frozen app's entry script, given that flag, serves instead of opening a window.
    launcher = os.path.join(os.path.dirname(__file__), "..", "..", "..", "packaging", "launch_specdeck.py")
    child = subprocess.Popen(
        [sys.executable, launcher, process_module.ENGINE_FLAG, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = child.stdout.readline()
        assert line.startswith("SPECDECK_LISTENING 127.0.0.1:")
        assert EngineClient(f"http://{line.split()[1]}").health()["status"] == "no model"
    finally:
        child.kill()
        child.wait()
