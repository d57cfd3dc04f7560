"""Bad requests get a 4xx with a message that says what is wrong, before any stream starts.

Unknown fields are named; bad JSON, a bad temperature (the engine's own message), a
prompt longer than the context, options the engine cannot honour and a missing or
wrong key each get theirs, in OpenAI's error shape, which the openai client raises
as its own exception classes. Raw requests go as curl sends them.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import openai
import pytest

from tests.engine.service.conftest import N_CTX

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Say hi."}]


def _message(error: openai.APIStatusError) -> str:
    return error.body["message"] if isinstance(error.body, dict) else str(error)


def test_an_unknown_field_is_a_400_that_names_it(openai_client):
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.chat.completions.create(
            model="any", messages=MESSAGES, max_tokens=2, extra_body={"frobnicate": True}
        )
    assert "unknown field 'frobnicate'" in _message(raised.value)
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.chat.completions.create(
            model="any", messages=MESSAGES, max_tokens=2, extra_body={"specdeck": {"event": True}}
        )
    assert "specdeck.event" in _message(raised.value)


def test_bad_json_is_a_400(raw):
    status, body = raw.json("POST", "/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}')
    assert status == 400 and "JSON" in body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"


def test_a_bad_temperature_is_a_400_with_the_engines_message(openai_client):
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=2, temperature=-1)
    assert "temperature must be 0 (greedy) or a finite positive number" in _message(raised.value)
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=0)
    assert "max tokens must be at least 1" in _message(raised.value)


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_is_a_400_not_a_broken_stream(openai_client, stream):
    long = [{"role": "user", "content": "apple banana cherry " * N_CTX}]
    with pytest.raises(openai.BadRequestError) as raised:
        reply = openai_client.chat.completions.create(model="any", messages=long, max_tokens=4, stream=stream)
        list(reply) if stream else None
    message = _message(raised.value)
    assert f"the context window holds {N_CTX}" in message and "shorten the prompt" in message


def test_options_the_engine_cannot_honour_are_refused_by_name(openai_client):
    cases = [
        ({"n": 2}, "'n' cannot be honoured"),
        ({"logprobs": True}, "'logprobs' cannot be honoured"),
        ({"presence_penalty": 0.5}, "'presence_penalty' cannot be honoured"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "'tools'"),
        ({"extra_body": {"speculative.p_min": 0.5}}, "only the draft-model drafter (model)"),
        ({"extra_body": {"specdeck": {"drafter": "model"}}}, "load it on the server"),
        ({"extra_body": {"specdeck": {"drafter": "no-such"}}}, "Unknown drafter 'no-such'"),
        ({"extra_body": {"speculative.n_max": -1}}, "speculative.n_max"),
    ]
    for fields, said in cases:
        with pytest.raises(openai.BadRequestError) as raised:
            openai_client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=2, **fields)
        assert said in _message(raised.value), fields
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.chat.completions.create(model="any", messages=[{"role": "tool", "content": "42"}], max_tokens=2)
    assert "tool" in _message(raised.value)


def test_a_missing_or_wrong_key_is_a_401_and_health_is_open(server, raw):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as raised:
        client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=2)
    assert "The API key is wrong" in _message(raised.value)
    status, error = raw.json("POST", "/v1/chat/completions", {"messages": MESSAGES}, key=None)
    assert status == 401 and "The API key is missing" in error["error"]["message"]
    for key in (None, "wrong"):
        assert raw.request("GET", "/metrics", key=key)[0] == 401
        assert raw.request("GET", "/v1/models", key=key)[0] == 401
    status, health = raw.json("GET", "/health", key=None)
    assert status == 200 and health["status"] == "ok"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_streams_server_sent_events_ending_in_done(server):
    """As the README shows it: JSON said to be JSON (curl's -d alone says it is a form, which the server refuses)."""
    body = json.dumps({"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "stream": True})
    out = subprocess.run(
        [
            "curl",
            "-sN",
            f"{server.url}/v1/chat/completions",
            "-H",
            f"Authorization: Bearer {server.key}",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    events = [line for line in out.splitlines() if line]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_raw_requests_get_json_in_openais_shape(raw):
    status, headers, data = raw.request(
        "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 3}, content_type="application/json; charset=utf-8"
    )
    reply = json.loads(data)
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert reply["choices"][0]["text"] and reply["usage"]["completion_tokens"] <= 3
    status, error = raw.json("POST", "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3})
    assert status == 400 and "takes one per request" in error["error"]["message"]
    status, error = raw.json("POST", "/v1/completions", {"max_tokens": 3})
    assert status == 400 and "'prompt'" in error["error"]["message"]


def test_a_body_that_is_not_text_is_a_400(raw):
    status, error = raw.json("POST", "/v1/chat/completions", b'{"messages": "\xff\xfe"}')
    assert status == 400 and "UTF-8" in error["error"]["message"]


def test_the_openai_client_retrieves_the_model_and_every_404_is_in_openais_shape(openai_client, raw):
    served = openai_client.models.list().data[0].id
    assert openai_client.models.retrieve(served).id == served
    with pytest.raises(openai.NotFoundError) as raised:
        openai_client.models.retrieve("no-such-model")
    assert f"it serves '{served}'" in _message(raised.value)
    for method, path in (("GET", "/v1/nowhere"), ("POST", "/v1/embeddings")):
        status, error = raw.json(method, path, {} if method == "POST" else None)
        assert status == 404 and error["error"]["message"] == f"There is no {path} on this server.", path
    status, error = raw.json("GET", "/v1/chat/completions")
    assert status == 405 and "does not take GET requests" in error["error"]["message"]
