"""Benchmark and auto-tune records as JSON and back: what the engine server sends the app must come back equal,
and the app must be able to hold it without loading torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import EngineConfig
from engine.api import Engine
from engine.bench import (
    AutotuneResult,
    AutotuneSettings,
    BenchPrompt,
    BenchReport,
    BenchSettings,
    Candidate,
    default_prompts_path,
    load_prompts,
    progress_from_dict,
    progress_to_dict,
    run_autotune,
    run_benchmark,
    to_json,
)
from engine.bench.peers import PeerOutput, PeerSpec
from engine.bench.results import SPECULATIVE, VANILLA, PromptSummary, RunRecord
from engine.core.draft_length import CostModel
from engine.drafters.ngram import NgramDrafter

ROOT = Path(__file__).resolve().parents[3]


def through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


class EchoPeer:
    """A peer that answers at once: a real peer row without loading llama-cpp-python a second time."""

    def generate(self, prompt, prompt_ids, max_tokens):
        return PeerOutput("echo", 3, 0.25, 2, (1, 2, 3))

    def close(self):
        pass


def broken():
    raise RuntimeError("this peer always fails")


@pytest.fixture(scope="module")
def engine(default_gguf):
    """The embedded model on one llama.cpp thread (two spin against each other on a busy 2-core machine)."""
    from engine.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(default_gguf, n_ctx=1024, n_threads=1)
    yield Engine(backend, NgramDrafter(), EngineConfig(k=4, measure_costs=False, threads=1), CostModel())
    backend.close()


@pytest.fixture(scope="module")
def prompts():
    shipped = load_prompts(default_prompts_path())
    return next(p for p in shipped if p.kind == "reuse"), next(p for p in shipped if p.kind == "open")


@pytest.fixture(scope="module")
def bench(engine, prompts):
    """A real short benchmark (both kinds, the bandwidth floor, a peer that runs and one that fails), its progress."""
    progress = []
    peers = [PeerSpec("echo", SPECULATIVE, EchoPeer), PeerSpec("broken", VANILLA, broken)]
    report = run_benchmark(
        engine.config,
        prompts,
        BenchSettings(max_tokens=12, repeat=1, warmup=0),
        engine=engine,
        peers=peers,
        progress=lambda message, fraction: progress.append((message, fraction)),
        prompts_source=str(default_prompts_path()),
    )
    return report, progress


@pytest.fixture(scope="module")
def tuned(engine, prompts):
    progress = []
    result = run_autotune(
        engine.config,
        prompts[:1],
        AutotuneSettings(max_tokens=8, warmup=False),
        engine=engine,
        candidates=(Candidate("ngram", 2), Candidate("ngram", "auto")),
        progress=lambda message, fraction: progress.append((message, fraction)),
    )
    return result, progress


def test_a_real_benchmark_report_comes_back_equal_through_json(bench):
    report, _ = bench
    assert report.floor is not None and len(report.peers) == 2 and report.peers[0].prompts  # every part is there
    assert report.runs and all(isinstance(r.token_ids, tuple) and r.token_ids for r in report.runs)

    back = BenchReport.from_dict(through_json(report.to_dict()))

    assert back == report
    assert isinstance(back.prompts, tuple) and isinstance(back.runs[0].token_ids, tuple)
    assert back.overall.efficiency == report.overall.efficiency and back.peers[1].error == report.peers[1].error
    assert back.runs[0].text == report.runs[0].text  # fields left out of the repr travel too


def test_an_exported_report_file_reads_back_as_the_same_report(bench):
    report, _ = bench
    exported = json.loads(to_json(report))  # the file format users have: fields and derived numbers
    assert "efficiency" in exported and "tokens_per_s" in exported["runs"][0]
    assert BenchReport.from_dict(exported) == report


def test_a_divergence_and_missing_measurements_travel_too():
    divergence = {"index": 3, "speculative_token": 17, "vanilla_token": 42, "explained": True, "reason": "rounding"}
    run = RunRecord(
        "p",
        "open",
        SPECULATIVE,
        0,
        5,
        0.5,
        0.1,
        3,
        4,
        2,
        4,
        1.4,
        "length",
        None,
        False,
        divergence,
        "text",
        (1, 2, 3, 4, 5),
    )
    assert RunRecord.from_dict(through_json(run.to_dict())) == run
    summary = PromptSummary(
        "p", "open", 1, 5, 10.0, 12.5, 1.25, float("inf"), 2, 4, 4, 5, 3, False, divergence, "a", "b"
    )
    assert PromptSummary.from_dict(through_json(summary.to_dict())) == summary


def test_benchmark_progress_comes_back_as_the_same_calls(bench):
    _, progress = bench
    assert progress[-1] == ("Done", 1.0) and len(progress) > 3
    assert [progress_from_dict(through_json(progress_to_dict(*call))) for call in progress] == progress


def test_settings_and_prompts_come_back_equal(prompts):
    for settings in (
        BenchSettings(),
        BenchSettings(max_tokens=7, repeat=1, warmup=0, peers=True, measure_bandwidth=False),
    ):
        assert BenchSettings.from_dict(through_json(settings.to_dict())) == settings
    for settings in (AutotuneSettings(), AutotuneSettings(max_tokens=9, warmup=False)):
        assert AutotuneSettings.from_dict(through_json(settings.to_dict())) == settings
    for prompt in load_prompts(default_prompts_path()):
        assert BenchPrompt.from_dict(through_json(prompt.to_dict())) == prompt
    for candidate in (Candidate("ngram", 4), Candidate("medusa", "auto", True), Candidate("none", 0)):
        back = Candidate.from_dict(through_json(candidate.to_dict()))
        assert back == candidate and type(back.k) is type(candidate.k)


def test_a_real_autotune_result_comes_back_equal_through_json(tuned):
    result, progress = tuned
    assert len(result.ranked) == 3 and result.best_config.drafter in ("ngram", "none")

    back = AutotuneResult.from_dict(through_json(result.to_dict()))

    assert back == result
    assert isinstance(back.ranked, tuple) and isinstance(back.best_config, EngineConfig)
    assert back.best.candidate.label == result.best.candidate.label and back.beats_vanilla == result.beats_vanilla
    assert progress[-1] == ("Done", 1.0)
    assert [progress_from_dict(through_json(progress_to_dict(*call))) for call in progress] == progress


# Every name app/bench imports from `engine`, and the wire forms it will rebuild records with.
APP_NAMES = (
    "AutotuneResult",
    "AutotuneSettings",
    "BenchmarkCancelled",
    "BenchPrompt",
    "BenchReport",
    "BenchSettings",
    "Candidate",
    "EngineConfig",
    "SpecDeckError",
    "default_prompts_path",
    "load_prompts",
    "write_json",
    "EFFICIENCY_LIMIT",
    "SPECULATIVE",
    "VANILLA",
    "format_autotune",
    "bench_progress_from_dict",
    "bench_progress_to_dict",
)


def test_the_app_holds_benchmark_records_without_loading_torch(bench, tuned, tmp_path):
    """In a fresh interpreter (this one has torch loaded): import the names, rebuild a real report and auto-tune
    result from their JSON, export the report, read the shipped prompts; torch, llama.cpp, transformers stay out."""
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"report": bench[0].to_dict(), "tuned": tuned[0].to_dict()}))
    script = textwrap.dedent(f"""
        import json, sys
        from engine import {", ".join(APP_NAMES)}
        data = json.load(open({str(payload)!r}))
        report = BenchReport.from_dict(data["report"])
        tuned = AutotuneResult.from_dict(data["tuned"])
        write_json(report, {str(tmp_path / "bench.json")!r})
        format_autotune(tuned)
        prompts = load_prompts(default_prompts_path())
        print(json.dumps({{"heavy": [m for m in ("torch", "llama_cpp", "transformers") if m in sys.modules],
                           "prompts": len(report.prompts), "best": tuned.best.candidate.label}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"heavy": [], "prompts": 2, "best": tuned[0].best.candidate.label}
    assert BenchReport.from_dict(json.loads((tmp_path / "bench.json").read_text())) == bench[0]
