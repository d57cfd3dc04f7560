"""Hybrid, recurrent and sliding-window models on the llama.cpp backend: tiny random GGUFs of real
architectures (tests/factories/hybrid_gguf.py) that speculate exactly, as target and as draft."""

from __future__ import annotations

import threading

import llama_cpp
import pytest
import torch

from engine.api import Engine
from engine.backends.llama_cpp import LlamaCppBackend
from engine.core.sampling import SamplingConfig
from engine.errors import ModelLoadError, OutOfMemoryError
from tests.engine.drafters.build import legacy_config
from tests.factories.gguf_models import make_tiny_gguf
from tests.factories.hybrid_gguf import (
    make_gemma3_gguf,
    make_gemma4_gguf,
    make_granite_hybrid_gguf,
    make_lfm2_gguf,
    make_mamba2_gguf,
    make_nemotron_h_gguf,
    make_qwen35_gguf,
)
from tests.stats_helpers import first_two_tokens

HYBRIDS = {
    "qwen35": make_qwen35_gguf,
    "lfm2": make_lfm2_gguf,
    "nemotron_h": make_nemotron_h_gguf,
    "granitehybrid": make_granite_hybrid_gguf,
}
RECURRENT = [*HYBRIDS, "mamba2"]  # and a model with no attention at all
REPEAT = "one two three four five one two three four five one two three four five one two three"
GREEDY = SamplingConfig(temperature=0.0, max_tokens=40)
MIX = 0.3
NEAR = 0.35


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """For each architecture, a target and a model near it: the same random draws, its layers
    weighing a little more (a draft that agrees with the target often, not always)."""
    root = tmp_path_factory.mktemp("hybrid")
    made = {  # mix=0.3: the reply repeats itself now and then, so n-gram drafts are kept and rejected
        arch: (make(str(root / f"{arch}.gguf"), mix=MIX), make(str(root / f"{arch}-near.gguf"), mix=NEAR))
        for arch, make in HYBRIDS.items()
    }
    made["mamba2"] = (make_mamba2_gguf(str(root / "mamba2.gguf"), mix=MIX),)
    made["llama"] = (make_tiny_gguf(str(root / "llama.gguf")),)
    made["gemma3"] = (make_gemma3_gguf(str(root / "gemma3.gguf"), sliding_window=4, mix=MIX),)
    made["gemma4"] = (make_gemma4_gguf(str(root / "gemma4.gguf"), sliding_window=4, mix=MIX),)
    return made


def load(target: str, drafter: str = "ngram", draft: str | None = None, k: int = 4) -> Engine:
    return Engine.load(legacy_config(target=target, drafter=drafter, draft=draft, k=k, measure_costs=False))


def greedy_comparison(engine: Engine):
    comparison = engine.compare(engine.prompt_ids(REPEAT), GREEDY)
    assert comparison.identical, comparison.divergence
    return comparison.speculative.stats


@pytest.mark.parametrize("arch", RECURRENT)
def test_greedy_ngram_speculation_equals_vanilla_through_accepts_and_rejections(files, arch):
    engine = load(files[arch][0])
    try:
        assert engine.target.replays_on_rollback and "recurrent" in engine.target.info.forward
        s = greedy_comparison(engine)
        assert s.accepted > 0 and s.tested > s.accepted  # drafts both kept and rolled back
    finally:
        engine.close()


@pytest.mark.parametrize("arch", HYBRIDS)
def test_greedy_draft_model_speculation_equals_vanilla(files, arch):
    target, other = files[arch]
    same = load(target, drafter="draft", draft=target)
    try:
        s = greedy_comparison(same)
        assert s.drafted > 0 and s.accepted == s.drafted  # the model drafting for itself: all kept
    finally:
        same.close()
    different = load(target, drafter="draft", draft=other)
    try:
        assert different.drafter.backend.replays_on_rollback  # a hybrid draft rolls back too
        s = greedy_comparison(different)
        assert s.accepted > 0 and s.tested > s.accepted  # another model: rejections, both caches rolled back
    finally:
        different.close()


def test_a_hybrid_draft_model_drafts_exactly_for_a_transformer_target(files):
    engine = load(files["llama"][0], drafter="draft", draft=files["lfm2"][0])
    try:
        assert not engine.target.replays_on_rollback
        s = greedy_comparison(engine)
        assert s.drafted > 0
    finally:
        engine.close()


@pytest.mark.parametrize("arch", HYBRIDS)  # every hybrid: a few seconds each
def test_sampled_speculation_keeps_the_target_distribution(files, arch):
    target, other = files[arch]
    engine = load(target, drafter="draft", draft=other, k=3)
    try:
        pvalue, accepted = first_two_tokens(engine, engine.prompt_ids("Once upon a time"), top_k=3, draws=160)
        assert accepted > 0
        assert pvalue > 1e-3
    finally:
        engine.close()


@pytest.mark.parametrize("arch", RECURRENT)
def test_after_a_rejection_the_state_equals_a_fresh_pass_over_the_kept_tokens(files, arch):
    path = files[arch][0]
    backend, fresh = LlamaCppBackend(path, n_ctx=256), LlamaCppBackend(path, n_ctx=256)
    try:
        prompt = backend.tokenize(REPEAT)
        backend.prefill(prompt)
        draft = [backend.tokenize(" apple")[0], *backend.tokenize(" banana cherry date elder")]
        for token in draft[:2]:  # a draft model's single-token forwards...
            backend.forward([token])
        backend.forward(draft[2:])  # ...and a verification's block
        for kept in (len(prompt) + 4, len(prompt) + 1, 3):  # inside the block, between forwards, deep in the prompt
            backend.rollback(kept)
            after = backend.forward([draft[-1]])[-1]
            fresh.prefill([])
            expected = fresh.forward((prompt + draft)[:kept] + [draft[-1]], all_logits=False)[-1]
            torch.testing.assert_close(after, expected, atol=1e-3, rtol=1e-4)
            assert after.argmax() == expected.argmax()
            backend.rollback(kept)
    finally:
        backend.close()
        fresh.close()


