"""POST /specdeck/preflight: the pair dialog's check, run in the engine's process.

The server runs here, in a thread (uvicorn on a free loopback port, an API key), over a
host whose engine is a stand-in that decodes nothing until told to: what is under test
is the route (its answer, its key, its errors, and that it does not wait behind a
generation), not decoding. The check itself is engine.preflight on the embedded model.
"""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

import pytest

from engine import ConfigError, EngineConfig, SpecDeckError, preflight
from engine.service.client import EngineClient
from engine.service.host import Host
from engine.service.paths import ServerPaths
from tests.engine.service.conftest import Raw

KEY = "preflight-key-31a"
PAIR = EngineConfig(target="default").with_drafter("model", draft="default")
PROMPT = [{"role": "user", "content": "Hi"}]


def steady(result) -> list[tuple[str, str, str]]:
    """The findings, with the free memory left out: it changes from one moment to the next."""
    return [
        (f.severity, f.title, re.sub(r"[\d.]+ [KMGT]?i?B (of [\d.]+ [KMGT]?i?B )?(is )?free", "free", f.detail))
        for f in result.findings
    ]


class StalledEngine:
    """An engine whose generation starts and then waits until `release` is set."""

    drafter = None
    config = EngineConfig(target="default")
    target = SimpleNamespace(info=SimpleNamespace(device="cpu"))  # where it decodes: the stream's pace

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def prompt_ids(self, messages) -> list[int]:
        return [1]

    def stream(self, prompt, sampling, speculative=False, cancel=None, snapshots=False):
        self.started.set()
        self.release.wait(60)
        return iter(())

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def served():
    import uvicorn

    from engine.service.run import LOOPBACK, bind
    from engine.service.server import create_app

    engine = StalledEngine()
    host = Host(engine, queue_limit=1)
    sock = bind(LOOPBACK, 0)
    app = create_app(host, api_key=KEY, paths=ServerPaths.trusting_client())  # the pair dialog's engine: any path
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://{LOOPBACK}:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield url, host, engine
    engine.release.set()
    server.should_exit = True
    thread.join(10)


def test_the_check_in_the_server_equals_the_check_here(served):
    url, _, _ = served
    client = EngineClient(url, api_key=KEY)
    for config in (EngineConfig(target="default"), PAIR, EngineConfig(target="/nowhere/model.gguf")):
        there, here = client.preflight(config), preflight(config)
        assert steady(there) == steady(here)
        assert (there.report is None) == (here.report is None)
        if here.report is not None:
            assert there.report.target == here.report.target and there.report.draft == here.report.draft
    assert client.preflight(PAIR).report.compatible


def test_the_key_is_required(served):
    url, _, _ = served
    body = {"config": EngineConfig().to_dict()}
    for key in (None, "wrong"):
        status, answer = Raw(url, KEY).json("POST", "/specdeck/preflight", body, key=key)
        assert status == 401 and "API key" in answer["error"]["message"]
    with pytest.raises(SpecDeckError, match="API key"):
        EngineClient(url, api_key="wrong").preflight(EngineConfig())


def test_a_bad_config_is_a_400_with_the_engines_message(served):
    url, _, _ = served
    bad = {**EngineConfig().to_dict(), "bogus": 1}
    status, answer = Raw(url, KEY).json("POST", "/specdeck/preflight", {"config": bad})
    assert status == 400 and "unknown field 'bogus'" in answer["error"]["message"]
    assert answer["error"]["specdeck_type"] == "ConfigError"
    status, answer = Raw(url, KEY).json("POST", "/specdeck/preflight", {"config": {}, "extra": 1})
    assert status == 400 and "unknown field 'extra'" in answer["error"]["message"]


def test_a_check_answers_while_a_generation_holds_the_engine(served):
    url, host, engine = served
    client = EngineClient(url, api_key=KEY)
    replies: list = []
    body = {"messages": PROMPT, "sampling": {"max_tokens": 4}}
    generation = threading.Thread(
        target=lambda: replies.append(list(client.stream("/specdeck/generate", body))), daemon=True
    )
    generation.start()
    try:
        assert engine.started.wait(30), "the generation did not start"
        result = client.preflight(EngineConfig(target="default"))
        assert result.compatible
        assert host.job_name == "generate" and not replies  # it did not wait for the generation's end
        with pytest.raises(ConfigError, match="unknown field"):  # a bad one neither, and it leaves it running
            client.request("POST", "/specdeck/preflight", {"config": {**EngineConfig().to_dict(), "bogus": 1}})
        assert host.job_name == "generate"
    finally:
        engine.release.set()
        generation.join(30)
    assert replies == [[]]  # the generation ended as it would have (the stand-in makes no steps), undisturbed
