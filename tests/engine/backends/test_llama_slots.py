"""Several sequences on one llama.cpp context (Slots): a batch gives each sequence what it would get
alone, on the embedded SmolLM2-135M Q4_1 and on tiny float32 GGUFs (one of them a Qwen3.5 hybrid)."""

from __future__ import annotations

import llama_cpp
import pytest
import torch

import engine.backends.llama_cpp as llama_cpp_backend
from engine.api import collect
from engine.backends.capabilities import Slots, has
from engine.backends.llama_cpp import LlamaCppBackend
from engine.backends.slots import BatchCall, SlotsFull
from engine.core.batch import Batch
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.sampling import SamplingConfig
from engine.drafters.model import ModelDrafter
from engine.drafters.ngram import NgramDrafter
from engine.errors import ConfigError, ContextOverflowError, OutOfMemoryError
from tests.factories.gguf_models import default_gguf_path, make_tiny_gguf
from tests.factories.hybrid_gguf import make_qwen35_gguf

PROMPTS = [
    "The capital of France is",
    "Speculative decoding lets a small draft model propose several tokens that a larger model",
    "def fibonacci(n):",
]
TIGHT = 1e-4  # float32 weights: the batch and a solo forward differ only in summation order
# A recurrent layer's rows run in ubatches of as many rows per sequence (llama.cpp's split_equal), so
# a batch of uneven calls runs them in other groups than alone: ~1e-4 to 1e-3 apart. A state restored
# from the wrong sequence or position is off by 0.1 and more.
HYBRID = 2e-3
# Attention over the F16 cache sums in an order that depends on where rows sit and how many run
# together: after one sequence frees cells, another's next tokens land there, before its older
# ones (0.008 apart on the tiny model; refilling the freed cells gives the first result back, bit
# for bit), and 250 rows at once against 1 alone over 255 cached tokens came 0.015 apart.
SUMMED_OTHERWISE = 0.05


@pytest.fixture(scope="module")
def smol():
    b = LlamaCppBackend(default_gguf_path(), n_ctx=256, slots=3)
    yield b
    b.close()


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_gguf(str(tmp_path_factory.mktemp("gguf") / "tiny.gguf"), embedding_type="F32")


@pytest.fixture(scope="module")
def hybrid_path(tmp_path_factory):
    return make_qwen35_gguf(str(tmp_path_factory.mktemp("gguf") / "qwen35.gguf"), mix=0.3)


def sequences(backend, n=3):
    """The backend and n - 1 slots, all empty."""
    backend.rollback(0)
    return [backend] + [backend.open_slot() for _ in range(n - 1)]


def close_slots(seqs):
    for s in seqs[1:]:
        s.close()


def solo(s, tokens):
    """What `tokens` give on s alone, s's cache left as it was."""
    start = len(s.tokens)
    logits = s.forward(tokens)
    s.rollback(start)
    return logits


def batch(backend, seqs, rows):
    return backend.forward_batch([BatchCall(s, r) for s, r in zip(seqs, rows)])


def mixed_prefixes(backend):
    """Three caches of different lengths and three calls of different row counts."""
    ids = [backend.tokenize(p) for p in PROMPTS]
    cuts = (3, 1, 2)
    return [i[:-c] for i, c in zip(ids, cuts)], [i[-c:] for i, c in zip(ids, cuts)]


# -- one batch, each sequence as alone ---------------------------------------------------


@pytest.mark.parametrize("model", ["tiny", "hybrid"])
def test_batch_gives_each_sequence_its_solo_logits_on_float32_models(tiny_path, hybrid_path, model):
    b = LlamaCppBackend(tiny_path if model == "tiny" else hybrid_path, n_ctx=64, slots=3)
    tolerance = TIGHT if model == "tiny" else HYBRID
    try:
        seqs = sequences(b)
        prefixes, rows = mixed_prefixes(b)
        for s, p in zip(seqs, prefixes):
            s.prefill(p)
        expected = [solo(s, r) for s, r in zip(seqs, rows)]
        got = batch(b, seqs, rows)
        for s, p, r, e, g in zip(seqs, prefixes, rows, expected, got):
            assert g.shape == (len(r), b.vocab_size) and g.dtype == torch.float32
            assert torch.allclose(g, e, atol=tolerance, rtol=0), (g - e).abs().max()
            assert s.tokens == p + r
    finally:
        b.close()


