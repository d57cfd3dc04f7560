"""One real engine server per test session: `specdeck-cli serve` on the embedded model, any free port.

It runs as a user starts it (a child process, the command line's own flags), with an
API key, n-gram drafting at a fixed k (so that two greedy runs of one prompt draft
alike) and a queue of one waiting request. Tests that need the server take
`server_url` and `server_key`; `server` also holds the banner it printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_KEY = "test-key-8f2c-5d1e9a"  # 16 characters at least: serve refuses a shorter key
N_CTX = 1024
QUEUE = 1
SERVE_ARGS = [
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
    str(QUEUE),
]
START_TIMEOUT_S = 120.0


def cli_command(*args: str) -> list[str]:
    """The command line as a child process (the console script's code, without depending on PATH)."""
    return [sys.executable, "-m", "engine.cli.main", *args]


@dataclass(frozen=True)
class Server:
    url: str
    key: str | None
    banner: str  # the line `serve` printed on stdout
    process: subprocess.Popen
    log: Path  # its stderr


def start_server(args: list[str], log: Path, key: str | None = None, env: dict | None = None, **popen) -> Server:
    """`specdeck-cli serve ARGS --port 0` as a child process, once it says where it listens. `env`: more
    environment variables; `popen`: subprocess.Popen's options (cwd, preexec_fn)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("SPECDECK_API_KEY", None)
    keyed = ["--api-key", key] if key else []
    with open(log, "wb") as err:
        process = subprocess.Popen(
            cli_command("serve", *args, "--port", "0", *keyed),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            **popen,
        )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline().decode()), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    found = re.search(r"http://127\.0\.0\.1:\d+", lines[0]) if lines else None
    if found is None:
        process.kill()
        process.wait()
        pytest.fail(f"specdeck-cli serve did not say where it listens: {lines!r}; its log: {log.read_text()[-2000:]}")
    return Server(found.group(0), key, lines[0].strip(), process, log)


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    server.process.stdout.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    started = start_server(SERVE_ARGS, tmp_path_factory.mktemp("serve") / "stderr.log", SERVER_KEY)
    yield started
    stop_server(started)


@pytest.fixture(scope="session")
def server_url(server) -> str:
    return server.url


@pytest.fixture(scope="session")
def server_key(server) -> str:
    return server.key


@pytest.fixture()
def openai_client(server):
    """The real openai client on the server's /v1, with no retries: a 503 must reach the test."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key, max_retries=0, timeout=60)


class Raw:
    """Plain HTTP to the server (http.client), as curl would send it: status, headers and body as they come."""

    def __init__(self, url: str, key: str) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.address, self.key = (parts.hostname, parts.port), key

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | dict | None = None,
        *,
        key: str | None = "",
        content_type: str | None = "application/json",
        timeout: float = 60,
        headers: dict | None = None,
    ) -> tuple[int, dict, bytes]:
        """`key` "" (the default): the server's key; None: no Authorization header; else that key.
        `content_type` None: no Content-Type header; `headers`: more (a Host of the test's own, say)."""
        import http.client
        import json

        headers = {**({"Content-Type": content_type} if content_type else {}), **(headers or {})}
        key = self.key if key == "" else key
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        if isinstance(body, dict):
            body = json.dumps(body)
        connection = http.client.HTTPConnection(*self.address, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def json(self, method: str, path: str, body=None, **options) -> tuple[int, dict]:
        import json

        status, _, data = self.request(method, path, body, **options)
        return status, json.loads(data)

    def metrics(self) -> dict[str, float]:
        """/metrics as {sample name with its labels: value}."""
        status, _, data = self.request("GET", "/metrics")
        assert status == 200
        samples = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples


@pytest.fixture()
def raw(server) -> Raw:
    return Raw(server.url, server.key)
