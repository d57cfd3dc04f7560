"""specdeck-cli when something goes wrong: tiny context windows."""

from __future__ import annotations

import json

import pytest

from engine.cli import main


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# -- small context windows -------------------------------------------------------------


# One llama.cpp thread: the tests share their cores, and llama.cpp's threads spin while waiting.
TINY = ("--target", "default", "--threads", "1")


@pytest.mark.parametrize("n_ctx", [16, 32, 64])
def test_a_small_context_window_loads_and_generates(capsys, n_ctx):
    """The verify-cost measurement at load used to need 65 tokens of room."""
    code, out, err = run_cli(
        capsys, "generate", *TINY, "--n-ctx", str(n_ctx), "--raw", "--prompt", "Once upon a time",
        "--max-tokens", "6", "--drafter", "none", "--json",
    )  # fmt: skip
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