def test_batch_on_the_quantized_model_picks_what_each_solo_forward_picks(smol):
    seqs = sequences(smol)
    try:
        prefixes, rows = mixed_prefixes(smol)
        for s, p in zip(seqs, prefixes):
            s.prefill(p)
        expected = [solo(s, r) for s, r in zip(seqs, rows)]
        for e, g in zip(expected, batch(smol, seqs, rows)):
            assert torch.equal(g.argmax(-1), e.argmax(-1))
            assert (g - e).abs().max() < 2.0  # Q4_1 kernels round differently for other row counts
    finally:
        close_slots(seqs)


def test_greedy_replies_decoded_together_equal_each_decoded_alone(smol):
    seqs = sequences(smol)
    try:
        prompts = [smol.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]

        def greedy_alone(s, prompt, n=8):
            s.prefill(prompt[:-1])
            token, reply = prompt[-1], []
            for _ in range(n):
                token = int(s.forward([token])[-1].argmax())
                reply.append(token)
            return reply

        alone = [greedy_alone(s, p) for s, p in zip(seqs, prompts)]
        for s, p in zip(seqs, prompts):
            s.prefill(p[:-1])
        last, together = [p[-1] for p in prompts], [[] for _ in seqs]
        for _ in range(8):
            logits = batch(smol, seqs, [[t] for t in last])
            last = [int(row[-1].argmax()) for row in logits]
            for reply, t in zip(together, last):
                reply.append(t)
        assert together == alone
        assert len({tuple(r) for r in together}) == 3  # three different replies, not one repeated
    finally:
        close_slots(seqs)


@pytest.mark.parametrize("model", ["tiny", "smol"])
def test_rolling_back_one_sequence_leaves_the_others_as_they_were(request, tiny_path, model):
    b = request.getfixturevalue("smol") if model == "smol" else LlamaCppBackend(tiny_path, n_ctx=64, slots=3)
    seqs = sequences(b)
    try:
        prefixes, rows = mixed_prefixes(b)
        for s, p in zip(seqs, prefixes):
            s.prefill(p)
        batch(b, seqs, rows)
        follow = [[5, 6], [7], [8, 9, 10]]
        before = [solo(s, f) for s, f in zip(seqs, follow)]
        seqs[1].rollback(len(prefixes[1]) - 4)  # as a rejected draft would
        assert seqs[1].tokens == prefixes[1][:-4]
        assert [s.tokens for s in (seqs[0], seqs[2])] == [prefixes[0] + rows[0], prefixes[2] + rows[2]]
        after = [solo(s, f) for s, f in zip(seqs, follow)]
        got = batch(b, seqs, follow)
        # Sequences 0 and 2 predict what they did before the rollback, and the batch what each alone
        # does (the rollback left free cells among the used ones: SUMMED_OTHERWISE).
        for e, g in [(before[0], after[0]), (before[2], after[2]), *zip(after, got)]:
            if model == "tiny":
                assert torch.allclose(g, e, atol=SUMMED_OTHERWISE, rtol=0), (g - e).abs().max()
            else:  # Q4_1 rounds its activations: a small difference in attention can move a logit by 1
                assert torch.equal(g.argmax(-1), e.argmax(-1)) and (g - e).abs().max() < 2.0
        assert (after[1] - before[1]).abs().max() > 1.0  # sequence 1's own cache did change
    finally:
        close_slots(seqs)
        if model == "tiny":
            b.close()


def test_a_hybrid_sequence_rolls_back_on_its_own_state(hybrid_path):
    """Each sequence of a recurrent model restores its own checkpoint: after one rolls back into
    the last batch, it gives what a fresh model gives on its kept tokens, and the others what they
    gave before."""
    b = LlamaCppBackend(hybrid_path, n_ctx=64, slots=3)
    fresh = LlamaCppBackend(hybrid_path, n_ctx=64)
    try:
        seqs = sequences(b)
        prefixes, rows = mixed_prefixes(b)
        for s, p in zip(seqs, prefixes):
            s.prefill(p)
        batch(b, seqs, rows)
        follow = [[5, 6], [7], [8, 9, 10]]
        before = [solo(s, f) for s, f in zip(seqs, follow)]
        seqs[0].rollback(len(prefixes[0]) + 1)  # inside the batch's rows: restore and replay
        assert b._states.restores >= 1
        fresh.prefill(prefixes[0] + rows[0][:1])
        expected = [fresh.forward(follow[0]), before[1], before[2]]
        for e, g in zip(expected, batch(b, seqs, follow)):
            assert torch.allclose(g, e, atol=HYBRID, rtol=0), (g - e).abs().max()
        assert (expected[0] - before[0]).abs().max() > 0.1  # the rollback changed what sequence 0 predicts
    finally:
        b.close()
        fresh.close()


