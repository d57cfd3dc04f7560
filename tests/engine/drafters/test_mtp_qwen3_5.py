"""MTP on Qwen3.5 / Qwen3.6: the published wrapper's mtp.* layer found and drafting losslessly on a hybrid target."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine.api import Engine, EngineConfig
from engine.backends.hf.backend import TorchBackend
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.errors import ModelLoadError
from engine.heads.mtp import find_mtp, load_mtp, read_model_config
from tests.engine.drafters.build import make_drafter
from tests.factories.mtp_models import make_mtp_model
from tests.stats_helpers import first_two_tokens

GREEDY = SamplingConfig(max_tokens=30)
PROMPTS = ["Write a short poem about the sea.", "Repeat after me: the early bird catches the worm."]
LEAK = 0.001  # how much the "bigram" target's mixers write: enough for some drafts to fail


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """Model folders by (arch, kind, mtp), made on first use."""
    made = {}

    def get(arch="qwen3_5", kind="bigram", mtp=True):
        if (arch, kind, mtp) not in made:
            folder = tmp_path_factory.mktemp("qwen3_5") / f"{arch}-{kind}-{mtp}"
            made[arch, kind, mtp] = make_mtp_model(folder, arch, kind=kind, mtp=mtp, leak=LEAK, seed=1)
        return made[arch, kind, mtp]

    return get


@pytest.fixture(scope="module")
def target(qwen):
    backend = TorchBackend(qwen(), dtype="float32")
    yield backend
    backend.close()


def engine_for(backend, k=4) -> Engine:
    return Engine(backend, make_drafter("mtp", backend), EngineConfig(drafter="mtp", k=k), CostModel())


@pytest.mark.parametrize("arch, layer", [("qwen3_5", "Qwen3_5DecoderLayer"), ("qwen3_5_moe", "Qwen3_5MoeDecoderLayer")])
def test_the_published_wrapper_is_read_beside_the_language_model(qwen, arch, layer):
    folder = qwen(arch, "random")
    config = read_model_config(folder)
    assert config["model_type"] == arch and config["text_config"]["mtp_num_hidden_layers"] == 1
    files = find_mtp(folder, config)
    assert (files.layout, files.prefix, files.n_layers) == ("qwen3-next", "mtp.", 1)
    assert not any(name.startswith("model.") for name in files.names)  # the MTP block only
    backend = TorchBackend(folder, dtype="float32")
    try:
        assert backend.info.forward.startswith("transformers")  # the hybrid runs on transformers' forward
        head = load_mtp(folder, backend.text_config, files)
        assert type(head.layer).__name__ == layer and head.layer.self_attn is not None  # full attention
        from safetensors import safe_open

        with safe_open(f"{folder}/model.safetensors", "pt") as f:
            torch.testing.assert_close(head.proj.weight, f.get_tensor("mtp.fc.weight"))
            torch.testing.assert_close(head.final_norm.weight, f.get_tensor("mtp.norm.weight"))
    finally:
        backend.close()


def test_a_copy_without_its_mtp_layers_is_refused_saying_why(qwen, tmp_path):
    bare = qwen("qwen3_5", "random", mtp=False)
    with pytest.raises(ModelLoadError, match=r"ships no MTP layers \(mtp_num_hidden_layers = 0"):
        find_mtp(bare, read_model_config(bare))
    # A config that still says 1 over weights that lost the block (a converted copy).
    stripped = tmp_path / "stripped"
    shutil.copytree(bare, stripped)
    config = json.loads((stripped / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    (stripped / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelLoadError, match=r"hold no mtp\.\* tensors, though its config says mtp_num_hidden_layers = 1"
    ):
        find_mtp(str(stripped), read_model_config(str(stripped)))


def test_mtp_layers_of_another_model_are_refused_before_loading_naming_the_hidden_size(qwen, tmp_path):
    """The mtp.* tensors of a wider model copied beside this one: refused from the file headers."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "mixed"
    shutil.copytree(qwen("qwen3_5", "random"), folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights["mtp.fc.weight"] = torch.zeros(96, 192)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        ModelLoadError, match=r"made for another model: they have hidden size 96 \(this model's is 64\)"
    ):
        find_mtp(str(folder), read_model_config(str(folder)))


def test_float32_greedy_mtp_equals_vanilla_with_drafts_accepted_and_rejected(target):
    engine = engine_for(target)
    drafted = accepted = 0
    for text in PROMPTS:
        comparison = engine.compare(engine.prompt_ids(text), GREEDY)
        assert comparison.identical, comparison.divergence
        drafted += comparison.speculative.stats.drafted
        accepted += comparison.speculative.stats.accepted
    assert 0 < accepted < drafted  # the hybrid target rolled back after rejections and stayed exact
    assert engine.drafter.stats().layout == "qwen3-next"


def test_sampled_mtp_is_distributed_as_the_target(target):
    """The first two tokens after a prompt, sampled with top-k 3, against the target's own p."""
    prompt = target.apply_chat_template([{"role": "user", "content": "Hi"}])
    pvalue, accepted = first_two_tokens(engine_for(target, k=3), prompt, top_k=3, draws=200)
    assert accepted > 200 // 4  # q was used, not just drafted and thrown away
    assert pvalue > 1e-3


def test_cli_drafts_with_qwen3_5s_mtp_layer(qwen, capsys):
    from engine.cli.main import main

    args = ["generate", "--target", qwen(), "--drafter", "mtp", "--k", "4", "--dtype", "float32"]
    code = main([*args, "--prompt", PROMPTS[0], "--max-tokens", "16", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    stats = json.loads(out)["stats"]
    assert 0 < stats["accepted"] <= stats["drafted"]
