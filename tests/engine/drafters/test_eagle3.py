"""EAGLE-3: published heads load (or are refused, saying why), draft accepted trees, change nothing."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from engine.api import Engine, EngineConfig
from engine.backends.hf.backend import TorchBackend
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.drafters.eagle3 import Eagle3Drafter
from engine.errors import ConfigError, ModelLoadError
from engine.heads.eagle3 import Eagle3Config, Eagle3Head, load_head
from tests.engine.drafters.build import make_drafter
from tests.factories.eagle3_models import make_bigram_llama, mirror_head, write_published
from tests.stats_helpers import first_two_tokens

GREEDY = SamplingConfig(max_tokens=32)
PROMPTS = ["Write a short poem about the sea.", "Repeat after me: the early bird catches the worm."]


@pytest.fixture(scope="module")
def bigram_path(tmp_path_factory) -> str:
    return make_bigram_llama(tmp_path_factory.mktemp("eagle3") / "bigram")


@pytest.fixture(scope="module")
def bigram(bigram_path):
    """A 4-layer target whose next token follows mostly from the current one, and a head built to
    know that over a draft vocabulary of every third id below 6000 plus what greedy decoding writes."""
    backend = TorchBackend(bigram_path, dtype="float32")
    plain = engine_for(backend, None)
    written = set()
    for text in PROMPTS:
        written |= set(plain.generate(plain.prompt_ids(text), GREEDY, speculative=False).tokens)
    yield backend, mirror_head(backend, sorted(written | set(range(0, 6000, 3))))
    backend.close()


def engine_for(backend, drafter, k=12) -> Engine:
    return Engine(backend, drafter, EngineConfig(drafter="eagle3" if drafter else "none", k=k), CostModel())


def random_head(backend, seed=0, **overrides) -> Eagle3Head:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = Eagle3Head(Eagle3Config.for_target(backend.text_config, draft_vocab_size=4096, **overrides))
        torch.nn.init.normal_(head.fc.weight, std=0.05)
    head.set_draft_vocab(torch.randperm(backend.vocab_size, generator=torch.Generator().manual_seed(seed))[:4096])
    return head.eval()


# -- drafting ---------------------------------------------------------------------------------------


def test_a_head_that_knows_the_target_drafts_deep_accepted_trees_and_changes_nothing(bigram):
    backend, head = bigram
    drafter = Eagle3Drafter(head, backend)
    engine = engine_for(backend, drafter)
    for text in PROMPTS:
        comparison = engine.compare(engine.prompt_ids(text), GREEDY)
        assert comparison.identical, comparison.divergence
        s = comparison.speculative.stats
        assert s.tokens_per_step > 3  # several tokens per target forward
        assert len(s.depth_accepted) >= 3 and s.depth_accepted[2] > 0
    stats = drafter.stats()
    assert stats.draft_vocab == head.config.draft_vocab_size and stats.depth >= 2
    # Every proposal is a draft-vocabulary id mapped through d2t.
    prompt = engine.prompt_ids(PROMPTS[0])
    backend.prefill(prompt[:-1])
    draft = drafter.propose(prompt, 10, GREEDY, torch.Generator())
    assert set(draft.tokens) <= set(head.draft_ids.tolist())
    assert drafter.cache.length == len(prompt) - 1  # the tree's rows were scratch


def test_float32_greedy_eagle3_with_an_untrained_head_equals_vanilla(bigram):
    backend, _ = bigram
    engine = engine_for(backend, Eagle3Drafter(random_head(backend), backend), k=8)
    for text in PROMPTS:
        comparison = engine.compare(engine.prompt_ids(text), GREEDY)
        assert comparison.identical, comparison.divergence
        assert all(e.drafted == e.k for e in comparison.speculative.events)  # the budget, spent


def test_sampled_eagle3_is_distributed_as_the_target(bigram):
    """The first two tokens after a prompt, sampled with top-k 3, against the target's own p."""
    backend, head = bigram
    engine = engine_for(backend, Eagle3Drafter(head, backend), k=6)
    pvalue, accepted = first_two_tokens(engine, engine.prompt_ids("Hi"), top_k=3, draws=300)
    assert accepted > 300 // 4  # the head is right often enough for the test to mean something
    assert pvalue > 1e-3


def test_closing_the_drafter_stops_keeping_the_layers(bigram):
    backend, _ = bigram
    drafter = Eagle3Drafter(random_head(backend), backend)
    assert backend._watched == drafter.head.config.layers
    drafter.close()
    assert backend._watched == () and backend._layer_store is None


# -- loading published heads --------------------------------------------------------------------------


