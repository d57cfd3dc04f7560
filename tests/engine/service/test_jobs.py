"""Benchmark, auto-tune and training on an engine server: what the app's dialogs and `bench --server` get.

One real engine process (`python -m engine.service`, as the app starts it) with the
embedded model and n-gram drafting loaded; every test finds that pair loaded
(`client` loads it again after a test that freed it).
"""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from engine.bench.autotune_results import PLAIN, AutotuneSettings, Candidate
from engine.bench.prompts import BenchPrompt
from engine.bench.results import SPECULATIVE, VANILLA, BenchmarkCancelled, BenchSettings
from engine.config import EngineConfig
from engine.core.sampling_config import SamplingConfig
from engine.errors import SpecDeckError
from engine.service.process import EngineProcess

CONFIG = EngineConfig(target="default", drafter="ngram")
PROMPTS = (
    BenchPrompt("echo", "reuse", ({"role": "user", "content": "Repeat exactly: the cat sat on the mat."},)),
    BenchPrompt("hello", "open", ({"role": "user", "content": "Say hello."},)),
)
QUICK = BenchSettings(max_tokens=8, repeat=1, warmup=0, measure_bandwidth=False)
TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat. " * 60


@pytest.fixture(scope="module")
def process():
    engine = EngineProcess()
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture()
def client(process):
    process.client.load(CONFIG)  # at once when it is still loaded
    return process.client


def runs_of(report) -> list[tuple]:
    return [(r.prompt_id, r.mode, r.repeat, r.tokens, r.token_ids) for r in report.runs]


def test_a_bench_of_the_loaded_pair_gives_the_local_report_and_keeps_the_pair(client):
    from engine.bench.runner import run_benchmark

    progress, unloaded = [], []
    report = client.bench(
        CONFIG,
        PROMPTS,
        QUICK,
        prompts_source="my-prompts.jsonl",
        progress=lambda message, fraction: progress.append((message, fraction)),
        on_unloaded=unloaded.append,
    )
    local = run_benchmark(CONFIG, PROMPTS, QUICK, prompts_source="my-prompts.jsonl")

    assert runs_of(report) == runs_of(local)  # greedy: the same tokens, prompt by prompt and mode by mode
    assert [(p.id, p.kind, p.tokens) for p in report.prompts] == [(p.id, p.kind, p.tokens) for p in local.prompts]
    assert [r.mode for r in report.runs] == [VANILLA, SPECULATIVE] * 2 and all(r.identical for r in report.runs[1::2])
    assert report.settings["prompts_file"] == "my-prompts.jsonl"
    assert report.settings["target"] == local.settings["target"]
    assert "Repeat 1/1: hello, speculative" in [m for m, _ in progress] and progress[-1] == ("Done", 1.0)
    assert [f for _, f in progress] == sorted(f for _, f in progress)
    assert unloaded == [] and client.loaded().config == CONFIG


def test_cancel_ends_a_bench_with_benchmark_cancelled_and_frees_the_server(client):
    cancel = threading.Event()
    seen = []

    def progress(message: str, fraction: float) -> None:
        seen.append(message)
        if message.startswith("Repeat 1/"):
            cancel.set()

    many = dataclasses.replace(QUICK, max_tokens=64, repeat=5)
    with pytest.raises(BenchmarkCancelled, match="cancelled"):
        client.bench(CONFIG, PROMPTS, many, progress=progress, cancel=cancel)
    assert not any(m.startswith("Repeat 2/") for m in seen)  # it stopped, not ran to the end
    assert client.health()["job"] is None  # free at once
    assert client.loaded().config == CONFIG  # the pair stays, and answers
    assert client.generate([{"role": "user", "content": "Hi"}], SamplingConfig(max_tokens=4)).stats.tokens > 0


def test_autotune_on_the_server_ranks_its_candidates(client):
    progress = []
    candidates = (Candidate("ngram", 2), Candidate("ngram", 4))
    result = client.autotune(
        CONFIG,
        PROMPTS[:1],
        AutotuneSettings(max_tokens=8, warmup=False),
        candidates=candidates,
        progress=lambda message, fraction: progress.append(message),
    )
    assert {r.candidate for r in result.ranked} == {PLAIN, *candidates}
    assert result.prompts == 1 and result.max_tokens == 8 and result.best_config.target == "default"
    assert progress[-1] == "Done" and client.loaded().config == CONFIG


