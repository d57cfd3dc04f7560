"""The target's load options and the draft model's are separate, and checked before anything loads."""

from __future__ import annotations

import pytest

from engine import api as session
from engine.api import Engine
from engine.cli.main import main
from engine.errors import ConfigError
from engine.models import loading
from tests.engine.drafters.build import legacy_config as EngineConfig
from tests.factories.fake import MarkovBackend, random_transition

QUANTIZED_SELF_DRAFT = dict(target="default", backend="torch", draft="default", draft_backend="llama.cpp")


@pytest.fixture
def loads(monkeypatch):
    """What Engine.load asks to load, with fakes in place of the models: [(what, spec, options)]."""
    calls = []

    def load_backend(spec, **options):
        calls.append(("target", spec, options))
        return MarkovBackend(random_transition(4, seed=0))

    def load_draft(spec, *, backend="auto", progress=None, **options):
        calls.append(("draft", spec, {"backend": backend, **options}))
        raise _Loaded  # the options are what the test reads: no draft model is made

    monkeypatch.setattr(session, "load_backend", load_backend)
    monkeypatch.setattr(loading, "load_backend", load_draft)  # the model drafter's load (model_spec.make)
    monkeypatch.setattr(loading, "refuse_incompatible_pair", lambda target, draft: None)
    return calls


class _Loaded(Exception):
    pass


@pytest.fixture(autouse=True)
def _draft_loads_stop_the_load(monkeypatch):
    """Engine.load ends after the draft's load options were recorded (no draft model is made)."""
    load = session.Engine.load.__func__

    def load_until_the_draft(cls, config, progress=None):
        try:
            return load(cls, config, progress)
        except _Loaded:
            return None

    monkeypatch.setattr(session.Engine, "load", classmethod(load_until_the_draft))


def test_a_llama_cpp_draft_does_not_inherit_the_targets_torch_dtype(loads):
    """--dtype bfloat16 on a PyTorch target used to reach the llama.cpp draft too, which then
    refused it after the target had loaded."""
    Engine.load(EngineConfig(**QUANTIZED_SELF_DRAFT, dtype="bfloat16", threads=2, measure_costs=False))
    (_, _, target), (_, _, draft) = loads
    assert target["dtype"] == "bfloat16" and target["backend"] == "torch"
    assert draft["dtype"] == "auto" and draft["backend"] == "llama.cpp"
    assert draft["threads"] == 2  # what does apply to a llama.cpp draft still follows the target


def test_draft_options_are_the_drafts_own(loads):
    config = EngineConfig(
        target="default",
        backend="torch",
        draft="default",
        draft_backend="torch",
        dtype="float32",
        draft_dtype="bfloat16",
        draft_threads=1,
        draft_gpu_layers=3,
        measure_costs=False,
    )
    Engine.load(config)
    (_, _, target), (_, _, draft) = loads
    assert target["dtype"] == "float32" and draft["dtype"] == "bfloat16"
    assert (draft["threads"], draft["gpu_layers"]) == (1, 3) and (target["threads"], target["gpu_layers"]) == (
        None,
        "auto",
    )


def test_a_torch_draft_follows_the_targets_dtype_unless_told_otherwise(loads):
    Engine.load(
        EngineConfig(
            target="default",
            backend="torch",
            draft="default",
            draft_backend="torch",
            dtype="float32",
            measure_costs=False,
        )
    )
    assert loads[1][2]["dtype"] == "float32"


@pytest.mark.parametrize(
    "options, says",
    [
        (
            dict(QUANTIZED_SELF_DRAFT, draft_dtype="bfloat16"),
            "--draft-dtype bfloat16: the draft model runs on llama.cpp",
        ),
        (dict(QUANTIZED_SELF_DRAFT, draft_dtype="fp8"), "--draft-dtype fp8: unknown dtype"),
        (dict(QUANTIZED_SELF_DRAFT, draft_threads=0), "--draft-threads 0"),
        (dict(QUANTIZED_SELF_DRAFT, threads=-1), "--threads -1"),
        (
            dict(target="default", backend="llama.cpp", dtype="bfloat16"),
            "--dtype bfloat16: the target runs on llama.cpp",
        ),
        (dict(target="default", drafter="ngram", draft_dtype="bfloat16"), "--draft-dtype sets up a draft model"),
        (dict(target="default", gpu_layers="lots"), "--gpu-layers lots: give auto"),
        (dict(target="default", gpu_layers=-2), "--gpu-layers -2: give auto"),
        (dict(QUANTIZED_SELF_DRAFT, draft_gpu_layers="lots"), "--draft-gpu-layers lots: give auto"),
    ],
)
def test_options_that_cannot_work_are_refused_before_anything_loads(loads, options, says):
    with pytest.raises(ConfigError, match=says):
        Engine.load(EngineConfig(**options))
    assert loads == []


def test_the_cli_passes_draft_options_and_names_the_bad_one(loads, capsys):
    args = [
        "generate",
        "--target",
        "default",
        "--backend",
        "torch",
        "--dtype",
        "bfloat16",
        "--draft",
        "default",
        "--draft-backend",
        "llama.cpp",
        "--draft-dtype",
        "float16",
        "--prompt",
        "hi",
    ]
    assert main(args) == 2
    assert "--draft-dtype float16" in capsys.readouterr().err
    assert loads == []
