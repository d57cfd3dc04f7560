"""The sampling a model's files recommend (GGUF general.sampling.*, generation_config.json)."""

from __future__ import annotations

import json

import pytest

from engine.core.sampling import SamplingConfig
from engine.models.recommended import describe, recommended_sampling
from tests.factories.gguf_models import make_tiny_gguf
from tests.factories.hf_models import make_tiny_llama


def test_a_gguf_says_what_sampling_its_authors_recommend(tmp_path):
    path = make_tiny_gguf(
        str(tmp_path / "tiny.gguf"),
        extra={
            "general.sampling.temp": 0.6,
            "general.sampling.top_p": 0.95,
            "general.sampling.top_k": 20,
            "general.sampling.min_p": 0.05,
            "general.sampling.xtc_threshold": 0.1,
        },
    )

    fields = recommended_sampling(path)

    assert fields == {
        "temperature": pytest.approx(0.6),
        "top_k": 20,
        "top_p": pytest.approx(0.95),
        "min_p": pytest.approx(0.05),
    }
    assert SamplingConfig(**fields).min_p == pytest.approx(0.05)  # usable as it is
    assert describe(fields) == "temperature 0.6, top-k 20, top-p 0.95, min-p 0.05"


def test_a_gguf_without_recommendations_and_the_embedded_model_give_nothing(tmp_path):
    assert recommended_sampling(make_tiny_gguf(str(tmp_path / "plain.gguf"))) == {}
    assert recommended_sampling("default") == {}


def test_generation_config_json_is_read_and_bad_values_are_left_out(tmp_path):
    tiny_llama_dir = tmp_path / "tiny"
    make_tiny_llama(tiny_llama_dir)
    (tiny_llama_dir / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.7, "top_p": 7.0, "top_k": "many", "min_p": 0.1})
    )

    assert recommended_sampling(str(tiny_llama_dir)) == {"temperature": 0.7, "min_p": 0.1}

    (tiny_llama_dir / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.7}))
    assert recommended_sampling(str(tiny_llama_dir)) == {"temperature": 0.0}


def test_the_cli_samples_as_the_model_recommends_unless_told_otherwise(tmp_path, capsys):
    from engine.cli.main import main

    path = make_tiny_gguf(
        str(tmp_path / "tiny.gguf"), extra={"general.sampling.temp": 0.6, "general.sampling.min_p": 0.05}
    )
    common = [
        "generate",
        "--target",
        path,
        "--drafter",
        "none",
        "--threads",
        "1",
        "--max-tokens",
        "2",
        "--prompt",
        "Hi",
        "--json",
    ]

    def sampled(*options: str) -> dict:
        assert main(common + list(options)) == 0
        return json.loads(capsys.readouterr().out)["sampling"]

    assert sampled() == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}
    assert sampled("--model-sampling") == {
        "temperature": pytest.approx(0.6),
        "top_k": 0,
        "top_p": 1.0,
        "min_p": pytest.approx(0.05),
        "seed": 0,
    }
    assert sampled("--model-sampling", "--temperature", "0")["temperature"] == 0.0  # what is given wins
