"""A model folder whose architecture the installed transformers cannot build is said before loading:
by the doctor, the preflight (the pair dialog's check) and `specdeck-cli doctor`."""

from __future__ import annotations

import json

import pytest

from engine.models.doctor import check_model, check_pair
from tests.engine.models.test_models import write_hf_folder


def with_config(folder, **changes):
    config_path = folder / "config.json"
    config = {**json.loads(config_path.read_text()), **changes}
    config_path.write_text(json.dumps(config))
    return folder


@pytest.fixture
def unknown(tmp_path):
    return with_config(
        write_hf_folder(tmp_path / "unknown"), model_type="nosuchmodel", architectures=["NoSuchForCausalLM"]
    )


def errors(findings):
    return [f for f in findings if f.severity == "error"]


def test_an_unknown_architecture_is_an_error_that_names_it_and_says_what_to_do(unknown, tmp_path):
    known = write_hf_folder(tmp_path / "known")
    report = check_pair(str(unknown), str(known))
    assert not report.compatible and "NOT compatible" in str(report)
    (error,) = errors(report.findings)
    assert error.title == "transformers cannot load this architecture (the target)"
    assert "'nosuchmodel'" in error.detail and "NoSuchForCausalLM" in error.detail
    assert "pip install -U transformers" in error.detail and "GGUF" in error.detail and "llama.cpp" in error.detail
    assert "trust_remote_code" not in error.detail  # the folder ships no code of its own

    (alone,) = errors(check_model(str(unknown)))
    assert alone.title == "transformers cannot load this architecture" and "'nosuchmodel'" in alone.detail


def test_a_known_tiny_model_still_passes(tmp_path):
    known = str(write_hf_folder(tmp_path / "known"))
    assert check_pair(known, known).compatible
    assert not errors(check_model(known))


def test_a_folder_with_its_own_code_says_trust_remote_code_stays_off_unless_asked(unknown):
    with_config(unknown, auto_map={"AutoModelForCausalLM": "modeling_nosuch.NoSuchForCausalLM"})
    (error,) = errors(check_model(str(unknown)))
    assert "trust_remote_code" in error.detail and "leaves off" in error.detail and "trust" in error.detail


def test_a_model_that_does_not_generate_text_is_refused_by_name(tmp_path):
    seq2seq = with_config(
        write_hf_folder(tmp_path / "t5"), model_type="t5", architectures=["T5ForConditionalGeneration"]
    )
    (error,) = errors(check_model(str(seq2seq)))  # transformers knows T5, but not as a causal LM
    assert "'t5'" in error.detail and "T5ForConditionalGeneration" in error.detail


def test_the_preflight_says_it_too(unknown):
    from engine import EngineConfig, preflight

    checked = preflight(EngineConfig(target=str(unknown), drafter="ngram"))
    assert not checked.compatible
    assert any("NoSuchForCausalLM" in f.detail for f in checked.errors)


def test_specdeck_cli_doctor_says_it(unknown, tmp_path, capsys):
    from engine.cli.main import main

    known = write_hf_folder(tmp_path / "known")
    assert main(["doctor", "--target", str(known), "--draft", str(unknown)]) == 1
    out = capsys.readouterr().out
    assert "transformers cannot load this architecture (the draft)" in out and "nosuchmodel" in out
    assert "Verdict: NOT compatible" in out
