"""A user who chooses no drafter gets the one measured fastest on the backend that runs.

docs/benchmarks.md: suffix decoding leads n-gram lookup on PyTorch on every prompt kind, and n-gram
lookup stays ahead on llama.cpp's open prompts. So a config, or a command line, that names no
drafter gets suffix decoding for a target on PyTorch and n-gram lookup on llama.cpp; a drafter
named, or saved, is kept.
"""

from __future__ import annotations

import json

import pytest

from engine.cli.common import engine_config
from engine.cli.main import build_parser
from engine.config import EngineConfig


@pytest.fixture
def folder(tmp_path) -> str:
    """A Hugging Face model folder as `resolve` finds one (backend auto runs it on PyTorch)."""
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return str(tmp_path / "tiny")


def test_a_config_without_a_drafter_gets_the_fastest_for_the_backend_that_runs(folder):
    assert EngineConfig().drafter == "ngram"  # the embedded GGUF model runs on llama.cpp
    assert EngineConfig(backend="torch").drafter == "suffix"  # the same file, dequantized on PyTorch
    assert EngineConfig(target=folder).drafter == "suffix"  # a model folder runs on PyTorch
    assert EngineConfig(target=folder, backend="llama.cpp").drafter == "ngram"
    assert EngineConfig(target="/nowhere/model.gguf").drafter == "ngram"  # the load says what is missing


def test_a_chosen_or_saved_drafter_is_kept(folder):
    assert EngineConfig(target=folder, drafter="ngram").drafter == "ngram"
    assert EngineConfig(backend="torch").with_drafter("medusa").drafter == "medusa"
    saved = EngineConfig(target=folder, drafter="ngram").to_dict()
    assert EngineConfig.from_dict(json.loads(json.dumps(saved))).drafter == "ngram"


def test_the_cli_picks_the_default_for_the_backend_and_says_so(folder, capsys, monkeypatch):
    parser = build_parser()

    def drafter(*flags: str) -> str:
        return engine_config(parser.parse_args(["generate", "--prompt", "hi", *flags])).drafter

    assert drafter() == "ngram"
    assert drafter("--backend", "torch") == "suffix"
    assert drafter("--target", folder) == "suffix"
    assert drafter("--target", folder, "--drafter", "ngram") == "ngram"  # a choice is kept
    assert drafter("--heads", "/my/heads") == "medusa"  # --heads still implies Medusa heads
    monkeypatch.setenv("COLUMNS", "2000")
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--help"])
    help_text = capsys.readouterr().out
    assert "default: the one measured fastest on the backend that runs, ngram on llama.cpp and suffix on torch" in (
        help_text
    )