@pytest.mark.parametrize("model", ["tiny", "hybrid"])
def test_speculative_replies_decoded_as_a_batch_equal_each_decoded_alone(tiny_path, hybrid_path, model, monkeypatch):
    """The batched decode step (engine/core/batch.py) on llama.cpp: n-gram drafts kept and rejected
    in every sequence, each rolled back on its own, and the same greedy replies as one at a time."""
    b = LlamaCppBackend(tiny_path if model == "tiny" else hybrid_path, n_ctx=128, slots=3)
    try:
        texts = ["one two three four five one two three four five one two", "a b c a b c a b", PROMPTS[0]]
        prompts = [b.tokenize(t) for t in texts]
        greedy = SamplingConfig(temperature=0.0, max_tokens=30)
        alone = [
            collect(list(decode_steps(b, p, greedy, drafter=NgramDrafter(), draft_length=DraftLength(4))))
            for p in prompts
        ]
        widths, forward_batch = [], b.forward_batch
        monkeypatch.setattr(b, "forward_batch", lambda calls: widths.append(len(calls)) or forward_batch(calls))
        batch = Batch(b, CostModel(), capacity=3)
        joined = [batch.join(p, greedy, drafter=NgramDrafter(), draft_length=DraftLength(4)) for p in prompts]
        events = {id(s): [] for s in joined}
        while batch.sequences:
            for s, outcome in batch.step():
                assert not isinstance(outcome, BaseException), outcome
                events[id(s)].append(outcome)
        batch.close()
        together = [collect(events[id(s)]) for s in joined]
        assert [r.tokens for r in together] == [r.tokens for r in alone]
        assert max(widths) == 3
        assert sum(r.stats.tested - r.stats.accepted for r in together) > 0  # some drafts were rolled back
    finally:
        b.close()


def test_a_hybrid_draft_model_on_slots_drafts_together_and_changes_no_reply(hybrid_path, tmp_path, monkeypatch):
    """Draft and target both hybrids with three slots each: the drafts of three sequences run as one
    forward_batch per position on the draft model, and every reply is its solo reply."""
    target = LlamaCppBackend(hybrid_path, n_ctx=128, slots=3)
    draft = LlamaCppBackend(make_qwen35_gguf(str(tmp_path / "near.gguf"), mix=0.35), n_ctx=128, slots=3)
    try:
        texts = ["one two three four five one two three", "a b c a b c a b", PROMPTS[0]]
        prompts = [target.tokenize(t) for t in texts]
        greedy = SamplingConfig(temperature=0.0, max_tokens=25)
        alone = [
            collect(
                list(decode_steps(target, p, greedy, drafter=ModelDrafter(draft, 49152), draft_length=DraftLength(3)))
            )
            for p in prompts
        ]
        widths, forward_batch = [], draft.forward_batch
        monkeypatch.setattr(draft, "forward_batch", lambda calls: widths.append(len(calls)) or forward_batch(calls))
        drafters = [ModelDrafter(draft, 49152)] + [
            ModelDrafter(draft.open_slot(), 49152, owner=draft) for _ in range(2)
        ]
        batch = Batch(target, CostModel(), capacity=3)
        joined = [batch.join(p, greedy, drafter=d, draft_length=DraftLength(3)) for p, d in zip(prompts, drafters)]
        events = {id(s): [] for s in joined}
        while batch.sequences:
            for s, outcome in batch.step():
                assert not isinstance(outcome, BaseException), outcome
                events[id(s)].append(outcome)
        batch.close()
        together = [collect(events[id(s)]) for s in joined]
        assert [r.tokens for r in together] == [r.tokens for r in alone]
        assert max(widths) == 3
        assert sum(r.stats.tested - r.stats.accepted for r in together) > 0
    finally:
        target.close()
        draft.close()


# -- context and memory ------------------------------------------------------------------


def test_every_sequence_holds_its_full_context(tiny_path):
    """Three sequences of n_ctx tokens each: three times what one context of n_ctx holds (256 is
    also what llama.cpp rounds a small context up to, so a shared 256 would not be enough)."""
    n_ctx = 256
    b = LlamaCppBackend(tiny_path, n_ctx=n_ctx, slots=3)
    try:
        assert b.n_ctx == n_ctx
        seqs = sequences(b)
        for s, first, n in zip(seqs, (100, 2000, 3000), (200, 150, 100)):
            s.prefill(list(range(first, first + n)))
        batch(b, seqs, [list(range(4000, 4055)), [7], list(range(5000, 5010))])
        assert [len(s.tokens) for s in seqs] == [n_ctx - 1, 151, 110]
        rows = [[9], list(range(6000, 6105)), list(range(7000, 7146))]
        expected = [solo(s, r) for s, r in zip(seqs, rows)]
        for e, g in zip(expected, batch(b, seqs, rows)):
            assert torch.allclose(g, e, atol=SUMMED_OTHERWISE, rtol=0), (g - e).abs().max()
        assert [len(s.tokens) for s in seqs] == [n_ctx] * 3
        with pytest.raises(ContextOverflowError, match=f"{n_ctx} tokens"):
            seqs[2].forward([5])
    finally:
        b.close()