def test_a_second_reply_to_the_same_prompt_restores_the_prompt_instead_of_running_it_again(files):
    engine = load(files["lfm2"][0])
    try:
        prompt = engine.prompt_ids(REPEAT)
        first = engine.generate(prompt, GREEDY, speculative=False)  # 40 forwards: more than the ring keeps
        states = engine.target._states
        replayed = states.replayed
        again = engine.generate(prompt, GREEDY, speculative=False)
        assert again.tokens == first.tokens
        assert states.replayed == replayed  # the prompt's state restored, not one token run again
    finally:
        engine.close()


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_cancelled_run_leaves_the_cache_usable(files, arch):
    target, other = files[arch]
    engine = load(target, drafter="draft", draft=other)
    try:
        prompt = engine.prompt_ids(REPEAT)
        full = engine.generate(prompt, GREEDY)
        cancel = threading.Event()
        seen = []
        for event in engine.stream(prompt, GREEDY, cancel=cancel):
            seen.append(event)
            if len(seen) == 3:
                cancel.set()
        assert seen[-1].finish_reason == "cancelled"
        assert engine.generate(prompt, GREEDY).tokens == full.tokens
        stream = engine.stream(prompt, GREEDY)  # abandoned half-way, as a closing window does
        next(stream)
        stream.close()
        assert engine.generate(prompt, GREEDY).tokens == full.tokens
    finally:
        engine.close()


def test_a_model_whose_state_cannot_be_restored_is_refused_at_load(files, monkeypatch):
    monkeypatch.setattr(llama_cpp, "llama_state_seq_set_data_ext", lambda *args: 0)  # an older build's failure
    with pytest.raises(ModelLoadError, match="recurrent .* cannot do that for it: llama.cpp could not restore"):
        LlamaCppBackend(files["lfm2"][0], n_ctx=256)


def test_a_checkpoint_that_does_not_fit_is_an_out_of_memory_error_and_the_model_stays_usable(files):
    engine = load(files["lfm2"][0])
    try:
        prompt = engine.prompt_ids(REPEAT)
        full = engine.generate(prompt, GREEDY)
        states = engine.target._states
        size, states._size = states._size, 1 << 46  # 64 TiB: no allocator gives that
        states._buffers = []
        states.clear()
        seen = []
        with pytest.raises(OutOfMemoryError, match="checkpoint of the recurrent state"):
            for event in engine.stream(prompt, GREEDY):
                seen.append(event)
        states._size = size
        assert engine.generate(prompt, GREEDY).tokens == full.tokens
    finally:
        engine.close()


@pytest.mark.parametrize("arch", ["gemma3", "gemma4"])
def test_sliding_window_speculation_equals_vanilla_with_a_window_shorter_than_the_prompt(files, arch):
    engine = load(files[arch][0])
    try:
        assert llama_cpp.llama_model_n_swa(engine.target._model) == 4
        assert not engine.target.replays_on_rollback
        assert "full cache" in engine.target.info.forward
        s = greedy_comparison(engine)  # the prompt is ~20 tokens, drafts roll back past the window's start
        assert s.accepted > 0 and s.tested > s.accepted
    finally:
        engine.close()


def test_a_sliding_window_cache_rolls_back_far_behind_the_window(files):
    """A new chat turn keeps only the prefix it shares with the last one: far behind the window. A
    cache of the window alone (swa_full off) has dropped those tokens by then (checked: logits off by 5)."""
    path = files["gemma3"][0]
    backend, fresh = LlamaCppBackend(path, n_ctx=2048), LlamaCppBackend(path, n_ctx=2048)
    try:
        ids = [100 + (i * 37) % 5000 for i in range(1200)]
        backend.prefill(ids)
        assert llama_cpp.llama_memory_seq_pos_min(backend._mem, 0) == 0  # every token's KV still there
        backend.rollback(100)
        after = backend.forward([ids[100]])[-1]
        torch.testing.assert_close(after, fresh.forward(ids[:101])[-1], atol=1e-2, rtol=1e-3)
    finally:
        backend.close()
        fresh.close()


def test_plain_decoding_saves_no_state_per_token_and_speculation_still_rolls_back_exactly(files):
    """A vanilla run never rolls back, so it pays for no checkpoint per token (a save costs ~7% of
    a forward at a real model's state size: the speedup against vanilla would read high); the
    speculative run after it on the same prompt still matches it token for token."""
    engine = load(files["qwen35"][0])
    try:
        states = engine.target._states
        prompt = engine.prompt_ids(REPEAT)
        saves = states.saves
        engine.generate(prompt, GREEDY, speculative=False)
        assert states.saves - saves <= 2  # the prefill's only: before it and the prompt's own
        assert engine.target.checkpoint_forwards  # back on for whatever runs next
        greedy_comparison(engine)
        assert states.saves - saves > GREEDY.max_tokens // 4  # speculative steps do save
    finally:
        engine.close()
