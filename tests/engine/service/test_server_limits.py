"""The server's limits, tried as a hostile client would against a real `specdeck-cli serve` on loopback.

The server here is the README's first example: keyless, on 127.0.0.1, under the usual
1024 open-file limit, with a header deadline short enough to watch (2 s). Each test is
an attack that worked before: a body of 100 MB, 100,000 messages, a queued request
whose client left, a flood of connections that never finish their headers, a web
page's text/plain POST or its own domain as Host (DNS rebinding), numbers and nesting
that Python's JSON reader cannot take.
"""

from __future__ import annotations

import http.client
import json
import resource
import socket
import time
from pathlib import Path

import pytest

from tests.engine.service.conftest import N_CTX, Raw, start_server, stop_server

pytestmark = pytest.mark.slow

FILE_LIMIT = 1024  # the usual soft limit on open files
HEADER_TIMEOUT_S = 2.0
SAY_HI = [{"role": "user", "content": "Say hi."}]
LONG_REPLY = [{"role": "user", "content": "Write a long story about a lighthouse keeper and his cat."}]


def _file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


@pytest.fixture(scope="module")
def keyless(tmp_path_factory):
    args = [
        "-m",
        "default",
        "--backend",
        "llama.cpp",
        "--drafter",
        "ngram",
        "--k",
        "3",
        "-c",
        str(N_CTX),
        "--queue",
        "2",
        "--header-timeout",
        str(HEADER_TIMEOUT_S),
    ]
    server = start_server(args, tmp_path_factory.mktemp("keyless") / "stderr.log", preexec_fn=_file_limit)
    yield server
    stop_server(server)


@pytest.fixture()
def raw(keyless) -> Raw:
    return Raw(keyless.url, None)


def _address(server) -> tuple[str, int]:
    host, port = server.url.rsplit("//", 1)[1].split(":")
    return host, int(port)


def _memory_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _finished(raw: Raw) -> float:
    """Generations the server has finished, cancelled ones included (/metrics)."""
    status, _, data = raw.request("GET", "/metrics")
    assert status == 200
    lines = data.decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("specdeck:request_success_total"))


def _wait_idle(raw: Raw, within_s: float) -> float:
    """Seconds until /health says no job runs; fails after `within_s`."""
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        status, health = raw.json("GET", "/health")
        if status == 200 and health["job"] is None and health["waiting"] == 0:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"the server was still busy after {within_s} s: {health}")


