"""Starting up: `import engine` stays light, and Ctrl+C while specdeck-cli starts exits quietly."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_engine_imports_neither_the_preflight_nor_the_doctor():
    loaded = run_python(
        "import sys, engine; print(sorted(m for m in ('engine.preflight', 'engine.models.doctor') if m in sys.modules))"
    )
    assert loaded == "[]"


@pytest.mark.parametrize(
    "first", ["import engine.preflight", "from engine.preflight import Preflight", "import engine; engine.Preflight"]
)
def test_engine_preflight_is_the_function_whoever_imports_its_module_first(first):
    said = run_python(
        f"{first}\nimport engine\nfrom engine import preflight\n"
        "print(callable(engine.preflight), preflight is engine.preflight, engine.preflight.__name__)"
    )
    assert said == "True True preflight"


def cli_script() -> str:
    """The console script itself (not a pyenv shim in front of it)."""
    beside = Path(sys.executable).with_name("specdeck-cli")
    exe = str(beside) if beside.is_file() else shutil.which("specdeck-cli")
    assert exe, "specdeck-cli is not installed: run the install command from README.md"
    return exe


# Ctrl+C once each of these has been imported. The first is what `import engine` imported first, before
# the handler went in there (it was installed by engine.cli.main, after the whole package had imported).
@pytest.mark.parametrize("after", ["engine.errors", "argparse", "engine.cli.main"])
def test_ctrl_c_while_specdeck_cli_starts_exits_quietly(after):
    """A real specdeck-cli, interrupted from outside while its startup imports run: `-X importtime`
    writes a line to stderr as each import ends, so the signal lands right after `after` was imported."""
    child = subprocess.Popen(
        [sys.executable, "-X", "importtime", cli_script(), "generate", "-m", "default", "-p", "Hi", "-n", "4"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    try:
        seen = []
        while not (seen and seen[-1].startswith("import time:") and seen[-1].split("|")[-1].strip() == after):
            line = child.stderr.readline()
            assert line, f"the process ended before importing {after}:\n{''.join(seen[-20:])}"
            seen.append(line)
        child.send_signal(signal.SIGINT)
        rest = child.stderr.read()
        code = child.wait(timeout=60)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()
    said = [line for line in rest.splitlines() if not line.startswith("import time:")]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, "\n".join(said[-30:])
    assert code == 130 and said[-1:] == ["cancelled"], (code, said[-5:])
