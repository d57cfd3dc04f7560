"""The code is formatted by ruff format and passes ruff check (settings: pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff")
    command = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    return subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("check", [("format", "--check", "."), ("check", ".")], ids=["format", "lint"])
def test_ruff_finds_nothing(check):
    result = _ruff(*check)
    assert result.returncode == 0, (
        f"ruff {' '.join(check)}:\n{result.stdout}{result.stderr}\nFix: ruff format . && ruff check --fix ."
    )
