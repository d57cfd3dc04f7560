"""Real servers for the window's remote engines, on loopback ports: a SpecDeck server and llama-server.

`SpecDeckServer` runs the server the window's own engine process runs (`python -m
engine.service`), as a user would start one elsewhere: its own process, a known API key,
no model until a client loads one. The session's server is shared by the tests that only
talk to it; a test that kills its server starts its own (`start_specdeck_server`).

llama-server is built from source into a cache (`specdeck-cli llama-server build`,
README's install command); with no binary, the tests that need one fail and say so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field

import pytest

from engine.service.run import LISTENING_PREFIX

SERVER_KEY = "window-test-key-41d7"
START_TIMEOUT_S = 120.0


@dataclass
class SpecDeckServer:
    key: str = SERVER_KEY
    url: str = ""
    process: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> SpecDeckServer:
        env = {**os.environ, "SPECDECK_API_KEY": self.key, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "engine.service", "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(self.process.stdout.readline().decode()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not lines or not lines[0].startswith(LISTENING_PREFIX):
            self.stop()
            pytest.fail(f"The SpecDeck server did not say where it listens: {lines!r}")
        self.url = f"http://{lines[0].split()[1]}"
        return self

    def kill(self) -> None:
        """As a crash ends it (SIGKILL)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process.stdout.close()


@pytest.fixture(scope="session")
def specdeck_server():
    server = SpecDeckServer().start()
    yield server
    server.stop()


@pytest.fixture
def start_specdeck_server():
    """start_specdeck_server() -> a server of the test's own (it may kill it), stopped at teardown."""
    started: list[SpecDeckServer] = []

    def start() -> SpecDeckServer:
        started.append(SpecDeckServer().start())
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def nowhere() -> str:
    """A loopback URL where nothing listens (a port just freed)."""
    from engine.remote.llama_server_process import free_port

    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="session")
def llama_server_binary() -> str:
    from engine.remote.llama_server_binary import find_llama_server

    found = find_llama_server()
    if found is None:
        pytest.fail(
            "No llama-server binary: run `specdeck-cli llama-server build` (the second half of README's "
            "install command), or set $SPECDECK_LLAMA_SERVER, to test the window on llama-server."
        )
    return str(found)


LLAMA_SPEC = ["--spec-type", "ngram-simple", "--spec-draft-n-max", "8"]


@pytest.fixture(scope="session")
def llama_servers(llama_server_binary, default_gguf):
    """(speculative, vanilla): llama-server on the embedded model with n-gram drafting, and without."""
    from engine.remote.llama_server_process import LlamaServerProcess

    with (
        LlamaServerProcess(llama_server_binary, default_gguf, threads=2, n_ctx=2048, spec=LLAMA_SPEC) as spec,
        LlamaServerProcess(llama_server_binary, default_gguf, threads=2, n_ctx=2048) as vanilla,
    ):
        yield spec, vanilla
