"""Running a local `llama-server` on a GGUF file: the benchmark's peer and the tests' real server.

    with LlamaServerProcess(binary, "model.gguf", threads=2, n_ctx=4096,
                            spec=["--spec-type", "ngram-map-k"]) as server:
        LlamaServerEngine(server.url).generate(...)

It listens on 127.0.0.1 on a free port, with the web UI off; `start` returns once
`/health` answers (or raises with the last lines of its log). Its log goes to a
file, which says why it died.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from engine.backends.repack import server_flags
from engine.errors import SpecDeckError
from engine.remote.http import JsonServer, ServerRefused, ServerUnavailable

START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LlamaServerProcess:
    def __init__(
        self,
        binary: str | os.PathLike,
        model: str | os.PathLike,
        *,
        threads: int | None = None,
        n_ctx: int = 4096,
        spec: list[str] | tuple[str, ...] = (),
        extra: list[str] | tuple[str, ...] = (),
        api_key: str | None = None,
    ) -> None:
        self.binary, self.model = Path(binary), Path(model)
        self.threads, self.n_ctx, self.spec, self.extra = threads, n_ctx, list(spec), list(extra)
        self.api_key = api_key
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        command = [
            str(self.binary),
            "-m",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-c",
            str(self.n_ctx),
            "-np",
            "1",
            "--no-webui",
            *server_flags(),
            *self.spec,
            *self.extra,
        ]
        if self.threads:
            command += ["-t", str(self.threads), "-tb", str(self.threads)]
        if self.api_key:
            command += ["--api-key", self.api_key]
        return command

    def start(self) -> LlamaServerProcess:
        self.port = free_port()
        log = tempfile.NamedTemporaryFile(prefix="specdeck-llama-server-", suffix=".log", delete=False)
        self.log_path = Path(log.name)
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        health = JsonServer(self.url, self.api_key, "llama-server")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SpecDeckError(
                    f"llama-server exited with status {self.proc.returncode} while starting. "
                    f"Its last lines:\n{self.log_tail()}"
                )
            try:
                if health.get("/health", timeout=2.0).get("status") == "ok":
                    return self
            except (ServerUnavailable, ServerRefused):  # not listening yet, or 503 while loading
                pass
            time.sleep(0.1)
        self.stop()
        raise SpecDeckError(
            f"llama-server did not become ready in {START_TIMEOUT_S:.0f} s. Its last lines:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """As a crash would end it (SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> LlamaServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
