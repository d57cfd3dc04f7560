"""docs/gpu/bench.sh, the one script a lent GPU runs, still runs: its --smoke mode measures every
section at tiny sizes on this CPU and prints the whole table (speed itself is the GPU run's to say)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docs" / "gpu"))

import bench_gpu  # noqa: E402

from engine import EngineConfig  # noqa: E402


@pytest.mark.slow
def test_the_smoke_run_prints_every_row_measured(tmp_path):
    from tests.factories.hf_models import tokenizer_dir

    out = tmp_path / "cells.json"
    env = dict(os.environ, OUT=str(out), PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [
            "bash",
            str(ROOT / "docs" / "gpu" / "bench.sh"),
            "--smoke",
            "--work",
            str(tmp_path / "work"),
            "--tokenizer",
            str(tokenizer_dir()),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = parse(done.stdout)
    expected = bench_gpu.row_keys(bench_gpu.SMOKE)
    assert list(table) == expected  # every row, in order, once
    compiles = "compile" in {f.name for f in dataclasses.fields(EngineConfig)}
    for key, (eager, compiled) in table.items():
        assert eager[:1].isdigit(), (key, eager)  # a number first: measured, not "failed", "not run"...
        measured = compiled[:1].isdigit() or compiled == "(the same copy)"
        assert measured if compiles else compiled == "n/a", (key, compiled)
    assert set(json.loads(out.read_text())["cells"]) == {"|".join(key) for key in expected}  # written as it went
    verify = table[("verify", "llama-1b", bench_gpu.verify_what(bench_gpu.SMOKE))][0]
    assert len(verify.split(" / ")) == len(bench_gpu.SMOKE.rows)
    self_draft = table[("self-draft", "llama-1b", bench_gpu.self_draft_what(bench_gpu.SMOKE))][0]
    assert "a 1.00" in self_draft  # the draft is the target: every draft token is accepted


def test_a_run_stopped_from_outside_still_gives_its_table(tmp_path):
    table = bench_gpu.Table(bench_gpu.SMOKE, tmp_path / "cells.json", {"device": "cpu"})
    first = bench_gpu.row_keys(bench_gpu.SMOKE)[1]
    table.put(first, bench_gpu.EAGER, "1.23 (4.0x the 0.300 ms floor)")
    printed = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gpu" / "bench_gpu.py"), "--table", str(tmp_path / "cells.json")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    table = parse(printed)
    assert list(table) == bench_gpu.row_keys(bench_gpu.SMOKE)
    assert table[first] == ["1.23 (4.0x the 0.300 ms floor)", "not run"]
    assert all(cells == ["not run", "not run"] for key, cells in table.items() if key != first)


def parse(printed: str) -> dict[tuple[str, str, str], list[str]]:
    """The printed table's rows: (section, model, measure) -> [eager, compiled]."""
    lines = [line for line in printed.splitlines() if line.startswith("| ")][1:]  # the header row off
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if "---" not in line]
    return {tuple(row[:3]): row[3:] for row in rows}
