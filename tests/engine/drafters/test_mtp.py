"""MTP: a model's own multi-token-prediction layers found in its files, drafting losslessly."""

from __future__ import annotations

import pytest
import torch

from engine.api import Engine, EngineConfig
from engine.backends.capabilities import HiddenFeatures, ModelParts
from engine.backends.hf.backend import TorchBackend
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.drafters.mtp import MtpDrafter
from engine.drafters.registry import drafter_spec
from engine.errors import ModelLoadError
from engine.heads.mtp import find_mtp, load_mtp, read_model_config
from tests.engine.drafters.build import make_drafter
from tests.factories.hf_models import make_tiny_llama
from tests.factories.mtp_models import make_mtp_model
from tests.stats_helpers import first_two_tokens

GREEDY = SamplingConfig(max_tokens=30)
PROMPTS = ["Write a short poem about the sea.", "Repeat after me: the early bird catches the worm."]
ARCHS = ["deepseek_v3", "glm4_moe", "qwen3_next"]
LEAK = 0.001  # how much the "bigram" targets' attention writes: enough for some drafts to fail


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Model folders made on first use, by (arch, kind, head, embed)."""
    made = {}

    def get(arch, kind="bigram", mtp=True, head=True, embed=True):
        key = (arch, kind, mtp, head, embed)
        if key not in made:
            folder = tmp_path_factory.mktemp("mtp") / "-".join(map(str, key))
            made[key] = make_mtp_model(folder, arch, kind=kind, mtp=mtp, head=head, embed=embed, leak=LEAK, seed=1)
        return made[key]

    return get


@pytest.fixture(scope="module")
def loaded(models):
    """Loaded targets by (arch, kind), closed at the end."""
    backends = {}

    def get(arch, kind="bigram", **files):
        key = (arch, kind, tuple(sorted(files.items())))
        if key not in backends:
            backends[key] = TorchBackend(models(arch, kind, **files), dtype="float32")
        return backends[key]

    yield get
    for backend in backends.values():
        backend.close()


def engine_for(backend, k=4) -> Engine:
    return Engine(backend, make_drafter("mtp", backend), EngineConfig(drafter="mtp", k=k), CostModel())


# -- finding and loading the layers --------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, layout, prefix",
    [
        ("deepseek_v3", "deepseek", "model.layers.2."),
        ("glm4_moe", "deepseek", "model.layers.2."),
        ("qwen3_next", "qwen3-next", "mtp."),
    ],
)
def test_the_published_layouts_are_found_and_built_from_the_architectures_own_layer(models, arch, layout, prefix):
    folder = models(arch, "random")
    files = find_mtp(folder, read_model_config(folder))
    assert (files.layout, files.prefix, files.n_layers) == (layout, prefix, 1)
    backend = TorchBackend(folder, dtype="float32")
    try:
        head = load_mtp(folder, backend.text_config, files)
        # The decoder layer is transformers' own class for the architecture, the model's MoE included.
        assert type(head.layer) is type(backend._model.model.layers[-1])
        assert hasattr(head.layer.mlp, "experts")
        # Per-expert tensors of the file became the fused experts, gate before up.
        from safetensors import safe_open

        layer = prefix if layout == "deepseek" else prefix + "layers.0."
        with safe_open(f"{folder}/model.safetensors", "pt") as f:
            gate, up, down = (
                f.get_tensor(f"{layer}mlp.experts.1.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj")
            )
        torch.testing.assert_close(head.layer.mlp.experts.gate_up_proj[1], torch.cat([gate, up]))
        torch.testing.assert_close(head.layer.mlp.experts.down_proj[1], down)
        # transformers itself dropped these weights: the target's forward never saw them.
        assert len(backend._model.model.layers) == 2
    finally:
        backend.close()


def test_a_model_without_mtp_layers_is_refused_saying_so(models, tmp_path):
    from engine.preflight import preflight

    bare = models("deepseek_v3", "random", mtp=False)
    backend = TorchBackend(bare, dtype="float32")
    try:
        with pytest.raises(ModelLoadError, match=r"ships no MTP layers \(num_nextn_predict_layers = 0"):
            make_drafter("mtp", backend)
    finally:
        backend.close()
    result = preflight(EngineConfig(target=bare, dtype="float32").with_drafter("mtp"))
    assert not result.compatible
    assert any("num_nextn_predict_layers = 0" in f.detail for f in result.errors)
    ok = preflight(EngineConfig(target=models("deepseek_v3", "random"), dtype="float32").with_drafter("mtp"))
    assert ok.compatible and any("MTP layers" in f.title for f in ok.findings)

    qwen = models("qwen3_next", "random", mtp=False)
    with pytest.raises(ModelLoadError, match="ships no MTP layers"):
        find_mtp(qwen, read_model_config(qwen))
    llama = make_tiny_llama(tmp_path / "llama")
    with pytest.raises(ModelLoadError, match="no MTP layout is known"):
        find_mtp(llama, read_model_config(llama))


def test_a_config_whose_weights_lost_the_block_names_the_missing_tensor(models, tmp_path):
    import json
    import shutil

    folder = tmp_path / "stripped"
    shutil.copytree(models("deepseek_v3", "random", mtp=False), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    with pytest.raises(ModelLoadError, match=r"lack model\.layers\.2\.eh_proj\.weight"):
        find_mtp(str(folder), read_model_config(str(folder)))


def test_a_block_stored_in_fp8_is_refused_rather_than_read_without_its_scales(models, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "fp8"
    shutil.copytree(models("deepseek_v3", "random"), folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.layers.2.eh_proj.weight_scale_inv"] = torch.ones(1, 1)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"stored quantized \(model\.layers\.2\.eh_proj\.weight_scale_inv"):
        find_mtp(str(folder), read_model_config(str(folder)))


def test_the_spec_says_it_needs_the_targets_hidden_states():
    spec = drafter_spec("mtp")
    assert set(spec.needs) == {HiddenFeatures, ModelParts} and spec.torch_reason
    assert not spec.trees


# -- losslessness and rollback -------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_greedy_mtp_equals_vanilla_and_mostly_accepts_a_layer_that_knows_the_target(loaded, arch):
    backend = loaded(arch)
    engine = engine_for(backend)
    drafted = accepted = steps = tokens = 0
    for text in PROMPTS:
        comparison = engine.compare(engine.prompt_ids(text), GREEDY)
        assert comparison.identical, comparison.divergence
        s = comparison.speculative.stats
        drafted, accepted, steps, tokens = (
            drafted + s.drafted,
            accepted + s.accepted,
            steps + s.steps,
            tokens + s.tokens,
        )
    # Drafts were accepted (several tokens per target forward) and rejected (rolled back) alike.
    assert 0 < accepted < drafted
    assert tokens / steps > 1.8
    assert engine.drafter.stats().layout in ("deepseek", "qwen3-next")


def test_float32_greedy_mtp_equals_vanilla_with_random_layers_and_shared_head(loaded):
    for files in ({}, {"head": False, "embed": False}):
        backend = loaded("deepseek_v3", "random", **files)
        engine = engine_for(backend, k=3)
        assert (engine.drafter.head.head is None) == ("head" in files)
        assert (engine.drafter.head.embed_tokens is None) == ("embed" in files)
        for text in PROMPTS:
            comparison = engine.compare(engine.prompt_ids(text), GREEDY)
            assert comparison.identical, comparison.divergence
            assert comparison.speculative.stats.drafted > 0


def test_the_layers_cache_after_rejections_equals_a_fresh_pass(loaded):
    backend = loaded("deepseek_v3")
    engine = engine_for(backend, k=5)
    drafter: MtpDrafter = engine.drafter
    result = engine.generate(engine.prompt_ids(PROMPTS[0]), GREEDY)
    assert 0 < result.stats.accepted < result.stats.drafted
    rows = drafter.rows
    assert drafter.cache.get_seq_length() == rows  # no draft's scratch row left behind
    context = backend.tokens[: rows + 1]  # the last draft's context: its rows, then its pending token
    fresh = MtpDrafter(drafter.head, backend)
    with torch.inference_mode():
        fresh._catch_up(context)
    ours, theirs = drafter.cache.layers[0], fresh.cache.layers[0]
    torch.testing.assert_close(ours.keys[..., :rows, :], theirs.keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.values[..., :rows, :], theirs.values, atol=1e-5, rtol=1e-5)


def test_sampled_mtp_is_distributed_as_the_target(loaded):
    """The first two tokens after a prompt, sampled with top-k 3, against the target's own p."""
    backend = loaded("deepseek_v3")
    prompt = backend.apply_chat_template([{"role": "user", "content": "Hi"}])
    pvalue, accepted = first_two_tokens(engine_for(backend, k=3), prompt, top_k=3, draws=400)
    assert accepted > 400 // 4  # q was used, not just drafted and thrown away
    assert pvalue > 1e-3


def test_cli_drafts_with_the_models_mtp_layer(models, capsys):
    import json

    from engine.cli.main import main

    code = main(
        [
            "generate",
            "--target",
            models("glm4_moe"),
            "--drafter",
            "mtp",
            "--k",
            "4",
            "--dtype",
            "float32",
            "--prompt",
            PROMPTS[0],
            "--max-tokens",
            "16",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    stats = json.loads(out)["stats"]  # the load report of the dropped MTP keys goes to stderr
    assert 0 < stats["accepted"] <= stats["drafted"]


def test_a_qwen3_next_target_rolls_back_to_empty_and_runs_again(loaded):
    """Its linear-attention cache zeroes inference tensors in place on reset (the CLI's cost
    measurement rolls back to 0 before the first generation): it used to raise there."""
    backend = loaded("qwen3_next", "random")
    ids = backend.tokenize(PROMPTS[0])
    first = backend.forward(ids)
    backend.rollback(0)
    torch.testing.assert_close(backend.forward(ids), first)
    backend.rollback(0)