def test_a_call_past_its_sequence_context_raises_before_anything_runs(tiny_path):
    b = LlamaCppBackend(tiny_path, n_ctx=32, slots=2)
    try:
        seqs = sequences(b, 2)
        seqs[0].prefill(list(range(100, 130)))
        with pytest.raises(ContextOverflowError, match="32 tokens"):
            batch(b, seqs, [[1, 2, 3], [4]])
        assert len(seqs[0].tokens) == 30 and seqs[1].tokens == []
        assert [len(g) for g in batch(b, seqs, [[1, 2], [4]])] == [2, 1]
    finally:
        b.close()


def test_a_failed_decode_leaves_every_sequence_as_before(tiny_path, monkeypatch):
    """A batch past n_batch runs in two decodes; when the second finds no memory, the first one's
    rows are taken out again, and the next batch gives the solo logits."""
    monkeypatch.setattr(llama_cpp_backend, "BATCH_SIZE", 64)  # 80 rows: two decodes, quickly
    b = LlamaCppBackend(tiny_path, n_ctx=128, slots=2)
    try:
        seqs = sequences(b, 2)
        for s, first in zip(seqs, (100, 2000)):
            s.prefill(list(range(first, first + 10)))
        rows = [list(range(5000, 5040)), list(range(6000, 6040))]
        decode, calls = llama_cpp.llama_decode, []

        def second_fails(ctx, rows_batch):
            calls.append(rows_batch.n_tokens)
            return -2 if len(calls) == 2 else decode(ctx, rows_batch)

        monkeypatch.setattr(llama_cpp, "llama_decode", second_fails)
        with pytest.raises(OutOfMemoryError, match="Not enough memory"):
            batch(b, seqs, rows)
        monkeypatch.setattr(llama_cpp, "llama_decode", decode)
        assert calls == [64, 16]
        assert [len(s.tokens) for s in seqs] == [10, 10]
        expected = [solo(s, r) for s, r in zip(seqs, rows)]
        for e, g in zip(expected, batch(b, seqs, rows)):  # sequence 1's rows split 24 + 16: SUMMED_OTHERWISE
            assert torch.allclose(g, e, atol=SUMMED_OTHERWISE, rtol=0), (g - e).abs().max()
    finally:
        b.close()


# -- opening and closing slots --------------------------------------------------------------


def test_slots_past_max_slots_are_refused_and_a_closed_one_is_reusable(tiny_path):
    b = LlamaCppBackend(tiny_path, n_ctx=32, slots=3)
    try:
        assert has(b, Slots) and b.max_slots == 3
        one, two = b.open_slot(), b.open_slot()
        assert not has(one, Slots)  # slots are opened on the owner only
        with pytest.raises(SlotsFull, match="3 sequences"):
            b.open_slot()
        one.prefill(list(range(100, 120)))
        one.close()
        with pytest.raises(RuntimeError, match="closed"):
            one.forward([5])
        again = b.open_slot()
        assert again.tokens == []
        assert torch.allclose(again.forward([5, 6]), solo(two, [5, 6]), atol=TIGHT, rtol=0)  # nothing left over
    finally:
        b.close()
    with pytest.raises(RuntimeError, match="closed"):
        two.forward([5])  # closing the owner closed its slots


def test_one_sequence_has_no_slots_and_a_masked_call_on_a_hybrid_is_refused(tiny_path, hybrid_path):
    single = LlamaCppBackend(tiny_path, n_ctx=32)
    try:
        assert not has(single, Slots) and single.max_slots == 1
        with pytest.raises(SlotsFull):
            single.open_slot()
    finally:
        single.close()
    # Masked calls run through sequence ids (tests/engine/backends/test_llama_tree.py), but not on a
    # model with recurrent layers.
    b = LlamaCppBackend(hybrid_path, n_ctx=32, slots=2)
    try:
        seqs = sequences(b, 2)
        masked = BatchCall(seqs[1], [1, 2], offsets=[0, 0], mask=torch.eye(2, dtype=torch.bool), what="a tree")
        with pytest.raises(ConfigError, match="a tree"):
            b.forward_batch([BatchCall(seqs[0], [3]), masked])
        assert seqs[0].tokens == [] and seqs[1].tokens == []
    finally:
        b.close()
