"""specdeck-cli as a user runs it: the README command, JSON output, errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

from engine.cli.main import main

README_PROMPT = (
    "Copy this paragraph exactly, word for word: Speculative decoding lets a small draft model propose "
    "several tokens that a large target model then checks in a single forward pass. Every accepted token "
    "saves one full pass of the large model, and the output is exactly what the target alone would have written."
)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_compare_json_reports_what_the_issue_lists(capsys):
    code, out, _ = run_cli(
        capsys,
        "generate",
        "--target",
        "default",
        "--drafter",
        "ngram",
        "--prompt",
        README_PROMPT,
        "--compare",
        "--json",
        "--max-tokens",
        "40",
    )
    assert code == 0
    report = json.loads(out)
    assert report["text"] and report["tokens"]
    for key in ("steps", "drafted", "accepted", "acceptance_rate", "tokens_per_step", "tokens_per_s", "wall_s"):
        assert key in report["stats"] and key in report["vanilla"]["stats"]
    assert report["speedup"] > 0
    if report["identical"]:
        assert report["tokens"] == report["vanilla"]["tokens"]
    else:
        divergence = report["first_divergence"]
        assert divergence["explained"], divergence
        assert set(divergence) >= {"index", "speculative_token", "vanilla_token", "explained"}


def test_generate_streams_text_to_stdout_and_stats_to_stderr(capsys, tmp_path):
    messages = tmp_path / "chat.json"
    messages.write_text(json.dumps([{"role": "user", "content": "Say hello."}]))
    code, out, err = run_cli(capsys, "generate", "--messages", str(messages), "--max-tokens", "12", "--k", "3")
    assert code == 0
    assert out.strip()
    assert "tok/s" in err and "acceptance" in err


def test_errors_are_one_clear_line_and_exit_2(capsys, tmp_path):
    code, out, err = run_cli(capsys, "generate", "--target", str(tmp_path / "missing.gguf"), "--prompt", "hi")
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "Traceback" not in err
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--k", "40")
    assert code == 2 and "between 0 and 32" in err


def test_doctor_on_the_default_pair(capsys):
    code, out, _ = run_cli(capsys, "doctor", "--target", "default", "--draft", "default", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["compatible"] is True


def test_doctor_checks_the_gpu_llama_cpp_offloads_to(capsys, monkeypatch):
    from engine.backends import gpu_layers
    from engine.models import doctor, placement

    monkeypatch.setattr(gpu_layers, "llama_cpp_offloads", lambda: True)
    monkeypatch.setattr(placement, "_offload_device", lambda: "cuda:0")
    monkeypatch.setattr(doctor, "device_memory", lambda device: (100 * 2**20, 16 * 2**30))
    code, out, _ = run_cli(capsys, "doctor", "--target", "default", "--draft", "default", "--json")
    findings = {f["title"]: f for f in json.loads(out)["findings"]}  # auto: offload is opt-in
    assert findings["Layers on the GPU (llama.cpp)"]["detail"].startswith("Target: on the CPU: GPU offload is opt-in")
    assert "on cuda:0" not in out
    code, out, _ = run_cli(capsys, "doctor", "--target", "default", "--draft", "default", "-ngl", "all", "--json")
    findings = {f["title"]: f for f in json.loads(out)["findings"]}
    assert code == 0 and findings["Layers on the GPU (llama.cpp)"]["detail"].startswith("Target: all 30 layers")
    assert findings["May not fit in memory (GPU)"]["severity"] == "warning"
    assert "100 MiB of 16.0 GiB free on cuda:0" in findings["May not fit in memory (GPU)"]["detail"]
    code, out, _ = run_cli(capsys, "doctor", "--target", "default", "--draft", "default", "-ngl", "0", "--json")
    assert "on cuda:0" not in out  # no layer on the GPU: system RAM is the check
    code, _, err = run_cli(capsys, "doctor", "--target", "default", "--draft", "default", "--gpu-layers", "lots")
    assert code == 2 and "--gpu-layers lots" in err


def test_models_lists_the_embedded_model(capsys):
    code, out, _ = run_cli(capsys, "models", "--json")
    assert code == 0
    assert any(m["source"] == "embedded" for m in json.loads(out))


def test_console_script_is_installed():
    """The README's command line works as a real process (the console script entry point)."""
    exe = shutil.which("specdeck-cli")
    assert exe, "specdeck-cli is not on PATH: run the install command from README.md"
    done = subprocess.run(
        [exe, "generate", "--prompt", "Hi", "--max-tokens", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stats"]["steps"] >= 1


def test_generate_says_on_stderr_what_it_loads_and_how_long_it_took(capsys):
    code, out, err = run_cli(capsys, "generate", "--prompt", "Say hello.", "--max-tokens", "4", "--json")
    assert code == 0
    assert json.loads(out)["text"]  # stdout is the JSON object alone
    first = err.splitlines()[0]
    assert re.fullmatch(r"loading SmolLM2-135M-Instruct\S* \(llama\.cpp\)… \d+\.\d s", first), first
    assert "loading" not in out


def test_compile_on_runs_the_static_forward_and_says_so(capsys, tmp_path):
    from tests.factories.hf_models import make_tiny_llama

    folder = make_tiny_llama(tmp_path / "tiny", seed=0)
    capsys.readouterr()  # the factory's own progress bars
    texts = {}
    for choice in ("off", "on"):
        code, out, err = run_cli(
            capsys,
            "generate",
            "--target",
            folder,
            "--compile",
            choice,
            "--prompt",
            "Say hello.",
            "--max-tokens",
            "12",
            "--json",
        )
        assert code == 0, err
        texts[choice] = json.loads(out)["text"]
        line = next(line for line in err.splitlines() if line.startswith("loading "))  # after transformers' bars
        said = "static shapes" if choice == "on" else "eager"
        assert re.fullmatch(rf"loading tiny \(torch\)… \d+\.\d s, native forward, {said}.*", line), line
    assert texts["on"] == texts["off"]  # greedy: the same reply on either path
    code, _, err = run_cli(capsys, "generate", "--compile", "on", "--prompt", "hi")  # the embedded GGUF: llama.cpp
    assert code == 2 and "--compile on" in err and "--backend torch" in err
