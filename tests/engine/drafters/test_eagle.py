"""EAGLE: the head, the dynamic tree, losslessness, the head's cache, loading checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from engine.api import Engine, EngineConfig, target_backend
from engine.backends.hf.backend import TorchBackend
from engine.backends.hf.packed import PackedLinear
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.drafters.eagle import EagleDrafter
from engine.errors import ConfigError, ModelLoadError
from engine.heads.eagle import EagleConfig, EagleHead, load_head
from tests.engine.drafters.build import make_drafter
from tests.factories.hf_models import make_tiny_llama, make_tiny_model
from tests.stats_helpers import first_two_tokens

GREEDY = SamplingConfig(max_tokens=40)
PROMPTS = [
    "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese.",
    "Write a short poem about the sea.",
]


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("eagle") / "one-layer", seed=3, n_layers=1)


@pytest.fixture(scope="module")
def two_layers(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("eagle") / "two-layers", seed=0, n_layers=2)


def unit_rms_embeddings(backend: TorchBackend) -> None:
    """Scale every embedding row to RMS 1, so that the first RMSNorm (weight 1) leaves it
    alone: a head without an input norm then computes what the target's layer does."""
    weight = backend._model.get_input_embeddings().weight
    with torch.no_grad():
        weight.div_(weight.pow(2).mean(dim=-1, keepdim=True).sqrt())
    if isinstance(backend._native.head, PackedLinear):  # its copy of the tied embeddings is the old one
        backend._native.prepack()


def mirror_head(backend: TorchBackend) -> EagleHead:
    """A head that is the one-layer target's own layer, reading the token only (fc = [I 0]).
    Its guess of a token's feature is the target's (unnormalized) hidden state of that token,
    computed without the first token of the context: right most of the time, not always."""
    layer = backend._model.model.layers[0]
    head = EagleHead(EagleConfig.for_target(backend.text_config, fc_bias=False))
    h = head.config.hidden_size
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1))
        for ours, theirs in [
            (head.q_proj, layer.self_attn.q_proj),
            (head.k_proj, layer.self_attn.k_proj),
            (head.v_proj, layer.self_attn.v_proj),
            (head.o_proj, layer.self_attn.o_proj),
            (head.gate_proj, layer.mlp.gate_proj),
            (head.up_proj, layer.mlp.up_proj),
            (head.down_proj, layer.mlp.down_proj),
        ]:
            ours.weight.copy_(theirs.weight)
        head.post_attention_layernorm.copy_(layer.post_attention_layernorm.weight)
    return head.eval()


