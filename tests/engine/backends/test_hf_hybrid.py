"""Hybrid targets (recurrent + attention layers) and sliding-window ones on transformers' own forward.

A rejected draft on Qwen3.5, LFM2 or Nemotron-H is undone by restoring a state checkpoint and
replaying the kept tokens after it (engine/backends/checkpoints.py); a sliding-window model
(Gemma 3) keeps its sliding layers whole so that a cut undoes it. What a user notices: the
speculative reply is the plain one, token for token, with drafts both accepted and rejected;
sampling keeps the target's law; the model after a rollback is the model run fresh over
the kept tokens; a cancelled reply leaves the model usable.
"""

from __future__ import annotations

import threading

import pytest
import torch

from engine.api import Engine, EngineConfig
from engine.backends.hf.backend import TorchBackend
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.errors import ConfigError
from tests.engine.drafters.build import make_drafter
from tests.factories.hybrid_models import ARCHITECTURES, make_hybrid_model
from tests.stats_helpers import first_two_tokens

GREEDY = SamplingConfig(max_tokens=30)
TEXT = "The quick brown fox jumps over the lazy dog. The quick brown"
NOISE = 0.03  # the draft model: the target's weights, this far off (drafts accepted and rejected)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(target, draft) folders by architecture, made on first use."""
    made = {}

    def get(arch):
        if arch not in made:
            root = tmp_path_factory.mktemp(arch)
            made[arch] = (
                make_hybrid_model(root / "target", arch, seed=1),
                make_hybrid_model(root / "draft", arch, seed=1, noise=NOISE),
            )
        return made[arch]

    return get


def load(folder) -> TorchBackend:
    return TorchBackend(folder, dtype="float32")


