"""A benchmark report shaped like a run of the built-in prompts (24 rows: reuse, open and four three-turn
conversations), made from run records without running anything: for the view's tests and screenshots."""

from __future__ import annotations

from engine import default_prompts_path, load_prompts
from engine.bench.prompts import TURN_MARK
from engine.bench.results import SPECULATIVE, VANILLA, BenchReport, FloorCheck, MemoryCheck, RunRecord, summarize


def sample_runs(repeat: int = 1) -> list[RunRecord]:
    rows = []
    for prompt in load_prompts(default_prompts_path()):
        ids = [prompt.id] if prompt.turns == 1 else [f"{prompt.id}{TURN_MARK}{t + 1}" for t in range(prompt.turns)]
        rows += [(row, prompt.kind) for row in ids]
    runs = []
    for r in range(repeat):
        for i, (row, kind) in enumerate(rows):
            gain = 1.0 + (i % 5) * 0.15
            for mode in (VANILLA, SPECULATIVE):
                spec = mode == SPECULATIVE
                runs.append(
                    RunRecord(
                        prompt_id=row,
                        kind=kind,
                        mode=mode,
                        repeat=r,
                        tokens=128,
                        wall_s=128 / (60 * (gain if spec else 1)),
                        prefill_s=0.05,
                        steps=64 if spec else 128,
                        drafted=200 if spec else 0,
                        accepted=64 if spec else 0,
                        tested=90 if spec else 0,
                        predicted_speedup=gain * 1.1 if spec else 1.0,
                        finish_reason="length",
                        peak_rss_bytes=2**28,
                        identical=True if spec else None,
                    )
                )
    return runs


def sample_report(runs: list[RunRecord] | None = None) -> BenchReport:
    runs = sample_runs() if runs is None else runs
    prompts, kinds, overall = summarize(runs)
    floor = FloorCheck(
        weight_bytes=96_576_768, bandwidth_bytes_per_s=2.9e10, threads=2, device="cpu", floor_s=0.0033, vanilla_s=0.0090
    )
    return BenchReport(
        settings={"max_tokens": 128, "repeat": 1},
        prompts=prompts,
        kinds=kinds,
        overall=overall,
        floor=floor,
        memory=MemoryCheck(2**28, 2**28 + 2**20, 2**20, True),
        runs=tuple(runs),
    )