def random_head(backend: TorchBackend, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    return EagleHead(EagleConfig.for_target(backend.text_config)).eval()


def engine_for(backend, drafter, k="auto") -> Engine:
    return Engine(backend, drafter, EngineConfig(drafter="eagle", k=k), CostModel())


@pytest.fixture(scope="module")
def mirrored(one_layer):
    backend = TorchBackend(one_layer, dtype="float32")
    unit_rms_embeddings(backend)
    yield backend, mirror_head(backend)
    backend.close()


# -- losslessness and the tree ---------------------------------------------------------------


def test_a_head_that_knows_the_target_is_accepted_deep_and_changes_nothing(mirrored):
    backend, head = mirrored
    engine = engine_for(backend, EagleDrafter(head, backend), k=12)
    for text in PROMPTS:
        comparison = engine.compare(engine.prompt_ids(text), GREEDY)
        assert comparison.identical, comparison.divergence
        s = comparison.speculative.stats
        assert s.tokens_per_step > 2.5  # several tokens per target forward
        assert s.accepted < s.drafted  # and rejections (tree siblings at least)
        assert len(s.depth_accepted) >= 3 and s.depth_accepted[2] > 0
        assert sum(s.depth_tested) == s.tested
    stats = engine.drafter.stats()
    assert stats.nodes >= 1 and stats.depth >= 2 and 0 < stats.calibration


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_float32_greedy_eagle_equals_vanilla_with_an_untrained_head(tmp_path, two_layers, arch):
    path = two_layers if arch == "llama" else make_tiny_model(tmp_path / arch, arch, seed=1, n_layers=2)
    backend = TorchBackend(path, dtype="float32")
    try:
        engine = engine_for(backend, EagleDrafter(random_head(backend), backend), k=8)
        for text in PROMPTS:
            comparison = engine.compare(engine.prompt_ids(text), GREEDY)
            assert comparison.identical, comparison.divergence
            events = comparison.speculative.events
            assert events[0].drafted == 8 and all(e.drafted == e.k for e in events)  # the budget, spent
    finally:
        backend.close()


def test_the_tree_keeps_the_most_probable_nodes_with_parents_first(mirrored):
    backend, head = mirrored
    drafter = EagleDrafter(head, backend, top_k=3, max_depth=4)
    prompt = backend.apply_chat_template([{"role": "user", "content": PROMPTS[1]}])
    backend.prefill(prompt[:-1])
    draft = drafter.propose(prompt, 10, GREEDY, torch.Generator())
    assert len(draft.tokens) == 10
    assert all(p < i for i, p in enumerate(draft.parents))
    for i, p in enumerate(draft.parents):  # siblings carry distinct tokens
        assert draft.tokens[i] not in [draft.tokens[j] for j in range(i) if draft.parents[j] == p]
    assert drafter.cache.length == len(prompt) - 1  # the tree's rows were scratch
    # The first node is the head's best guess for the token after the prompt.
    assert draft.parents[0] == -1 and draft.best_path[0] == 0
    assert drafter.tree_expected_tokens(10) > drafter.tree_expected_tokens(1) > 1.0


def test_the_heads_cache_after_rejections_equals_a_fresh_pass(mirrored):
    backend, head = mirrored
    drafter = EagleDrafter(head, backend)
    engine = engine_for(backend, drafter, k=10)
    result = engine.generate(engine.prompt_ids(PROMPTS[1]), GREEDY)
    assert 0 < result.stats.accepted < result.stats.drafted
    pairs = drafter.cache.length
    context = backend.tokens[: pairs + 1]  # the context of the last draft: its pairs, and its pending token
    fresh = EagleDrafter(head, backend)
    with torch.inference_mode():
        fresh._catch_up(context)
    assert fresh.cache.length == pairs
    torch.testing.assert_close(
        drafter.cache.buffers[0][:, :pairs], fresh.cache.buffers[0][:, :pairs], atol=1e-4, rtol=1e-4
    )


def test_sampled_eagle_is_distributed_as_the_target(mirrored):
    """The first two tokens after a prompt, sampled with top-k 3, against the target's own p."""
    backend, head = mirrored
    prompt = backend.apply_chat_template([{"role": "user", "content": "Hi"}])
    pvalue, accepted = first_two_tokens(engine_for(backend, EagleDrafter(head, backend), k=6), prompt, 3, 500)
    assert accepted > 0
    assert pvalue > 1e-3


# -- checkpoints ------------------------------------------------------------------------------


def published_folder(folder, head: EagleHead, pickle: bool = True, extra: dict | None = None) -> str:
    """A head in SafeAILab's layout: a one-layer LlamaConfig and pytorch_model.bin (or safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    c = head.config
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "vocab_size": c.vocab_size,
        "bias": c.fc_bias,
        **(extra or {}),
    }
    (folder / "config.json").write_text(json.dumps(config))
    weights = head.weights()
    weights["embed_tokens.weight"] = torch.zeros(c.vocab_size, c.hidden_size)  # published heads carry one
    if pickle:
        torch.save(weights, str(folder / "pytorch_model.bin"))
    else:
        from safetensors.torch import save_file

        save_file(weights, str(folder / "model.safetensors"))
    return str(folder)


@pytest.mark.parametrize("pickle", [True, False], ids=["pytorch_model.bin", "safetensors"])
def test_a_published_layout_head_loads_and_drafts_the_same(mirrored, tmp_path, pickle):
    backend, head = mirrored
    folder = published_folder(tmp_path / "published", head, pickle=pickle)
    drafter = make_drafter("eagle", backend, heads=folder)
    engine = engine_for(backend, drafter, k=12)
    comparison = engine.compare(engine.prompt_ids(PROMPTS[0]), GREEDY)
    assert comparison.identical, comparison.divergence
    assert comparison.speculative.stats.tokens_per_step > 2.5  # the same head, loaded
    assert drafter.head.config.fc_bias is False  # read off the weights


def test_our_layout_keeps_its_draft_vocabulary(mirrored, tmp_path):
    backend, head = mirrored
    head.draft_vocab = torch.arange(4096)
    try:
        head.save(str(tmp_path / "ours"), dtype=torch.bfloat16)
    finally:
        head.draft_vocab = None
    loaded = load_head(str(tmp_path / "ours"), EagleConfig.for_target(backend.text_config))
    assert torch.equal(loaded.draft_vocab, torch.arange(4096))
    drafter = EagleDrafter(loaded, backend)
    prompt = backend.apply_chat_template([{"role": "user", "content": PROMPTS[1]}])
    backend.prefill(prompt[:-1])
    draft = drafter.propose(prompt, 8, GREEDY, torch.Generator())
    assert draft.tokens and max(draft.tokens) < 4096


def _missing(folder):
    weights = torch.load(str(folder / "pytorch_model.bin"), weights_only=True)
    del weights["layers.0.mlp.down_proj.weight"]
    torch.save(weights, str(folder / "pytorch_model.bin"))


def _corrupt(folder):
    (folder / "pytorch_model.bin").write_bytes(b"not a checkpoint" * 8)


class NotATensor:
    """What a hostile or broken checkpoint might hold instead of tensors."""


def _pickle(folder):
    torch.save({"fc.weight": NotATensor()}, str(folder / "pytorch_model.bin"))


@pytest.mark.parametrize(
    "breakage, extra, message",
    [
        (_missing, None, "incomplete"),
        (_corrupt, None, "corrupt"),
        (_pickle, None, "contains pickled code"),
        (None, {"hidden_size": 128, "num_attention_heads": 8}, r"hidden size 128 \(the target's: 64\)"),
        (None, {"num_key_value_heads": 4}, r"key/value heads 4 \(the target's: 2\)"),
        (None, {"draft_vocab_size": 32000}, "EAGLE-3"),
        (None, {"medusa_num_heads": 4}, "Medusa heads"),
    ],
    ids=["missing-tensor", "corrupt-file", "non-tensor-pickle", "hidden-size", "kv-heads", "eagle3", "medusa"],
)
def test_a_head_that_does_not_fit_gives_a_clear_error(mirrored, tmp_path, breakage, extra, message):
    backend, head = mirrored
    folder = tmp_path / "head"
    published_folder(folder, head, extra=extra)
    if breakage is not None:
        breakage(folder)
    with pytest.raises(ModelLoadError, match=message):
        make_drafter("eagle", backend, heads=str(folder))


def test_missing_folder_and_missing_heads_say_what_to_do(mirrored, tmp_path):
    backend, _ = mirrored
    with pytest.raises(ModelLoadError, match="not found"):
        make_drafter("eagle", backend, heads=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="train-heads --kind eagle") as refused:
        make_drafter("eagle", backend)
    assert "in the window: Models > Train heads" in str(refused.value)  # a window user is not sent to a terminal


def test_eagle_on_llama_cpp_says_to_use_the_torch_backend(default_llama, mirrored, tmp_path):
    _, head = mirrored
    with pytest.raises(ConfigError, match="PyTorch backend"):
        make_drafter("eagle", default_llama, heads=published_folder(tmp_path / "h", head))


def test_eagle_with_backend_auto_loads_the_target_on_pytorch():
    assert target_backend(EngineConfig(target="default", drafter="eagle")) == "torch"


def test_cli_runs_eagle_with_a_heads_folder(mirrored, one_layer, tmp_path, capsys):
    from engine.cli.main import main

    _, head = mirrored
    folder = published_folder(tmp_path / "h", head, pickle=False)
    code = main(
        [
            "generate",
            "--target",
            one_layer,
            "--drafter",
            "eagle",
            "--heads",
            folder,
            "--k",
            "8",
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
    stats = json.loads(out)["stats"]
    assert stats["drafted"] > 0 and len(stats["depth_tested"]) >= 1


def test_the_shipped_head_keeps_the_embedded_models_greedy_output_exact_in_float32(embedded_hf_dir):
    """The head in resources/ loads for the embedded model, drafts real trees that land, and
    changes nothing."""
    backend = TorchBackend(embedded_hf_dir, dtype="float32")
    try:
        drafter = make_drafter("eagle", backend)
        assert drafter.vocab is not None and drafter.vocab.numel() == 8192
        engine = engine_for(backend, drafter, k=10)
        comparison = engine.compare(
            engine.prompt_ids("List the days of the week, one per line."), SamplingConfig(max_tokens=40)
        )
        assert comparison.identical, comparison.divergence
        s = comparison.speculative.stats
        assert s.accepted > 0 and s.tokens_per_step > 1.2
    finally:
        backend.close()
