"""The drafter registry: one list, found by scanning engine.drafters; a drafter from one new module
shows in the CLI, in preflight and in the engine with no other file changed; the config round trip."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from engine.config import CONFIG_VERSION, EngineConfig, from_legacy
from engine.drafters.registry import (
    DrafterStats,
    all_drafters,
    default_drafter,
    drafter_names,
    drafter_spec,
    option_settings,
    stat_fields,
)
from engine.errors import ConfigError
from tests.engine.drafters.build import toy_drafter
from tests.factories.hf_models import make_tiny_llama

PROMPT = "Say it again and again: la la la la la la la la la la la la."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("registry") / "tiny", seed=0, n_layers=2)


BUILT_IN = (
    "none",
    "ngram",
    "suffix",
    "model",
    "medusa",
    "eagle",
    "eagle3",
    "mtp",
    "assistant",
    "lookahead",
    "early-exit",
)


def test_the_built_in_drafters_come_in_their_order_and_load_no_torch():
    # The order is each spec's own (`order`): the CLI's choices, the pair dialog and auto-tune list them so.
    assert tuple(spec.name for spec in all_drafters()) == BUILT_IN
    code = (
        "import sys, engine; engine.all_drafters(); engine.option_settings('eagle'); engine.EngineConfig(); "
        "import engine.preflight; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_drafter_describes_its_options_and_statistics():
    for spec in all_drafters():
        assert spec.label and spec.summary.endswith(".")
        for s in option_settings(spec):
            assert s.label and s.help and s.flags[-1].startswith("--"), (spec.name, s)
        assert issubclass(spec.stats, DrafterStats)
        assert all(f.label for f in stat_fields(spec.stats)), spec.name
        assert bool(spec.needs) == (
            spec.name in ("medusa", "eagle", "eagle3", "mtp", "assistant", "lookahead", "early-exit")
        )


def test_the_default_drafter_is_the_one_measured_fastest_on_the_backend_that_runs():
    # docs/benchmarks.md: suffix decoding leads n-gram lookup on PyTorch on every prompt kind; n-gram
    # lookup stays ahead on llama.cpp's open prompts.
    assert (default_drafter("torch"), default_drafter("llama.cpp")) == ("suffix", "ngram")
    assert default_drafter("some-new-backend") == "ngram"


def test_an_unknown_drafter_names_the_known_ones():
    with pytest.raises(ConfigError, match="none, ngram, suffix, model"):
        drafter_spec("telepathy")


# -- a toy drafter from one new module ------------------------------------------------------------


def test_a_new_module_is_a_choice_and_flags_of_the_cli(capsys):
    from engine.cli.main import main

    with toy_drafter():
        assert [spec.name for spec in all_drafters()][-1] == "repeat"  # after the built-ins
        with pytest.raises(SystemExit):
            main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "early-exit, repeat, or a chain of them" in out
    assert "--copies COPIES" in out and "repeat: times the last token is proposed" in out
    assert "repeat" not in [spec.name for spec in all_drafters()]  # gone with its module


def test_a_new_module_has_its_preflight_rule():
    from engine.preflight import preflight

    with toy_drafter():
        config = EngineConfig().with_drafter("repeat", copies=3)
        result = preflight(config)
        too_many = preflight(config.with_drafter("repeat", copies=20))
    titles = {f.title: f for f in result.findings}
    assert result.compatible and "3 times" in titles["The repeat drafter needs nothing"].detail
    assert not too_many.compatible
    assert any("at most 8" in f.detail for f in too_many.errors)


def test_a_new_module_drafts_through_the_engine_and_the_cli(tiny, capsys):
    from engine.api import Engine
    from engine.cli.main import main
    from engine.core.sampling import SamplingConfig

    with toy_drafter():
        engine = Engine.load(
            EngineConfig(target=tiny, dtype="float32", k=2, measure_costs=False).with_drafter("repeat", copies=2)
        )
        try:
            comparison = engine.compare(engine.prompt_ids(PROMPT), SamplingConfig(max_tokens=16))
            assert comparison.identical
            assert comparison.speculative.stats.drafted > 0
            assert engine.drafter.stats().proposals > 0
        finally:
            engine.close()
        code = main(
            [
                "generate",
                "--target",
                tiny,
                "--drafter",
                "repeat",
                "--copies",
                "3",
                "--k",
                "3",
                "--dtype",
                "float32",
                "--prompt",
                PROMPT,
                "--max-tokens",
                "8",
                "--json",
            ]
        )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["stats"]["drafted"] > 0


# -- one configuration -----------------------------------------------------------------------


@pytest.mark.parametrize("name", drafter_names())
def test_every_drafters_config_goes_to_plain_data_and_back(name):
    config = EngineConfig(target="t.gguf", n_ctx=2048, k=5).with_drafter(name)
    data = json.loads(json.dumps(config.to_dict()))
    assert data["version"] == CONFIG_VERSION and data["drafter"] == name
    assert EngineConfig.from_dict(data) == config


def test_changed_options_go_to_plain_data_and_back():
    config = EngineConfig(compile="on").with_drafter("lookahead", window=7, candidates=5)
    assert config.to_dict()["compile"] == "on"
    assert config.to_dict()["options"] == {"window": 7, "ngram": "auto", "candidates": 5}
    assert EngineConfig.from_dict(config.to_dict()) == config
    assert config.with_drafter("lookahead", ngram=3).drafter_options().window == 7  # keeps the others
    assert EngineConfig() == EngineConfig(options=drafter_spec("ngram").options())  # None: the defaults


@pytest.mark.parametrize(
    "change, says",
    [
        ({"drafter": "telepathy"}, "'telepathy'"),
        ({"k_max": "many"}, "k_max"),
        ({"options": {"window": [1]}}, "window"),
        ({"options": {"depth": 3}}, "'depth'"),
        ({"version": CONFIG_VERSION + 1}, "newer"),
        ({"version": None}, "version"),
        ({"colour": "red"}, "'colour'"),
        ({"compile": "fast"}, "compile.*auto, off, on"),
        ({"compile": True}, "compile"),
    ],
)
def test_bad_saved_data_names_the_field(change, says):
    data = {**EngineConfig().with_drafter("lookahead").to_dict(), **change}
    with pytest.raises(ConfigError, match=says):
        EngineConfig.from_dict(data)


def test_construction_keeps_what_was_typed_and_make_refuses_it():
    config = EngineConfig().with_drafter("early-exit", exit_layer="0")  # what the app keeps, as typed
    assert config.drafter_options().exit_layer == "0"
    with pytest.raises(ConfigError, match="ngram_max"):
        config.with_drafter("lookahead", ngram_max=3)


def test_the_flat_fields_of_before_become_the_drafters_options():
    assert from_legacy(
        {"draft": "d.gguf", "drafter": "ngram", "draft_backend": "llama.cpp"}
    ) == EngineConfig().with_drafter("model", draft="d.gguf", backend="llama.cpp")  # draft= meant "model"
    assert from_legacy(
        {"drafter": "lookahead", "lookahead": [2, "auto", 4], "heads": "h"}
    ) == EngineConfig().with_drafter("lookahead", window=2, candidates=4)  # another drafter's field is dropped
    assert from_legacy(
        {"drafter": "eagle", "heads": "h", "tree_depth": None, "k": 6}
    ).drafter_options() == drafter_spec("eagle").options(heads="h")
    stray = from_legacy({"drafter": "ngram", "draft_dtype": "bfloat16"})
    with pytest.raises(ConfigError, match="--draft-dtype sets up a draft model"):
        stray.drafter_options()
    assert dataclasses.replace(EngineConfig(), drafter="eagle").drafter_options() == drafter_spec("eagle").options()


@pytest.mark.parametrize("command", ["generate", "chat", "bench"])
def test_every_drafter_option_is_a_flag_of_every_command(command):
    from engine.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    flags = {flag for action in sub._actions for flag in action.option_strings}
    for spec in all_drafters():
        for s in option_settings(spec):
            assert set(s.flags) <= flags, (command, spec.name, s.flags)
    args = parser.parse_args([command, "--drafter", "lookahead", "--window", "3", "--ngram", "auto"])
    from engine.cli.options import drafter_choice

    assert drafter_choice(args) == ("lookahead", drafter_spec("lookahead").options(window=3))
