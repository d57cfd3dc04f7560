"""specdeck-cli bench --concurrency: bad values refused before anything loads, and a tiny real model's
two-point sweep end to end (PyTorch native forward with Slots, float32) with --json."""

from __future__ import annotations

import json

import pytest

from engine.bench.load_results import AUTO, VANILLA, LoadSweep
from engine.cli.main import main


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0", "1 or more, not 0"),
        ("-2", "1 or more, not -2"),
        ("four", "not 'four'"),
        ("1,2.5", "not '2.5'"),
        ("1,,2", "not ''"),
        ("512", "256 at most"),
    ],
)
def test_a_bad_concurrency_is_refused_before_loading(capsys, value, said):
    code, _, err = run_cli(capsys, "bench", "--target", "no-such-model-here", f"--concurrency={value}")
    assert code == 2 and said in err and "no-such-model-here" not in err  # said before the target is looked for


def test_load_test_options_need_concurrency_and_exclude_the_other_runs(capsys):
    code, _, err = run_cli(capsys, "bench", "--context", "512")
    assert code == 2 and "--concurrency" in err
    code, _, err = run_cli(capsys, "bench", "--concurrency", "1,2", "--autotune")
    assert code == 2 and "--autotune" in err
    code, _, err = run_cli(capsys, "bench", "--concurrency", "1", "--memory-budget", "-1")
    assert code == 2 and "--memory-budget" in err


def test_a_batch_the_memory_budget_cannot_hold_is_refused_before_loading(capsys, tiny_llama):
    capsys.readouterr()
    args = ("bench", "--target", tiny_llama, "--backend", "torch", "--dtype", "float32", "--drafter", "ngram")
    code, out, err = run_cli(capsys, *args, "--concurrency", "1,64", "--memory-budget", "0.01", "-c", "4096")
    assert code == 2 and "A batch of 64" in err and "keep B at" in err
    assert "Context" not in out  # nothing ran


def test_a_tiny_model_runs_a_two_point_sweep_end_to_end(capsys, tiny_llama, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "copy", "kind": "reuse", "messages": [{"role": "user", "content": "Repeat: a b c d e f"}]})
        + "\n"
    )
    out_json = tmp_path / "load.json"
    capsys.readouterr()
    code, out, err = run_cli(
        capsys,
        "bench",
        "--target",
        tiny_llama,
        "--backend",
        "torch",
        "--dtype",
        "float32",
        "--drafter",
        "ngram",
        "--prompts",
        str(prompts),
        "--concurrency",
        "2,1",
        "--k",
        "2",
        "--max-tokens",
        "8",
        "--warmup",
        "0",
        "--requests",
        "2",
        "--json",
        str(out_json),
    )
    assert code == 0, err
    sweep = LoadSweep.from_dict(json.loads(out_json.read_text()))
    assert sweep.batches == (1, 2) and sweep.modes == (VANILLA, "k=2", AUTO)
    assert all(p.tokens == 16 and p.aggregate_tps > 0 for p in sweep.points)  # 2 requests of 8 tokens each
    assert sweep.backend == "torch" and sweep.settings["batches"] == [1, 2]
    assert {b for b, _ in sweep.predicted} == {1, 2} and sweep.verify_curve
    assert sweep.failure_mode.endswith(".") and sweep.failure_mode in out
    assert "Break-even B (k=2" in out and "tok/s all" in out


def test_a_long_context_widens_each_sequences_window_as_far_as_the_model_allows(tiny_llama):
    from engine.bench.load_settings import LoadSettings
    from engine.cli.bench_load import window_for
    from engine.config import EngineConfig

    config = EngineConfig(target=tiny_llama, backend="torch", drafter="ngram", k_max=4)
    assert window_for(config, LoadSettings(contexts=(512,), max_tokens=64)) == 2048  # the default, held to 2048
    assert window_for(config, LoadSettings(contexts=(100_000,))) == 2048  # what the tiny model was trained for
