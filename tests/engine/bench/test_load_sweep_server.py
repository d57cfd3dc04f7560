"""The load test over the engine's server (routes_jobs `/specdeck/load-sweep`, EngineClient.load_sweep), as
the app's Load view runs it: a pair loaded for one sequence is reloaded for the sweep's largest B and
loaded back as it was; settings no sweep can run are refused before the pair is touched."""

from __future__ import annotations

import threading
import time

import pytest

from engine.bench.load_results import AUTO, VANILLA
from engine.bench.load_settings import LoadSettings
from engine.bench.prompts import BenchPrompt
from engine.bench.results import BenchmarkCancelled
from engine.errors import ConfigError

PROMPTS = (BenchPrompt("copy", "reuse", ({"role": "user", "content": "Repeat: one two three four"},)),)


@pytest.fixture(scope="module")
def served(tiny_llama):
    import uvicorn

    from engine.api import Engine
    from engine.config import EngineConfig
    from engine.service.client import EngineClient
    from engine.service.host import EngineThread, Host
    from engine.service.run import LOOPBACK, bind
    from engine.service.server import create_app

    config = EngineConfig(target=tiny_llama, backend="torch", dtype="float32", drafter="ngram", k_max=4)
    thread = EngineThread()
    host = Host(thread.call(lambda: Engine.load(config)), thread=thread)
    sock = bind(LOOPBACK, 0)
    server = uvicorn.Server(uvicorn.Config(create_app(host), log_level="critical", access_log=False))
    runner = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield EngineClient(f"http://{LOOPBACK}:{sock.getsockname()[1]}"), host
    server.should_exit = True
    runner.join(10)
    thread.call(lambda: host.engine and host.engine.close())


def test_a_sweep_on_the_server_reloads_the_pair_for_its_largest_batch_and_back(served):
    client, host = served
    said = []
    settings = LoadSettings(batches=(1, 2), k=2, max_tokens=6, warmup=0, requests=2)
    sweep = client.load_sweep(PROMPTS, settings, progress=lambda message, fraction: said.append(message))
    assert sweep.batches == (1, 2) and sweep.modes == (VANILLA, "k=2", AUTO)
    assert all(p.tokens == 12 for p in sweep.points)
    assert "Loading the pair for 2 sequences at once" in said and said[-1] == "Done"
    assert host.engine.config.parallel == 1  # loaded back as it was


def test_settings_no_sweep_can_run_are_refused_and_the_pair_stays(served):
    client, host = served
    loaded = host.engine
    with pytest.raises(ConfigError, match="1 or more"):
        client.load_sweep(PROMPTS, LoadSettings(batches=(0, 2)))
    assert host.engine is loaded


def test_a_sweep_cannot_claim_more_memory_than_the_server_has(served, monkeypatch):
    """The request's memory budget only narrows the server's own: a client claiming a petabyte still
    gets the server's --parallel memory check, before the loaded pair is touched."""
    from engine.service import capacity

    client, host = served
    loaded = host.engine
    scarce = capacity.SlotMemory(10**6, 10**6, 2048, 4 * 10**6, "in system RAM", "the target")
    monkeypatch.setattr(capacity, "slot_memory", lambda config: scarce)
    with pytest.raises(ConfigError, match=r"--parallel 8 needs about .* At most \d+ sequences fit"):
        client.load_sweep(PROMPTS, LoadSettings(batches=(1, 8), max_tokens=4, memory_budget_bytes=10**15))
    assert host.engine is loaded


def test_a_sweep_holds_the_engine_no_longer_than_the_servers_generation_timeout(served):
    """A sweep is many generations in one request: the server's --timeout ends it (the client hears it
    was cancelled), and the engine is free for the next request, loaded as before."""
    import uvicorn

    from engine.service.client import EngineClient
    from engine.service.limits import Limits
    from engine.service.run import LOOPBACK, bind
    from engine.service.server import create_app

    _, host = served
    config = host.engine.config
    sock = bind(LOOPBACK, 0)
    app = create_app(host, limits=Limits(generation_timeout_s=1.0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", access_log=False))
    runner = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        client = EngineClient(f"http://{LOOPBACK}:{sock.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(BenchmarkCancelled):
            client.load_sweep(PROMPTS * 8, LoadSettings(batches=(1, 2, 4), max_tokens=200, repeat=3))
        assert time.monotonic() - started < 30
        assert host.engine.config == config  # loaded back for one sequence, as before the sweep
        # the next request runs: the engine is not held
        client.load_sweep(PROMPTS, LoadSettings(batches=(1,), max_tokens=2, repeat=1, warmup=0))
    finally:
        server.should_exit = True
        runner.join(10)
