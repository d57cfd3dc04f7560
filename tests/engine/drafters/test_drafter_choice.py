"""Choosing the training-free drafters by name: the engine config, the CLI, the backend they need."""

from __future__ import annotations

import json

import pytest

from engine.api import Engine, EngineConfig, target_backend
from engine.backends.hf.backend import TorchBackend
from engine.core.draft_length import CostModel
from engine.errors import ConfigError
from tests.engine.drafters.build import make_drafter
from tests.factories.hf_models import make_tiny_llama

PROMPT = "Repeat after me, word for word: the early bird catches the worm, the early bird catches the worm."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("choice") / "tiny", seed=0, n_layers=4)


@pytest.mark.parametrize("kind", ["early-exit", "eagle", "medusa"])
def test_drafters_that_need_pytorch_load_the_target_there_by_default(kind):
    assert target_backend(EngineConfig(target="default", drafter=kind)) == "torch"
    assert target_backend(EngineConfig(target="default", drafter=kind, backend="llama.cpp")) == "llama.cpp"


def test_lookahead_leaves_the_backend_as_asked_since_llama_cpp_runs_it_too():
    assert target_backend(EngineConfig(target="default", drafter="lookahead")) == "auto"


def test_the_engine_hands_its_cost_model_to_drafters_that_size_themselves(tiny):
    backend = TorchBackend(tiny, dtype="float32")
    try:
        costs = CostModel()
        for kind, options in (
            ("lookahead", {"window": 2, "ngram": 3, "candidates": 2}),
            ("early-exit", {"exit_layer": 2}),
        ):
            drafter = make_drafter(kind, backend, **options)
            engine = Engine(backend, drafter, EngineConfig(drafter=kind, k=6), costs)
            assert engine.drafter.costs is costs
            comparison = engine.compare(engine.prompt_ids(PROMPT), _greedy())
            assert comparison.identical, comparison.divergence
            assert comparison.speculative.stats.drafted > 0
        assert make_drafter("lookahead", backend, window=2, ngram=3, candidates=2).parameters == (2, 3, 2)
        assert make_drafter("early-exit", backend, exit_layer=3).exit_layer == 3
    finally:
        backend.close()


def _greedy():
    from engine.core.sampling import SamplingConfig

    return SamplingConfig(max_tokens=24)


@pytest.mark.parametrize(
    "flags, stat",
    [
        (["--drafter", "lookahead", "--window", "2", "--ngram", "3", "--candidates", "2", "--k", "6"], "drafted"),
        (["--drafter", "early-exit", "--exit-layer", "2", "--k", "3"], "drafted"),
    ],
    ids=["lookahead", "early-exit"],
)
def test_cli_runs_the_training_free_drafters(tiny, capsys, flags, stat):
    from engine.cli.main import main

    code = main(
        [
            "generate",
            "--target",
            tiny,
            *flags,
            "--dtype",
            "float32",
            "--prompt",
            PROMPT,
            "--max-tokens",
            "16",
            "--compare",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["identical"] and report["stats"][stat] > 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--drafter", "early-exit", "--exit-layer", "4"], "layer"),
        (["--drafter", "lookahead", "--window", "0"], "window"),
        (["--drafter", "lookahead", "--heads", "x"], "drop one of them"),
    ],
    ids=["exit-layer-too-deep", "window-zero", "heads-with-lookahead"],
)
def test_cli_bad_drafter_settings_are_one_clear_line(tiny, capsys, flags, message):
    from engine.cli.main import main

    code = main(["generate", "--target", tiny, *flags, "--dtype", "float32", "--prompt", "hi", "--max-tokens", "4"])
    _, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # (after any loading bars)
    assert code == 2 and len(errors) == 1 and message in errors[0].lower()


def test_early_exit_on_llama_cpp_says_to_use_pytorch_and_lookahead_runs_there(default_llama):
    with pytest.raises(ConfigError, match="(?i)pytorch|torch"):
        make_drafter("early-exit", default_llama)
    assert make_drafter("lookahead", default_llama, window=2, ngram=3, candidates=2).parameters == (2, 3, 2)