def model_engine(target, draft_folder, k=4) -> Engine:
    drafter = make_drafter("model", target, draft=draft_folder, dtype="float32")
    return Engine(target, drafter, EngineConfig(drafter="model", k=k), CostModel())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_speculative_reply_is_the_plain_one_with_drafts_kept_and_rejected(folders, arch):
    target_dir, draft_dir = folders(arch)
    target = load(target_dir)
    assert target.replays_on_rollback  # recurrent layers: rollbacks restore and replay
    engine = model_engine(target, draft_dir)
    prompt = target.tokenize(TEXT)
    speculative = engine.generate(prompt, GREEDY)
    plain = engine.generate(prompt, GREEDY, speculative=False)
    assert speculative.tokens == plain.tokens
    stats = speculative.stats
    assert 0 < stats.accepted < stats.drafted  # some drafts kept, some rejected (each a restore + replay)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_model_after_a_rollback_is_the_model_run_fresh_over_the_kept_tokens(folders, arch):
    target_dir, _ = folders(arch)
    backend, fresh = load(target_dir), load(target_dir)
    ids = list(range(300, 340))
    backend.prefill(ids[:20])
    backend.forward(ids[20:25])  # a verify of 5 rows
    backend.forward(ids[25:27])
    for kept in (26, 22, 21):  # inside the last forward, inside the one before, at its checkpoint
        backend.rollback(kept)
        fresh.prefill(ids[:kept])
        torch.testing.assert_close(backend.forward([ids[kept]]), fresh.forward([ids[kept]]), rtol=1e-4, atol=1e-4)
        backend.rollback(kept)
        fresh.rollback(kept)
    # Before every checkpoint (the ring keeps 16): the whole cache is rebuilt, as exact.
    for i in range(27, 45):
        backend.forward([ids[i % len(ids)]])
    backend.rollback(10)
    fresh.prefill(ids[:10])
    torch.testing.assert_close(backend.forward([ids[10]]), fresh.forward([ids[10]]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_sampled_speculative_tokens_follow_the_targets_law(folders, arch):
    target_dir, draft_dir = folders(arch)
    engine = model_engine(load(target_dir), draft_dir, k=3)
    prompt = engine.target.tokenize(TEXT)
    pvalue, accepted = first_two_tokens(engine, prompt, top_k=3, draws=150)
    assert accepted > 0
    assert pvalue > 1e-3


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_cancelled_reply_leaves_the_model_usable(folders, arch):
    target_dir, draft_dir = folders(arch)
    engine = model_engine(load(target_dir), draft_dir)
    prompt = engine.target.tokenize(TEXT)
    cancel = threading.Event()
    events = []
    for event in engine.stream(prompt, SamplingConfig(max_tokens=40), cancel=cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert events[-1].finish_reason == "cancelled"
    again = engine.generate(prompt, GREEDY)
    fresh = Engine(load(target_dir), None, EngineConfig(), CostModel()).generate(prompt, GREEDY, speculative=False)
    assert again.tokens == fresh.tokens


def test_an_interrupted_forward_leaves_the_state_as_it_was(folders):
    target_dir, _ = folders("lfm2")
    backend, fresh = load(target_dir), load(target_dir)
    ids = list(range(300, 330))
    backend.prefill(ids[:12])
    backend.forward(ids[12:15])
    calls = 0
    layer = backend._model.base_model.layers[2]  # a convolution layer: its state is half updated

    def interrupt(module, args):
        nonlocal calls
        calls += 1
        raise KeyboardInterrupt

    handle = layer.register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        backend.forward(ids[15:19])
    handle.remove()
    assert calls == 1 and len(backend.tokens) == 15
    fresh.prefill(ids[:15])
    torch.testing.assert_close(backend.forward([ids[15]]), fresh.forward([ids[15]]), rtol=1e-4, atol=1e-4)


# -- drafters on a hybrid target -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ngram", "suffix"])
def test_model_free_drafters_decode_a_hybrid_target_losslessly(folders, kind):
    target = load(folders("lfm2")[0])
    engine = Engine(target, make_drafter(kind, target), EngineConfig(drafter=kind, k=4), CostModel())
    prompt = target.tokenize(TEXT * 3)
    assert engine.generate(prompt, GREEDY).tokens == engine.generate(prompt, GREEDY, speculative=False).tokens


def test_medusa_heads_draft_a_hybrid_target_as_chains(folders, tmp_path):
    """Medusa reads the hidden features and LM head that transformers' forward gives; its trees go
    as their best branch (no tree verify there), and the run says so."""
    from engine.heads.medusa import MedusaConfig, MedusaHeads

    target = load(folders("lfm2")[0])
    heads = MedusaHeads(MedusaConfig(3, 1, target.hidden_size, target.vocab_size, shared_lm_head=True, base_model="t"))
    heads.save(str(tmp_path / "heads"))
    drafter = make_drafter("medusa", target, heads=str(tmp_path / "heads"))
    engine = Engine(target, drafter, EngineConfig(drafter="medusa", k=4), CostModel())
    prompt = target.tokenize(TEXT)
    speculative = engine.generate(prompt, GREEDY)
    assert speculative.tokens == engine.generate(prompt, GREEDY, speculative=False).tokens
    assert speculative.stats.drafted > 0
    assert any("most likely branch" in note for note in speculative.stats.notes)


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("lookahead", "verifies its drafts as a tree in one forward with a custom attention mask"),
        ("early-exit", "runs the target's first layers on their own"),
        ("eagle", "verifies its drafts as a tree"),
        ("eagle3", "reads the hidden states of several of the target's layers"),
    ],
)
def test_drafters_that_need_the_native_forward_are_refused_saying_why(folders, kind, reason):
    """Trees, early exit and per-layer features need the native forward, which covers
    llama/mistral/qwen2/qwen3: on a hybrid the drafter is refused with that reason, not a traceback."""
    target = load(folders("lfm2")[0])
    with pytest.raises(ConfigError, match=reason) as refused:
        make_drafter(kind, target)
    message = str(refused.value)
    assert "native implementation" in message and "lfm2 runs on transformers' own forward" in message
    assert "--backend torch" not in message  # it is on PyTorch already: that advice would lead nowhere


# -- sliding-window attention (Gemma 3) -----------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3")
    window = 8  # far shorter than the prompt: the sliding layers' window matters
    return (
        make_hybrid_model(root / "target", "gemma3_text", seed=2, n_layers=6, window=window),
        make_hybrid_model(root / "draft", "gemma3_text", seed=2, n_layers=6, window=window, noise=NOISE),
    )


def test_a_sliding_window_model_rolls_back_by_a_cut_and_still_attends_within_its_window(gemma):
    target = load(gemma[0])
    assert not target.replays_on_rollback and "sliding-window layers keep every position" in target.info.forward
    prompt = target.tokenize(TEXT)
    assert len(prompt) > 8
    engine = model_engine(target, gemma[1])
    speculative = engine.generate(prompt, GREEDY)
    plain = engine.generate(prompt, GREEDY, speculative=False)
    assert speculative.tokens == plain.tokens
    assert 0 < speculative.stats.accepted < speculative.stats.drafted
    # transformers' own generate, with its own sliding cache, gives the same reply: the window holds
    model = target._model
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        theirs = model.generate(ids, max_new_tokens=len(plain.tokens), do_sample=False, eos_token_id=None)
    assert tuple(theirs[0, len(prompt) :].tolist()) == plain.tokens


def test_gpt_oss_sliding_layers_kept_whole_still_attend_within_the_window():
    """gpt-oss (attention sinks, sliding and full layers): cached in two calls with its sliding
    layers kept whole, its logits are those of one pass without a cache, where the window matters."""
    import transformers

    from engine.backends.hf.hybrid_cache import window_cache

    config = transformers.GptOssConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.arange(100, 130)[None]
    cache = window_cache(model.config)
    assert all(type(layer).__name__ == "DynamicLayer" for layer in cache.layers)
    with torch.inference_mode():
        whole = model(input_ids=ids, use_cache=False).logits[0]
        cached = torch.cat(
            [model(input_ids=part, cache=cache, use_cache=True).logits[0] for part in (ids[:, :20], ids[:, 20:])]
        )
        config.sliding_window = 4096  # the same weights with no window: different logits
        unwindowed = model(input_ids=ids, use_cache=False).logits[0]
    torch.testing.assert_close(cached, whole, rtol=1e-4, atol=1e-4)
    assert (unwindowed - whole).abs().max() > 0.05


def test_plain_decoding_saves_no_state_per_token(folders):
    """A plain run never rolls back: it keeps no checkpoint per forward (each is a copy of every
    recurrent state, which would slow it and inflate every speedup measured against it)."""
    target_dir, draft_dir = folders("qwen3_5")
    target = load(target_dir)
    engine = model_engine(target, draft_dir)
    prompt = target.tokenize(TEXT)
    plain = engine.generate(prompt, GREEDY, speculative=False)
    assert len(target._checkpoints) <= 1  # at most the prompt's
    assert target.checkpoint_forwards  # back on for what runs next
    assert engine.generate(prompt, GREEDY).tokens == plain.tokens
    assert len(target._checkpoints) > 1  # the speculative steps saved theirs
