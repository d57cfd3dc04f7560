"""The script behind docs/benchmarks.md's app-against-CLI numbers still runs (a smoke test: speed
itself belongs in the benchmark, not in tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "bench" / "app_speed.py"


@pytest.mark.slow
def test_the_app_speed_script_reads_a_speed_from_the_cli_and_from_the_window(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1")
    command = [sys.executable, str(SCRIPT), "--smoke", "--k", "3", "--fresh-engine"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| llama-ngram | shown | no |" in done.stdout
    rows = json.loads(done.stderr.strip().splitlines()[-1])
    assert rows[0]["cli"][0] > 0 and rows[0]["app"][0] > 0 and rows[0]["pair_ratio"] > 0
    assert rows[0]["k"] == 3  # the same fixed draft length for both
    assert all(cli_steps > 0 and app_steps > 0 for cli_steps, app_steps in rows[0]["steps"])  # read from both
    assert len(rows[0]["drafted"]) == 2 and all(min(pair) >= 0 for pair in rows[0]["drafted"])
    assert len(rows[0]["app"]) == 2 and all(speed > 0 for speed in rows[0]["app"])  # the second on a new engine
