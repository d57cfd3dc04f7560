"""Training an EAGLE-3 head: it learns, resumes exactly, and saves a published-layout head the drafter
loads and decodes with, changing nothing."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from engine.errors import ConfigError
from engine.training import TrainSettings, train_heads
from tests.factories.hf_models import make_tiny_llama

TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat. " * 60
FAST = dict(kind="eagle3", batch_size=2, seq_len=32, lr=1e-2, checkpoint_every=100, val_windows=2, draft_vocab=512)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny3") / "tiny-llama", seed=0, n_layers=3)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data3") / "fox.txt"
    path.write_text(TEXT, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def trained(tiny, text_file, tmp_path_factory):
    """Eight steps, cancelled after four and resumed; and the same eight uninterrupted."""
    root = tmp_path_factory.mktemp("runs")
    steps = []
    whole = train_heads(
        TrainSettings.of(tiny, text_file, steps=8, **FAST),
        root / "whole",
        progress=steps.append,
        command="specdeck-cli train-heads --kind eagle3 ...",
    )
    cancel = threading.Event()

    def stop_at_four(event):
        if event.phase == "train" and event.step == 4:
            cancel.set()

    cut = train_heads(
        TrainSettings.of(tiny, text_file, steps=8, **FAST), root / "cut", progress=stop_at_four, cancel=cancel
    )
    resumed = train_heads(TrainSettings.of(tiny, text_file, steps=8, **FAST), root / "cut")
    return whole, cut, resumed, [e for e in steps if e.phase == "train"]


def test_the_head_learns_and_reports_every_depth(trained):
    whole, _, _, steps = trained
    losses = [e.loss for e in steps]
    assert sum(losses[-2:]) < 0.95 * sum(losses[:2]), losses  # the 7 depths' cross-entropies, falling
    assert len(steps[-1].head_accuracy) == 7 and len(whole.head_accuracy) == 7  # the training-time test's depths
    # Held-out agreement with the target's greedy token at depth 1: ~0.07 after 8 steps, ~0.002 fresh.
    assert whole.head_accuracy[0] > 0.03
    assert 0.5 < whole.training["draft_vocab_coverage"] <= 1.0  # of the target's greedy tokens


def test_resume_after_cancel_gives_the_uninterrupted_head(trained):
    whole, cut, resumed, _ = trained
    assert cut.cancelled and cut.step == 4 and resumed.step == 8
    assert resumed.final_loss == pytest.approx(whole.final_loss, rel=1e-5)
    from safetensors.torch import load_file

    a, b = (load_file(f"{r.out_dir}/model.safetensors") for r in (whole, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_saved_head_is_published_layout_and_decodes_as_vanilla(trained, tiny):
    from engine.api import Engine, EngineConfig
    from engine.backends.hf.backend import TorchBackend
    from engine.core.draft_length import CostModel
    from engine.core.sampling import SamplingConfig
    from tests.engine.drafters.build import make_drafter

    whole = trained[0]
    config = json.loads(open(f"{whole.out_dir}/config.json", encoding="utf-8").read())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 512
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    facts = config["specdeck"]["training"]
    assert facts["kind"] == "eagle3" and facts["command"].endswith("--kind eagle3 ...")
    backend = TorchBackend(tiny, dtype="float32")
    try:
        drafter = make_drafter("eagle3", backend, heads=whole.out_dir)
        assert drafter.vocab.numel() == 512
        engine = Engine(backend, drafter, EngineConfig(drafter="eagle3", k=8), CostModel())
        comparison = engine.compare(engine.prompt_ids(TEXT[:80]), SamplingConfig(max_tokens=24))
        assert comparison.identical, comparison.divergence
        assert comparison.speculative.stats.drafted > 0
    finally:
        backend.close()


def test_eagle3_refuses_the_kl_objective_and_windows_shorter_than_its_depths(tiny, text_file, tmp_path):
    with pytest.raises(ConfigError, match="cached features"):
        train_heads(TrainSettings.of(tiny, text_file, steps=2, **{**FAST, "objective": "kl"}), tmp_path / "x")
    with pytest.raises(ConfigError, match="at least 9"):
        train_heads(TrainSettings.of(tiny, text_file, steps=2, **{**FAST, "seq_len": 8}), tmp_path / "x")
