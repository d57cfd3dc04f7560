"""engine.preflight: a config checked from metadata only, every problem an error finding, never an exception."""

from __future__ import annotations

import pytest

from engine import EngineConfig, preflight

BASE = EngineConfig(target="default")  # the embedded GGUF file


def titles(config: EngineConfig) -> dict[str, str]:
    return {f.title: f.severity for f in preflight(config).findings}


def test_the_default_pair_is_compatible_and_says_why():
    result = preflight(BASE)
    assert result.compatible and result.report is None and result.warnings == 0
    assert titles(BASE)["N-gram lookup needs no draft model"] == "ok"


def test_a_draft_model_is_checked_by_the_pair_doctor():
    result = preflight(BASE.with_drafter("model", draft="default"))
    assert result.report is not None and result.report.compatible
    assert tuple(result.findings[: len(result.report.findings)]) == result.report.findings


@pytest.mark.parametrize(
    "config, title, severity",
    [
        (
            EngineConfig(target="default", backend="llama.cpp").with_drafter("eagle"),
            "EAGLE needs the PyTorch backend",
            "error",
        ),
        (BASE.with_drafter("early-exit"), "The target runs on PyTorch", "info"),  # auto loads the GGUF on PyTorch
        (BASE.with_drafter("lookahead", window=0), "Lookahead W is out of range", "error"),
        (BASE.with_drafter("early-exit", exit_layer="30"), "The exit layer is out of range", "error"),
        (BASE.with_drafter("eagle", tree_depth=0), "The tree depth must be 1 or more", "error"),
        (BASE.with_drafter("ngram", max_ngram=40), "N-gram length is out of range", "error"),
        (
            BASE.with_drafter("model", draft="default", backend="llama.cpp", dtype="bfloat16"),
            "The dtype does not apply to the draft model",
            "error",
        ),
        (BASE.with_drafter("model", draft="default", threads=0), "Draft threads is out of range", "error"),
        (EngineConfig(target="default", k=99), "The draft length cannot be used", "error"),
        (EngineConfig(target="default", threads=0), "These load options cannot work", "error"),
    ],
)
def test_each_rule_is_a_finding(config, title, severity):
    assert titles(config).get(title) == severity, titles(config)


@pytest.mark.parametrize(
    "config, title",
    [
        (EngineConfig(target="/nowhere/model.gguf"), "Cannot use the target"),
        (EngineConfig(target=" "), "No target chosen"),
        (EngineConfig(target="default", drafter="telepathy"), "Cannot use this drafter"),
        (BASE.with_drafter("model", draft="/nowhere/draft.gguf"), "Cannot use the draft model"),
        (
            EngineConfig(target="default", drafter="ngram", options=BASE.with_drafter("model", dtype="fp16").options),
            "Cannot use this drafter",
        ),
    ],
)
def test_what_cannot_be_used_is_one_error_and_no_exception(config, title):
    result = preflight(config)
    assert not result.compatible and [f.title for f in result.findings] == [title]


@pytest.mark.parametrize(
    "config",
    [BASE, BASE.with_drafter("model", draft="default"), EngineConfig(target="/nowhere/model.gguf")],
    ids=["no draft model", "a pair report", "one error"],
)
def test_a_preflight_travels_as_plain_json_and_comes_back_equal(config):
    import json

    from engine import Preflight

    result = preflight(config)
    data = json.loads(json.dumps(result.to_dict()))  # what the engine server sends
    back = Preflight.from_dict(data)

    assert back == result
    assert back.compatible == result.compatible and back.warnings == result.warnings
    if result.report is not None:  # the pair doctor's report, both models' metadata with it
        assert back.report.target.vocab == result.report.target.vocab and str(back.report) == str(result.report)
