"""specdeck-cli when something goes wrong: tiny context windows,
numbers out of range, bad messages files, replies cut by the context window."""

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
    [("--temperature", "inf", "finite positive"), ("--temperature", "nan", "finite positive"),
     ("--temperature", "-1", "finite positive"), ("--top-p", "nan", "(0, 1]"), ("--top-p", "inf", "(0, 1]"),
     ("--top-p", "0", "(0, 1]"), ("--top-p", "1.5", "(0, 1]")],
)  # fmt: skip
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
    [('[{"role": "wizard", "content": "hi"}]', "role 'wizard'; the roles are system, user, assistant"),
     ('[{"role": "tool", "content": "21 C"}]', "role 'tool'; the roles are"),
     ('[{"role": "user", "content": ["hi"]}]', "content of message 1 must be text"),
     ('[{"role": "user", "content": "hi"}, {"content": "no role"}]', "message 2 is not a"),
     ("[]", "non-empty list"), ('{"role": "user"}', "non-empty list"), ("[{", "is not a JSON messages file")],
)  # fmt: skip
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
    messages.write_text(json.dumps([
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks!"},
    ]))  # fmt: skip
    code, out, err = run_cli(capsys, "generate", *TINY, "--messages", str(messages), "--max-tokens", "4", "--json")
    assert code == 0, err
    assert json.loads(out)["tokens"]
