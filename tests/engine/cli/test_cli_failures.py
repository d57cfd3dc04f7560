"""specdeck-cli when something goes wrong: Ctrl+C at any moment, tiny context windows,
numbers out of range, bad messages files, replies cut by the context window."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli.main import main

STORY = "Write a long story about a cat who learns to sail."


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# -- Ctrl+C --------------------------------------------------------------------------


def _cli_program() -> str:
    """The installed console script itself (a pyenv shim in front of it is a shell script)."""
    beside = Path(sys.executable).with_name("specdeck-cli")
    exe = str(beside) if beside.is_file() else shutil.which("specdeck-cli")
    assert exe, "specdeck-cli is not installed: run the install command from README.md"
    return exe


# The moments to interrupt at. Fixed delays, and moments seen from outside in the child's
# memory map (Linux): a library or file that appears there is being imported or loaded right
# now, however slow the machine is. Before Python reaches specdeck's first line (the
# interpreter and site-packages, 50-150 ms) no program can catch Ctrl+C, so the earliest
# moment here is the start of torch's import.
TORCH = ("libtorch_cpu", 0.0)
TORCH_LATER = ("libtorch_cpu", 0.05)
LLAMA_CPP = ("libllama", 0.0)
MODEL_FILE = ("SmolLM2-135M-Instruct.Q4_1.gguf", 0.0)  # llama.cpp maps the model as it loads it


def _wait_for_mapping(pid: int, name: str, timeout: float = 120.0) -> bool:
    maps = Path(f"/proc/{pid}/maps")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if name in maps.read_text(errors="replace"):
                return True
        except OSError:  # the process has ended
            return False
        time.sleep(0.003)
    return False


def interrupt(args: list[str], at, tmp_path: Path) -> tuple[int, bytes, str]:
    """Start specdeck-cli, send SIGINT at a moment (seconds after the start, a (mapping, delay)
    pair, or "first output": once stdout has its first byte), return (status, stdout, stderr)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    child = subprocess.Popen([_cli_program(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        first = b""
        if at == "first output":
            first = child.stdout.read(1)
            assert first, "the command ended before writing anything"
        elif isinstance(at, tuple):
            if Path("/proc/self/maps").exists():
                assert _wait_for_mapping(child.pid, at[0]), f"{at[0]} never loaded"
            else:  # no /proc: about when torch starts importing
                time.sleep(0.3)
            time.sleep(at[1])
        else:
            time.sleep(at)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    return child.returncode, first + out, err.decode(errors="replace")


def assert_cancelled_cleanly(code: int, err: str, moment) -> None:
    assert code == 130, f"at {moment}: exit status {code}, stderr:\n{err}"
    assert "Traceback" not in err and "terminate called" not in err and "Exception ignored" not in err, err
    assert err.strip().splitlines()[-1] == "cancelled", f"at {moment}: stderr ends with\n{err[-500:]}"


def test_ctrl_c_at_any_moment_of_generate_exits_130_with_one_line(tmp_path):
    args = ["generate", "--target", "default", "--prompt", STORY, "--max-tokens", "400"]
    # The early moments several times: which import is under way differs from run to run.
    moments = (TORCH, TORCH, TORCH, TORCH_LATER, 0.3, 0.3, 1.0, LLAMA_CPP, LLAMA_CPP, MODEL_FILE, MODEL_FILE)
    for at in moments:
        code, _, err = interrupt(args, at, tmp_path)
        assert_cancelled_cleanly(code, err, at)
    code, out, err = interrupt(args, "first output", tmp_path)  # decoding
    assert_cancelled_cleanly(code, err, "the first streamed text")
    assert out.decode(errors="replace").strip(), "the text streamed before Ctrl+C is lost"


def test_ctrl_c_never_leaves_half_a_json_object(tmp_path):
    args = ["generate", "--target", "default", "--prompt", STORY, "--max-tokens", "300", "--json"]
    for at in (TORCH_LATER, MODEL_FILE, 3.0):  # the last one while decoding, on most machines
        code, out, err = interrupt(args, at, tmp_path)
        if code == 0:  # finished before the interrupt arrived: then the whole object is there
            json.loads(out)
            continue
        assert_cancelled_cleanly(code, err, at)
        assert out == b"" or json.loads(out), out[-200:]


def test_ctrl_c_during_bench_and_train_heads_setup(tmp_path):
    bench = ["bench", "--target", "default", "--max-tokens", "8", "--repeat", "1", "--warmup", "0", "--kinds", "reuse"]
    for at in (TORCH, LLAMA_CPP, 1.5):
        code, _, err = interrupt(bench, at, tmp_path)
        assert_cancelled_cleanly(code, err, f"bench, {at}")
    for n, at in enumerate((TORCH, TORCH_LATER)):
        train = [
            "train-heads",
            "--target",
            "default",
            "--data",
            "builtin",
            "--out",
            str(tmp_path / f"heads{n}"),
            "--steps",
            "2",
            "--cache-tokens",
            "256",
            "--seq-len",
            "32",
            "--batch-size",
            "2",
        ]
        code, _, err = interrupt(train, at, tmp_path)
        # Still importing: "cancelled". Already training: it stops after the step, keeps a checkpoint
        # and says "cancelled at step ..."; either way status 130 and no traceback.
        assert code == 130, err
        assert "Traceback" not in err and "terminate called" not in err, err
        assert err.strip().splitlines()[-1].startswith("cancelled"), err[-500:]


# -- small context windows -------------------------------------------------------------


# One llama.cpp thread: the tests share their cores, and llama.cpp's threads spin while waiting.
TINY = ("--target", "default", "--threads", "1")


@pytest.mark.parametrize("n_ctx", [16, 32, 64])
def test_a_small_context_window_loads_and_generates(capsys, n_ctx):
    """The verify-cost measurement at load used to need 65 tokens of room."""
    code, out, err = run_cli(
        capsys,
        "generate",
        *TINY,
        "--n-ctx",
        str(n_ctx),
        "--raw",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "6",
        "--drafter",
        "none",
        "--json",
    )
    assert "are in use" not in err
    assert code == 0, err
    report = json.loads(out)
    assert len(report["tokens"]) == 6 and report["stats"]["finish_reason"] == "length"
    assert not any("context window" in note for note in report["stats"]["notes"])  # not cut: no note


def test_a_chat_prompt_longer_than_a_small_window_says_so(capsys):
    code, _, err = run_cli(capsys, "generate", *TINY, "--n-ctx", "16", "--prompt", "Hello there")
    assert code == 2
    assert "are in use" not in err
    assert "the context window holds 16" in err and "larger context" in err


def test_a_reply_cut_by_the_context_window_gets_a_note_in_plain_mode_too(capsys):
    cut = ["generate", *TINY, "--n-ctx", "32", "--raw", "--prompt", "Once upon a time", "--max-tokens", "100"]
    code, out, err = run_cli(capsys, *cut, "--drafter", "none")
    assert code == 0, err
    assert "note: the reply was cut: the context window (32 tokens" in err and "--n-ctx" in err
    for drafter in ("none", "ngram"):
        code, out, _ = run_cli(capsys, *cut, "--drafter", drafter, "--json")
        stats = json.loads(out)["stats"]
        assert stats["finish_reason"] == "context"
        assert any("context window (32 tokens" in note for note in stats["notes"]), (drafter, stats["notes"])


# -- numbers and messages, checked before anything loads -------------------------------------


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--temperature", "inf", "finite positive"),
        ("--temperature", "nan", "finite positive"),
        ("--temperature", "-1", "finite positive"),
        ("--top-p", "nan", "(0, 1]"),
        ("--top-p", "inf", "(0, 1]"),
        ("--top-p", "0", "(0, 1]"),
        ("--top-p", "1.5", "(0, 1]"),
    ],
)
def test_sampling_numbers_out_of_range_are_refused_before_loading(capsys, tmp_path, option, value, says):
    missing = str(tmp_path / "missing.gguf")  # would be reported if the model were loaded first
    code, out, err = run_cli(capsys, "generate", "--target", missing, "--prompt", "hi", option, value)
    assert code == 2 and out == ""
    assert says in err and "missing.gguf" not in err, err


def test_train_heads_refuses_non_finite_numbers(capsys, tmp_path):
    out_dir = str(tmp_path / "heads")
    code, _, err = run_cli(capsys, "train-heads", "--out", out_dir, "--lr", "inf")
    assert code == 2 and "--lr must be a finite positive number" in err
    code, _, err = run_cli(capsys, "train-heads", "--out", out_dir, "--gen-temperature", "nan")
    assert code == 2 and "--gen-temperature" in err
    assert not (tmp_path / "heads").exists()


@pytest.mark.parametrize(
    "content, says",
    [
        ('[{"role": "wizard", "content": "hi"}]', "role 'wizard'; the roles are system, user, assistant"),
        ('[{"role": "tool", "content": "21 C"}]', "role 'tool'; the roles are"),
        ('[{"role": "user", "content": ["hi"]}]', "content of message 1 must be text"),
        ('[{"role": "user", "content": "hi"}, {"content": "no role"}]', "message 2 is not a"),
        ("[]", "non-empty list"),
        ('{"role": "user"}', "non-empty list"),
        ("[{", "is not a JSON messages file"),
    ],
)
def test_a_bad_messages_file_is_reported_before_the_model(capsys, tmp_path, content, says):
    messages = tmp_path / "chat.json"
    messages.write_text(content)
    missing = str(tmp_path / "missing.gguf")  # the messages error must come first
    code, out, err = run_cli(capsys, "generate", "--target", missing, "--messages", str(messages))
    assert code == 2 and out == ""
    assert says in err and "missing.gguf" not in err, err
    assert err.startswith("error: ") and "chat.json" in err


def test_every_known_role_is_accepted(capsys, tmp_path):
    messages = tmp_path / "chat.json"
    messages.write_text(
        json.dumps(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "Thanks!"},
            ]
        )
    )
    code, out, err = run_cli(capsys, "generate", *TINY, "--messages", str(messages), "--max-tokens", "4", "--json")
    assert code == 0, err
    assert json.loads(out)["tokens"]
