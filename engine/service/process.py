"""`EngineProcess`: a private engine server in a child process, started and stopped by its owner.

The desktop app decodes here, not in its own process: the engine's threads get
the cores without the GUI in their way, and an engine that dies (a C++ abort, an
out-of-memory kill) leaves the window up. The child listens on a free loopback
port with a random key that only this process knows (passed by environment, not
on the command line), announces its port on standard output, and ends by itself
if its parent dies. Its log goes to a file, whose last lines say why it died.
It is started with `--client-paths`: the paths its one client sends (the heads
folder, the training data, any model file) are that same user's choices, taken
as given; why that is safe here and never for `specdeck-cli serve` is said in
engine/service/paths.py.

Light: starting the child imports nothing heavy here.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from engine.service.client import EngineClient, EngineUnavailable
from engine.service.paths import CLIENT_PATHS_FLAG
from engine.service.run import LISTENING_PREFIX

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0


ENGINE_FLAG = "--specdeck-engine"  # the frozen app's executable runs the engine when given this first


def engine_command(python: str) -> list[str]:
    """How to start the engine server: `python -m engine.service`, or, in the frozen app (PyInstaller,
    where there is no interpreter to give -m), the app's own executable with ENGINE_FLAG."""
    if getattr(sys, "frozen", False):
        return [sys.executable, ENGINE_FLAG]
    return [python, "-m", "engine.service"]


class EngineProcess:
    def __init__(self, python: str | None = None, env: dict[str, str] | None = None) -> None:
        self._python = python or sys.executable
        self._env = env
        self._child: subprocess.Popen | None = None
        self._log_path: Path | None = None
        self.client: EngineClient | None = None
        self._starting = threading.Lock()  # `ensure` from two threads starts one child, not two

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def start(self, timeout: float = START_TIMEOUT_S) -> EngineClient:
        """Start the child and wait until it listens; returns its client. Raises EngineUnavailable."""
        self.stop()
        key = secrets.token_urlsafe(24)
        env = dict(os.environ if self._env is None else self._env, SPECDECK_API_KEY=key, PYTHONUNBUFFERED="1")
        log_file = tempfile.NamedTemporaryFile("wb", prefix="specdeck-engine-", suffix=".log", delete=False)
        self._log_path = Path(log_file.name)
        command = [*engine_command(self._python), "--port", "0", "--parent-pid", str(os.getpid()), CLIENT_PATHS_FLAG]
        try:
            # A session of its own: a Ctrl+C in the terminal that started the app reaches the app,
            # which then stops its engine, and not the engine behind its back.
            self._child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_file,
                env=env,
                start_new_session=True,
            )
        except OSError as error:
            raise EngineUnavailable(f"Cannot start the engine process ({error.strerror}): {command[0]}.") from error
        finally:
            log_file.close()
        address = self._read_address(timeout)
        self.client = EngineClient(f"http://{address}", api_key=key)
        return self.client

    def ensure(self, timeout: float = START_TIMEOUT_S) -> EngineClient:
        """The running child's client; the child is started first when it is not running. Safe from
        several threads at once (a job and the pair dialog's check): one starts it, the others wait
        and share it, where two `start`s would each stop the other's child."""
        with self._starting:
            client = self.client
            if self.running and client is not None:
                return client
            return self.start(timeout)

    def _read_address(self, timeout: float) -> str:
        found: list[str] = []
        child = self._child

        def read() -> None:  # a thread, since a pipe's readline cannot time out
            for raw in child.stdout:
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith(LISTENING_PREFIX):
                    found.append(line.split()[1])
                    break

        reader = threading.Thread(target=read, daemon=True, name="specdeck-engine-start")
        reader.start()
        reader.join(timeout)
        if found:
            return found[0]
        self.stop()
        raise EngineUnavailable(
            f"The engine process did not start: {self.exit_description() or 'no answer'}{self._log_tail()}"
        )

    def exit_description(self) -> str:
        """How the child ended, in words ("was killed by signal 9 (SIGKILL)"); "" while it runs."""
        if self._child is None:
            return "it was never started"
        code = self._child.poll()
        if code is None:
            return ""
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "unknown"
            return f"it was killed by signal {-code} ({name})"
        return f"it exited with code {code}"

    def death_message(self) -> str:
        """A sentence for the user about a child that has ended, with the last line of its log."""
        return f"The engine process stopped: {self.exit_description()}.{self._log_tail()}"

    def _log_tail(self, lines: int = 1) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        try:
            text = self._log_path.read_text("utf-8", "replace").strip().splitlines()
        except OSError:
            return ""
        tail = " ".join(line.strip() for line in text[-lines:] if line.strip())
        return f" Its log ends with: {tail}" if tail else ""

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """End the child (SIGTERM, then SIGKILL after `timeout`) and wait for it."""
        child, self._child, self.client = self._child, None, None
        if child is None:
            return
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if child.stdout is not None:
            child.stdout.close()
        self._child = child  # kept for exit_description() until the next start
        self._remove_log_later()

    def _remove_log_later(self) -> None:
        # The log explains a death; it is removed when the next start replaces it or the process ends.
        path = self._log_path
        if path is not None:
            import atexit

            atexit.register(lambda: path.unlink(missing_ok=True))

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Until /health answers (it does as soon as the address is announced; this is for restarts)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client.health(timeout=1.0)
                return
            except EngineUnavailable:
                if time.monotonic() > deadline or not self.running:
                    raise
                time.sleep(0.05)