def _answer(sock: socket.socket) -> str:
    """One HTTP response read off `sock`: its status line, headers and body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next((int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def _stream_start(server, body: dict) -> socket.socket:
    """A streamed generation on a socket of its own, once its first event has come."""
    sock = socket.create_connection(_address(server), timeout=60)
    data = json.dumps(body).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    received = b""
    while b"data: " not in received:
        received += sock.recv(65536)
    return sock


# -- size -----------------------------------------------------------------------------------------


def test_a_100_mb_body_is_refused_before_the_server_reads_it(keyless, raw):
    before = _memory_mb(keyless.process.pid)
    with socket.create_connection(_address(keyless), timeout=30) as sock:  # Content-Length says it: 413 at once
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (100 * 2**20) + b"[" * 65536
        )
        answer = _answer(sock)
    assert answer.startswith("HTTP/1.1 413") and "over this server's limit of 8.0 MB" in answer
    with socket.create_connection(_address(keyless), timeout=30) as sock:  # chunked: cut off at the limit
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n%s\r\n" % (2**20, b" " * 2**20)
        sent = 0
        try:
            for _ in range(100):
                sock.sendall(chunk)
                sent += 1
        except OSError:  # the server answered and closed: the rest is not read
            pass
        answer = _answer(sock)
    assert answer.startswith("HTTP/1.1 413"), answer[:200]
    assert sent < 100 or "413" in answer
    assert _memory_mb(keyless.process.pid) < max(1024, before + 100), "the body was kept in memory"
    assert raw.json("GET", "/health")[1]["status"] == "ok"


def test_a_hundred_thousand_messages_are_refused_at_once_with_the_limit_named(raw):
    messages = [{"role": "user", "content": "hi"}] * 100_000
    start = time.monotonic()
    status, error = raw.json("POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert status == 400 and "100000 messages is more than this server takes" in error["error"]["message"]
    assert "--max-messages" in error["error"]["message"]
    assert time.monotonic() - start < 10, "a request the server refuses must not hold it for long"
    status, error = raw.json("POST", "/specdeck/generate", {"messages": messages})
    assert status == 400 and "(1024)" in error["error"]["message"]
    _wait_idle(raw, 1.0)


# -- time -----------------------------------------------------------------------------------------


def test_a_request_whose_client_left_while_it_waited_never_runs(keyless, raw):
    before = _finished(raw)
    first = _stream_start(keyless, {"messages": LONG_REPLY, "max_tokens": 600, "temperature": 0, "stream": True})
    body = json.dumps({"messages": SAY_HI, "max_tokens": 32, "temperature": 0}).encode()
    waiting = socket.create_connection(_address(keyless), timeout=30)
    waiting.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    deadline = time.monotonic() + 10
    while raw.json("GET", "/health")[1]["waiting"] < 1:  # the second request is in the queue
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.02)
    waiting.close()  # its client goes away while it waits
    time.sleep(0.6)  # the server notices (it looks every 0.25 s)
    first.close()  # and the running reply's client goes too
    assert _wait_idle(raw, 3.0) < 3.0
    assert _finished(raw) == before + 1, "the request whose client had gone still ran when its turn came"


def test_a_long_reply_whose_client_leaves_frees_the_engine_within_a_second(keyless, raw):
    sock = _stream_start(keyless, {"messages": LONG_REPLY, "max_tokens": 800, "temperature": 0, "stream": True})
    sock.close()
    assert _wait_idle(raw, 1.5) <= 1.5


# -- connections ----------------------------------------------------------------------------------


def test_a_flood_of_half_open_connections_does_not_shut_out_health(keyless, raw):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))  # this side needs 1,100 sockets
    log_before = keyless.log.stat().st_size
    flood = []
    try:
        for _ in range(1100):  # more than the server's 1024 files: each sends half its headers, then waits
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(_address(keyless))
            except BlockingIOError:
                pass
            flood.append(sock)
        time.sleep(0.5)
        for sock in flood:
            try:
                sock.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            except OSError:  # a connection the server closed already to make room
                pass
        start = time.monotonic()
        status, health = raw.json("GET", "/health", timeout=5)
        assert status == 200 and health["status"] == "ok"
        assert time.monotonic() - start < 5  # a SYN the kernel dropped in the burst is retried after 1 s
        time.sleep(HEADER_TIMEOUT_S + 1.5)  # past the header deadline every half-open connection is closed
        closed = 0
        for sock in flood:
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:  # still open
                pass
            except OSError:  # reset: closed
                closed += 1
        assert closed == len(flood), f"{len(flood) - closed} half-open connections were still open"
    finally:
        for sock in flood:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert raw.json("GET", "/health")[1]["status"] == "ok"
    grown = keyless.log.stat().st_size - log_before
    assert grown < 20_000, f"the flood wrote {grown} bytes of log"


# -- reached from a web page ----------------------------------------------------------------------


def test_a_web_pages_simple_post_is_refused_and_changes_nothing(raw):
    generated = _finished(raw)
    body = json.dumps({"messages": SAY_HI, "max_tokens": 4})
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        status, error = raw.json("POST", "/v1/chat/completions", body, content_type=content_type)
        assert status == 415 and "Content-Type: application/json" in error["error"]["message"], content_type
    status, error = raw.json("POST", "/specdeck/unload", None, content_type=None)
    assert status == 415
    assert raw.json("GET", "/health")[1]["status"] == "ok", "a POST without a JSON body unloaded the model"
    assert _finished(raw) == generated


def test_a_foreign_host_is_refused_on_every_route_and_loopback_names_are_not(keyless, raw):
    port = _address(keyless)[1]
    for host in ("evil.example", f"evil.example:{port}", "192.168.1.20", "127.0.0.1.nip.io"):
        for method, path, body in (
            ("GET", "/health", None),
            ("GET", "/v1/models", None),
            ("POST", "/v1/chat/completions", {"messages": SAY_HI, "max_tokens": 1}),
        ):
            status, error = raw.json(method, path, body, headers={"Host": host})
            assert status == 400 and "is not this server" in error["error"]["message"], (host, path)
    for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert raw.request("GET", "/v1/models", headers={"Host": host})[0] == 200, host


# -- what Python's JSON reader cannot take ------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/specdeck/generate"])
def test_huge_numbers_and_deep_nesting_are_400s_with_a_sentence(keyless, raw, path):
    log_before = keyless.log.stat().st_size
    digits = '{"messages": [{"role": "user", "content": "Hi"}], "seed": %s}' % ("9" * 5000)
    nested = "[" * 100_000 + "]" * 100_000
    if path == "/specdeck/generate":
        digits = '{"messages": [{"role": "user", "content": "Hi"}], "sampling": {"seed": %s}}' % ("9" * 5000)
    for body in (digits, nested):
        status, headers, data = raw.request("POST", path, body)
        assert status == 400 and headers["content-type"] == "application/json", data[:200]
        error = json.loads(data)["error"]
        assert error["type"] == "invalid_request_error" and "too" in error["message"]
    seed = {"messages": SAY_HI, "max_tokens": 1, "seed": 2**70}
    if path == "/specdeck/generate":
        seed = {"messages": SAY_HI, "sampling": {"seed": 2**70, "max_tokens": 1}}
    status, error = raw.json("POST", path, seed)
    assert status == 400 and "the seed must be a whole number from" in error["error"]["message"]
    assert "Traceback" not in keyless.log.read_bytes()[log_before:].decode(errors="replace")


# -- keys -------------------------------------------------------------------------------------------


def test_a_short_key_is_refused_before_the_model_loads(tmp_path):
    import subprocess

    from tests.engine.service.conftest import cli_command

    done = subprocess.run(
        cli_command("serve", "-m", "default", "--port", "0", "--api-key", "abc"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "at least 16" in done.stderr and "secrets.token_urlsafe" in done.stderr


def test_the_bearer_scheme_is_case_insensitive(server):
    host, port = _address(server)
    for scheme in ("Bearer", "bearer", "BEARER"):
        connection = http.client.HTTPConnection(host, port, timeout=30)
        connection.request("GET", "/v1/models", headers={"Authorization": f"{scheme} {server.key}"})
        assert connection.getresponse().status == 200, scheme
        connection.close()
    connection = http.client.HTTPConnection(host, port, timeout=30)
    connection.request("GET", "/v1/models", headers={"Authorization": f"Basic {server.key}"})
    assert connection.getresponse().status == 401
    connection.close()
