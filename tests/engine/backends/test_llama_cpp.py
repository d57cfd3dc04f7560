"""The llama.cpp backend, on the embedded SmolLM2-135M Q4_1 and on tiny random GGUFs."""

from __future__ import annotations

import os

import pytest
import torch

from engine.backends.llama_cpp import LlamaCppBackend
from engine.errors import ConfigError, ContextOverflowError, ModelLoadError, ModelNotFoundError, SpecDeckError
from tests.factories.gguf_models import default_gguf_path, make_corrupt_gguf, make_not_gguf, make_tiny_gguf

TEXT = (
    "Speculative decoding lets a small draft model propose several tokens that a larger "
    "target model then checks in a single forward pass."
)


@pytest.fixture(scope="module")
def backend():
    b = LlamaCppBackend(default_gguf_path())
    yield b
    b.close()


@pytest.fixture(autouse=True)
def empty_cache(backend):
    backend.rollback(0)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_gguf(str(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


# -- model facts ---------------------------------------------------------------------


def test_info_describes_the_default_model(backend):
    info = backend.info
    assert info.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (info.backend, info.architecture, info.dtype, info.device) == ("llama.cpp", "llama", "Q4_1", "cpu")
    assert (info.vocab_size, info.n_layers, info.context_length) == (49152, 30, 8192)
    assert 100e6 < info.n_params < 200e6
    assert 50e6 < info.weight_bytes < os.path.getsize(info.path)
    assert backend.n_ctx == 4096  # min(trained 8192, default 4096)
    assert backend.vocab_size == 49152


def test_forward_returns_float32_logits_per_token(backend):
    ids = backend.tokenize("The capital of France is")
    logits = backend.forward(ids)
    assert logits.shape == (len(ids), 49152) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert backend.token_text(int(logits[-1].argmax())) == " Paris"
    assert backend.tokens == ids


def test_prefill_logits_equal_the_last_row_of_a_full_forward(backend):
    ids = backend.tokenize(TEXT)
    full = backend.forward(ids)
    backend.rollback(0)
    last = backend.forward(ids, all_logits=False)
    assert last.shape == (1, 49152)
    assert torch.allclose(last[0], full[-1], atol=1e-4)


def test_batched_forward_matches_one_token_at_a_time(backend):
    ids = backend.tokenize(TEXT)
    batched = backend.forward(ids)
    backend.rollback(0)
    single = torch.cat([backend.forward([t]) for t in ids])
    max_diff = (batched - single).abs().max().item()
    agree = (batched.argmax(-1) == single.argmax(-1)).float().mean().item()
    # Q4_1 kernels round differently for 1 and n tokens (max diff ~0.8-1.6 is known);
    # what a user notices is the greedy choice, which must agree almost everywhere.
    assert agree >= 0.85, f"argmax agrees at {agree:.0%} of positions; max |diff| = {max_diff:.3f}"
    assert max_diff < 3.0, f"max |diff| = {max_diff:.3f}"


def test_rollback_then_reforward_reproduces_the_first_pass(backend):
    ids = backend.tokenize(TEXT)
    prompt, draft = ids[:10], ids[10:18]
    backend.forward(prompt, all_logits=False)
    first = backend.forward(draft)  # verify 8 drafts in one call
    accepted = 3
    backend.rollback(len(prompt) + accepted)
    assert backend.tokens == prompt + draft[:accepted]
    again = backend.forward(draft[accepted:])
    assert torch.allclose(again, first[accepted:], atol=1e-5, rtol=0), (again - first[accepted:]).abs().max()

    # A fresh prefill of the accepted text predicts the same next token.
    backend.rollback(0)
    fresh = backend.forward(prompt + draft[:accepted], all_logits=False)
    diff = (fresh[0] - first[accepted - 1]).abs().max().item()
    assert fresh[0].argmax() == first[accepted - 1].argmax() and diff < 2.0, f"max |diff| = {diff:.3f}"


def test_prefill_reuses_the_common_prefix(backend, monkeypatch):
    ids = backend.tokenize(TEXT)
    backend.prefill(ids[:12])
    decoded = []
    original = backend._forward
    monkeypatch.setattr(
        backend, "_forward", lambda toks, all_logits: decoded.append(toks) or original(toks, all_logits)
    )
    backend.prefill(ids[:8] + ids[20:24])  # shares 8 tokens with the cache
    assert decoded == [ids[20:24]]
    assert backend.tokens == ids[:8] + ids[20:24]
    backend.prefill(ids[:8])  # a prefix of the cache: nothing to decode
    assert decoded == [ids[20:24]] and backend.tokens == ids[:8]


# -- context limits ---------------------------------------------------------------------


def test_context_overflow_names_the_context_size_and_keeps_the_cache(tiny_path):
    small = LlamaCppBackend(tiny_path, n_ctx=32)  # the tiny model: the rules are the backend's
    try:
        assert small.n_ctx == 32
        ids = small.tokenize(TEXT)[:20]
        small.forward(ids)
        with pytest.raises(ContextOverflowError, match="32 tokens"):
            small.forward(ids)
        assert small.tokens == ids
        # llama.cpp rounds its context up (to 256 here); past that, llama_decode itself
        # reports "no KV slot", which must come out as the same error, cache intact.
        small.rollback(0)
        with pytest.raises(ContextOverflowError, match="32-token context"):
            small._forward(list(range(100, 400)), False)
        assert small.forward(ids[:2]).shape == (2, 49152)  # decoding resumes at position 0
    finally:
        small.close()


def test_context_size_is_checked_and_clamped(tiny_path):
    with pytest.raises(ConfigError, match="at least 16"):
        LlamaCppBackend(tiny_path, n_ctx=8)
    for asked in (None, 100_000):  # the tiny model is trained for 2048 tokens
        b = LlamaCppBackend(tiny_path, n_ctx=asked)
        assert b.n_ctx == 2048
        b.close()


# -- bad files --------------------------------------------------------------------------


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelNotFoundError, match="nope.gguf"):
        LlamaCppBackend(str(missing))


@pytest.mark.parametrize("kind", ["not_gguf", "truncated_header", "truncated_tensors", "folder"])
def test_bad_files_raise_load_errors(tmp_path, tiny_path, kind):
    path = str(tmp_path / "bad.gguf")
    if kind == "not_gguf":
        make_not_gguf(path)
        expected = "not a GGUF file"
    elif kind == "truncated_header":
        make_corrupt_gguf(path)
        expected = "corrupt or incomplete"
    elif kind == "truncated_tensors":
        make_corrupt_gguf(path, source=tiny_path, keep_bytes=os.path.getsize(tiny_path) // 2)
        expected = "corrupt or incomplete"
    else:
        path = str(tmp_path)
        expected = "folder"
    with pytest.raises(ModelLoadError, match=expected) as caught:
        LlamaCppBackend(path)
    assert isinstance(caught.value, SpecDeckError)
    assert "GGUF" in str(caught.value) or "gguf" in str(caught.value)


def test_bad_token_ids_raise_instead_of_aborting(backend):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        backend.token_text(49152)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        backend.detokenize([5, -1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        backend.forward([5, 60000])
    assert backend.tokens == []
    assert backend.forward([5]).shape == (1, 49152)


# -- text ---------------------------------------------------------------------------------


def test_tokenize_detokenize_round_trip(backend):
    text = "Hello, wörld! 你好 🙂 3.14159 and  two  spaces"
    ids = backend.tokenize(text)
    assert ids and ids[0] != 1  # no BOS
    assert backend.detokenize(ids) == text
    # control tokens are left out of text, but parsed when asked to
    assert backend.detokenize([1, *ids, 2]) == text
    assert backend.tokenize("<|im_start|>user", special=True) == [1, 4093]
    assert 1 not in backend.tokenize("<|im_start|>user")
    assert backend.token_text(1) == "<|im_start|>"


def test_incomplete_utf8_shows_as_replacement_character(backend):
    ids = backend.tokenize("🙂")
    assert len(ids) > 1  # byte-level pieces
    assert backend.detokenize(ids[:1]) == "\ufffd"


def test_chat_template_ends_ready_for_the_reply(backend):
    assert "<|im_start|>" in backend.chat_template
    ids = backend.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    text = backend.detokenize(ids)
    assert "What is 2+2?" in text
    tail = backend.tokenize("<|im_start|>assistant\n", special=True)
    assert ids[-len(tail) :] == tail
    assert ids.count(1) == 3  # system, user, assistant turns; no extra BOS


def test_eos_ids_include_end_of_turn(backend):
    im_end = backend.tokenize("<|im_end|>", special=True)
    assert im_end == [2]
    assert {0, 2} <= backend.eos_ids and 1 not in backend.eos_ids


def test_chat_without_template_falls_back_to_plain_text(tmp_path):
    b = LlamaCppBackend(make_tiny_gguf(str(tmp_path / "base.gguf"), with_chat_template=False))
    try:
        assert b.chat_template is None
        ids = b.apply_chat_template([{"role": "user", "content": "Hi"}])
        assert b.detokenize(ids) == "user: Hi\nassistant:"
    finally:
        b.close()


# -- the tiny GGUF factory ----------------------------------------------------------------


def test_tiny_gguf_shares_the_vocabulary_and_runs(backend, tiny_path):
    assert os.path.getsize(tiny_path) < 12e6
    tiny = LlamaCppBackend(tiny_path, name="tiny")
    try:
        info = tiny.info
        assert (info.name, info.n_layers, info.dtype, info.vocab_size) == ("tiny", 2, "F32", 49152)
        for i in (0, 1, 2, 100, 1000, 30000, 49151):
            assert tiny.token_text(i) == backend.token_text(i)
        assert tiny.tokenize(TEXT) == backend.tokenize(TEXT)
        assert tiny.eos_ids == backend.eos_ids
        logits = tiny.forward(tiny.apply_chat_template([{"role": "user", "content": "Hi"}]))
        assert logits.shape[1] == 49152 and torch.isfinite(logits).all()
        assert logits.std() > 0.1  # random weights, but not a constant output
    finally:
        tiny.close()


@pytest.mark.parametrize("tensor_type", ["Q4_1", "Q8_0"])
def test_tiny_gguf_quantized(tmp_path, tensor_type):
    b = LlamaCppBackend(make_tiny_gguf(str(tmp_path / "q.gguf"), tensor_type=tensor_type, seed=1))
    try:
        assert b.info.dtype == tensor_type
        assert torch.isfinite(b.forward([1, 2, 3])).all()
    finally:
        b.close()


def test_close_is_idempotent_and_final(tiny_path):
    b = LlamaCppBackend(tiny_path)
    b.close()
    b.close()
    for use_after_close in (lambda: b.forward([1]), lambda: b.token_text(1), lambda: b.tokenize("x")):
        with pytest.raises(RuntimeError, match="closed"):
            use_after_close()