@pytest.mark.parametrize("pickle", [True, False], ids=["pytorch_model.bin", "safetensors"])
def test_a_published_head_loads_and_drafts_as_built(bigram, tmp_path, pickle):
    backend, head = bigram
    embed = backend._model.get_input_embeddings().weight  # the head's own copy, as SafeAILab saves it
    folder = write_published(tmp_path / "head", head, pickle=pickle, embed=embed if pickle else None)
    drafter = make_drafter("eagle3", backend, heads=folder)
    assert (drafter.head.embed_tokens is not None) == pickle
    assert torch.equal(drafter.head.draft_ids, head.draft_ids)
    engine = engine_for(backend, drafter)
    comparison = engine.compare(engine.prompt_ids(PROMPTS[0]), GREEDY)
    assert comparison.identical, comparison.divergence
    assert comparison.speculative.stats.tokens_per_step > 3  # the same head, loaded


def test_a_head_without_layer_ids_reads_the_default_layers(bigram, tmp_path):
    backend, head = bigram
    folder = write_published(tmp_path / "head", head, extra={"eagle_config": {}})
    loaded = load_head(folder, backend.text_config)
    assert loaded.config.layers == (0, 2, 3)  # a 4-layer target: first, middle, last (2, L // 2, L - 3 from 6 up)


def _out_of_range_d2t(folder):
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    weights["d2t"][-1] += 10**6
    save_file(weights, str(folder / "model.safetensors"))


@pytest.mark.parametrize(
    "extra, drop, breakage, message",
    [
        ({"hidden_size": 128, "num_attention_heads": 8}, (), None, r"hidden size 128 \(the target's: 64\)"),
        ({"num_key_value_heads": 2}, (), None, r"key/value heads 2 \(the target's: 4\)"),
        ({"vocab_size": 32000}, (), None, r"vocabulary size 32000 \(the target's: 49152\)"),
        (
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}},
            (),
            None,
            r"layers \[1, 2, 9\], of which \[9\] the target's 4 layers lack",
        ),
        ({}, (), _out_of_range_d2t, "outside the target's vocabulary"),
        ({}, ("midlayer.mlp.down_proj.weight",), None, "incomplete"),
        ({"speculators_config": {}}, (), None, "speculators"),
        ({"draft_vocab_size": None, "architectures": ["LlamaForCausalLM"]}, (), None, "choose the EAGLE drafter"),
    ],
    ids=["hidden-size", "kv-heads", "vocabulary", "layers", "d2t", "missing-tensor", "speculators", "eagle2"],
)
def test_a_head_for_another_target_is_refused_naming_what_differs(bigram, tmp_path, extra, drop, breakage, message):
    backend, head = bigram
    folder = tmp_path / "head"
    write_published(folder, head, extra=extra, drop=drop)
    if extra.get("draft_vocab_size", 0) is None:  # an EAGLE-1/2 config
        data = json.loads((folder / "config.json").read_text())
        del data["draft_vocab_size"]
        (folder / "config.json").write_text(json.dumps(data))
    if breakage is not None:
        breakage(folder)
    with pytest.raises(ModelLoadError, match=message):
        make_drafter("eagle3", backend, heads=str(folder))


def test_a_non_llama_target_is_refused_and_the_eagle_drafter_points_here(bigram, tmp_path):
    backend, head = bigram
    folder = write_published(tmp_path / "head", head)
    other = copy.copy(backend.text_config)
    other.model_type = "gemma2"
    with pytest.raises(ModelLoadError, match="needs a Llama-family target .* 'gemma2'"):
        load_head(folder, other)
    with pytest.raises(ModelLoadError, match="choose the EAGLE-3 drafter"):
        make_drafter("eagle", backend, heads=folder)


def test_eagle3_on_llama_cpp_says_to_use_the_torch_backend(default_llama, bigram, tmp_path):
    _, head = bigram
    with pytest.raises(ConfigError, match="PyTorch backend"):
        make_drafter("eagle3", default_llama, heads=write_published(tmp_path / "h", head))


def test_preflight_reads_the_head_and_names_what_differs(bigram, bigram_path, tmp_path):
    from engine import preflight

    _, head = bigram
    config = EngineConfig(target=bigram_path, backend="torch")
    good = preflight(config.with_drafter("eagle3", heads=write_published(tmp_path / "good", head)))
    finding = next(f for f in good.findings if f.title == "The EAGLE-3 head fits the target")
    assert finding.severity == "ok" and "reading layers [0, 2, 3]" in finding.detail
    layers = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 31]}}
    wrong = write_published(tmp_path / "wrong", head, extra=layers)
    bad = preflight(config.with_drafter("eagle3", heads=wrong))
    assert not bad.compatible and any("target layers [2, 31]" in f.detail for f in bad.findings)


def test_cli_generates_with_eagle3(bigram, bigram_path, tmp_path, capsys):
    from engine.cli.main import main

    _, head = bigram
    code = main(
        [
            "generate",
            "--target",
            bigram_path,
            "--drafter",
            "eagle3",
            "--heads",
            write_published(tmp_path / "h", head),
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
    assert json.loads(out)["stats"]["accepted"] > 0


def test_missing_heads_say_how_to_train_some(bigram):
    backend, _ = bigram
    with pytest.raises(ConfigError, match="train-heads --kind eagle3"):
        make_drafter("eagle3", backend)
