"""One generation at a time: requests queue, a full queue is a 503, a client that leaves cancels its reply.

The session's server lets one request wait (--queue 1) while one generates.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import openai
import pytest

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


def _open_stream(server, max_tokens: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streaming chat request whose first chunk has arrived (so its generation is running)."""
    parts = urlsplit(server.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {server.key}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: {")
    return connection, response


def _hang_up(connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
    """Leave as a client that goes away does: the socket shut, whatever was not read."""
    connection.sock.shutdown(socket.SHUT_RDWR)
    response.close()
    connection.close()


def _wait_idle(raw, timeout: float = 5.0) -> float:
    """Seconds until /health says no job runs."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if raw.json("GET", "/health")[1]["job"] is None:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"a job still runs after {timeout} s: {raw.json('GET', '/health')[1]}")


def test_a_client_that_disconnects_cancels_its_generation(server, raw, openai_client):
    before = raw.metrics().get('specdeck:request_success_total{finished_reason="cancelled"}', 0)
    connection, response = _open_stream(server, max_tokens=800)
    for _ in range(4):
        response.readline()
    assert raw.json("GET", "/health")[1]["job"] == "generate"
    _hang_up(connection, response)
    assert _wait_idle(raw) < 3.0  # cancelled at its next step, not after 800 tokens
    started = time.monotonic()
    openai_client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=4)
    assert time.monotonic() - started < 10.0
    after = raw.metrics()
    assert after['specdeck:request_success_total{finished_reason="cancelled"}'] == before + 1
    assert after["specdeck:num_requests_running"] == 0


def test_two_requests_at_once_both_get_their_reply_in_turn(openai_client):
    replies, errors = [], []

    def ask() -> None:
        try:
            replies.append(
                openai_client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=12, temperature=0)
            )
        except Exception as error:  # noqa: BLE001 - the assertion below shows it
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and len(replies) == 2
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content  # greedy, one after the other


def test_past_the_queue_a_request_gets_503_while_the_waiting_one_is_served(server, raw, openai_client):
    connection, response = _open_stream(server, max_tokens=800)  # generating
    results: dict[str, object] = {}

    def ask(name: str) -> None:
        try:
            results[name] = openai_client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=4)
        except openai.APIStatusError as error:
            results[name] = error

    waiting = threading.Thread(target=ask, args=("waiting",))
    waiting.start()
    deadline = time.monotonic() + 10
    while raw.json("GET", "/health")[1]["waiting"] < 1:  # the queue (one place) is taken
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.02)
    assert raw.metrics()["specdeck:num_requests_waiting"] == 1
    ask("refused")
    refused = results["refused"]
    assert isinstance(refused, openai.APIStatusError) and refused.status_code == 503
    assert "busy" in refused.body["message"] and refused.response.headers.get("retry-after") == "1"
    _hang_up(connection, response)  # the running reply is cancelled; the waiting request goes next
    waiting.join(30)
    assert results["waiting"].choices[0].message.content
    _wait_idle(raw)
