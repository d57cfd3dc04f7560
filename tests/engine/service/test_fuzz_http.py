"""A fuzzing pass over the server's HTTP API: whatever a client sends, the answer is a status and a sentence.

Hypothesis writes request bodies for every POST route: the route's own field names
with values of any JSON type (huge integers, NaN, nesting, wrong types, unknown
fields), bodies that are not JSON or not UTF-8, and wrong Content-Types. The server
is a real one on loopback (uvicorn on a thread, as the app's engine process runs it)
holding the embedded model with n-gram drafting, and a one-second limit on a
generation, so no example can hold it for long. Every answer must be a 2xx, or a
4xx/503 in OpenAI's error shape with a message; never a 500, never a traceback, and
the server answers after each.

Model names drawn here use capitals and digits only, so none is "default" or a
cached model: a load, a benchmark or a training made up by Hypothesis fails at its
first step instead of running for minutes.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.service.host import Host
from engine.service.limits import Limits

pytestmark = pytest.mark.slow

EXAMPLES = 25  # per route; ~300 requests in all, a few seconds on 2 cores

names = st.text(alphabet="ABCXYZ0123456789_-./", min_size=1, max_size=12)
numbers = st.one_of(st.integers(), st.integers(min_value=2**63, max_value=2**80), st.floats(), st.booleans())
scalars = st.one_of(st.none(), numbers, st.text(max_size=20), names)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def fields(required: dict, optional: dict):
    """Bodies with `required`'s keys, some of `optional`'s, and now and then an unknown one."""
    extra = st.dictionaries(st.sampled_from(["bogus", "x", ""]), values, max_size=1)
    return st.builds(
        lambda base, more, unknown: {**base, **more, **unknown},
        st.fixed_dictionaries(required),
        st.fixed_dictionaries({}, optional=optional),
        extra,
    )


roles = st.one_of(st.sampled_from(["user", "assistant", "system", "tool"]), st.text(max_size=6))
message = st.one_of(st.fixed_dictionaries({"role": roles, "content": st.one_of(st.text(max_size=40), values)}), values)
messages = st.one_of(st.lists(message, max_size=4), values)
sampling = fields(
    {}, {k: values | numbers for k in ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "stop")}
)
config = fields({"target": names}, {k: values | names for k in ("draft", "drafter", "backend", "k", "heads")})
OPENAI = {
    "max_tokens": numbers,
    "temperature": numbers,
    "seed": numbers,
    "stream": values,
    "stop": values,
    "speculative.n_max": numbers,
    "speculative.p_min": numbers,
    "specdeck": values,
    "n": numbers,
}

BODIES = {
    "/v1/chat/completions": fields({"messages": messages}, OPENAI),
    "/v1/completions": fields({"prompt": values}, OPENAI),
    "/specdeck/generate": fields({"messages": messages}, {"sampling": sampling, "speculative": values}),
    "/specdeck/compare": fields({"messages": messages}, {"sampling": sampling}),
    "/specdeck/load": fields({"config": config}, {"reload": values}),
    "/specdeck/preflight": fields({"config": config}, {}),
    "/specdeck/cancel": fields({}, {"job": values}),
    "/specdeck/bench": fields({"config": config, "prompts": st.lists(values, max_size=2)}, {"settings": values}),
    "/specdeck/autotune": fields(
        {"config": config, "prompts": st.lists(values, max_size=2)}, {"settings": values, "candidates": values}
    ),
    "/specdeck/train": fields(
        {"options": fields({"target_spec": names}, {"out_dir": values, "data": values, "steps": values})},
        {"command": values},
    ),
    "/specdeck/checkpoint": fields({"out_dir": values}, {}),
}


@pytest.fixture(scope="module")
def address():
    import uvicorn

    from engine.api import Engine
    from engine.config import EngineConfig
    from engine.service.host import EngineThread
    from engine.service.run import LOOPBACK, bind
    from engine.service.server import create_app

    thread = EngineThread()
    config = EngineConfig(target="default", backend="llama.cpp", drafter="ngram", k=3, n_ctx=512)
    host = Host(thread.call(lambda: Engine.load(config)), thread=thread)
    sock = bind(LOOPBACK, 0)
    app = create_app(host, limits=Limits(generation_timeout_s=1.0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", access_log=False))
    runner = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield LOOPBACK, sock.getsockname()[1]
    server.should_exit = True
    runner.join(10)
    thread.call(lambda: host.engine and host.engine.close())


def _send(address, path: str, body: bytes, content_type: str | None = "application/json") -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(*address, timeout=60)
    try:
        headers = {"Content-Type": content_type} if content_type else {}
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _check(status: int, data: bytes, what) -> None:
    assert status < 500 or status == 503, (status, data[:300], what)
    if status >= 400:
        error = json.loads(data)["error"]
        assert isinstance(error["message"], str) and error["message"], what
        assert "Traceback" not in error["message"], what


@pytest.mark.parametrize("path", sorted(BODIES))
def test_any_body_gets_a_status_and_a_sentence_never_a_500(address, path):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(BODIES[path])
    def fuzz(body):
        status, data = _send(address, path, json.dumps(body).encode())
        _check(status, data, body)

    fuzz()
    assert _send(address, "/specdeck/cancel", b"{}")[0] == 200  # and the server still answers


NASTY = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"messages": [], "seed": ' + b"9" * 5000 + b"}",
    b"\xff\xfe{}",
    b"",
    b'{"messages": [{"role": "user", "content": "Hi"}], "seed": 1180591620717411303424, "max_tokens": 2}',
    b'{"messages": [{"role": "user", "content": "Hi"}], "sampling": {"seed": 1180591620717411303424}}',
]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    path=st.sampled_from(sorted(BODIES)),
    body=st.one_of(st.binary(max_size=64), st.sampled_from(NASTY)),
    content_type=st.sampled_from(["application/json", "text/plain", None, "application/json; charset=latin-1"]),
)
def test_bytes_that_are_not_json_and_wrong_content_types_are_4xx(address, path, body, content_type):
    status, data = _send(address, path, body, content_type)
    _check(status, data, (path, body, content_type))
    if content_type in ("text/plain", None):
        assert status == 415