def test_a_bench_of_another_config_frees_the_loaded_pair_first_and_says_so(client):
    other = dataclasses.replace(CONFIG, k=2)
    events = []
    report = client.bench(
        other,
        PROMPTS[:1],
        QUICK,
        progress=lambda message, fraction: events.append(message),
        on_unloaded=lambda freed: events.append(freed),
    )
    assert events[0] == CONFIG and CONFIG not in events[1:]  # before anything else, once
    assert report.settings["k"] == 2  # the job's own pair, loaded and closed by it
    assert client.loaded() is None  # nothing stays loaded: the app's engine leaves the reload to the app


def test_training_on_the_server_streams_progress_and_its_checkpoint_reads_back(client, tmp_path):
    from tests.factories.hf_models import make_tiny_llama

    tiny = make_tiny_llama(tmp_path / "tiny-llama", seed=0)
    data = tmp_path / "fox.txt"
    data.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "heads"
    options = dict(
        target_spec=tiny,
        data=[str(data)],
        out_dir=str(out),
        steps=3,
        batch_size=2,
        seq_len=32,
        lr=3e-2,
        checkpoint_every=100,
        val_windows=2,
    )

    # A mistake is refused before anything happens: the loaded pair stays.
    with pytest.raises(SpecDeckError, match="stepz"):
        client.train({**options, "stepz": 3}, resume=False)
    with pytest.raises(SpecDeckError, match="No training data at .*missing.txt"):
        client.train({**options, "data": [str(tmp_path / "missing.txt")]}, resume=False)
    assert client.loaded().config == CONFIG

    events, unloaded = [], []
    result = client.train(
        options, resume=False, command="SpecDeck: train heads", progress=events.append, on_unloaded=unloaded.append
    )
    steps = [e for e in events if e.phase == "train"]
    assert unloaded == [CONFIG] and client.loaded() is None  # training loads its own target
    assert [e.step for e in steps] == [1, 2, 3] and all(len(e.head_accuracy) == 4 for e in steps)
    assert events[-1].phase == "done"
    assert (result.step, result.steps, result.cancelled, result.out_dir) == (3, 3, False, str(out))
    assert len(result.head_accuracy) == 4 and result.training["command"] == "SpecDeck: train heads"

    info, history = client.checkpoint(str(out))
    assert (info.step, info.steps, info.finished) == (3, 3, True) and info.settings["data"] == (str(data),)
    assert history["loss"] == [e.loss for e in steps] and len(history["head_accuracy"]) == 3
    assert client.checkpoint(str(tmp_path / "nothing here")) == (None, {})


def test_cli_bench_on_a_server_prints_the_local_tables(client, tmp_path, capsys):
    from engine.cli.main import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(PROMPTS[0].to_dict()) + "\n", encoding="utf-8")
    key = client._headers["Authorization"].removeprefix("Bearer ")  # the key EngineProcess gave its child
    out = tmp_path / "report.json"
    args = [
        "bench",
        "--server",
        client.url,
        f"--api-key={key}",  # the random key may start with '-', which argparse reads as a flag
        "--prompts",
        str(prompts),
        "-n",
        "8",
        "--repeat",
        "1",
        "--warmup",
        "0",
    ]
    assert main([*args, "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "benchmarking on " + client.url in captured.err
    table = captured.out
    assert "Target SmolLM2" in table and "drafter ngram" in table and "speedup" in table
    assert any(line.startswith("echo ") for line in table.splitlines())
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert [r["mode"] for r in saved["runs"]] == [VANILLA, SPECULATIVE]
    assert saved["settings"]["prompts_file"] == str(prompts)
    assert client.loaded().config == CONFIG  # the server's pair was benchmarked, and stays
    assert main([*args, "--peers", "--llama-server", "/bin/true"]) == 2  # a program is never the client's to name
    assert "never a client's" in capsys.readouterr().err

    # The pair is the server's: a flag about a local one is refused, before anything runs.
    assert main([*args, "--target", "other.gguf"]) == 2
    assert "--target is about the pair loaded here" in capsys.readouterr().err
    assert main([*args[:2], "http://127.0.0.1:9", *args[3:]]) == 2
    assert "Nothing answers at http://127.0.0.1:9" in capsys.readouterr().err
