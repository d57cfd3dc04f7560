"""Lookahead decoding: the window's layout, the pool, losslessness (greedy and sampled), clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.api import Engine, collect
from engine.backends.hf.backend import TorchBackend
from engine.backends.llama_cpp import LlamaCppBackend
from engine.config import EngineConfig
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.feeds import fit_draft, masked_block
from engine.core.sampling import SamplingConfig, make_generator
from engine.drafters.base import ChainDraft, ExtraRows, TreeDraft
from engine.drafters.lookahead import (
    LookaheadDrafter,
    auto_parameters,
    cheap_rows,
    window_layout,
)
from engine.errors import ConfigError
from tests.factories.fake import MarkovBackend, MarkovTreeBackend, random_transition
from tests.factories.fake import cycle_transition as cycle
from tests.factories.gguf_models import make_tiny_gguf
from tests.factories.hf_models import make_tiny_model
from tests.stats_helpers import chi_square_pvalue, three_token_law

GREEDY = SamplingConfig(max_tokens=40)
REPEAT = "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese."
OPEN = "Write a short poem about the sea."


class MaskedMarkovBackend(MarkovTreeBackend):
    """The Markov backend with `forward_masked` / `keep_rows`, checking what the loop feeds:
    every row sees the pending token and itself, and only rows at earlier positions."""

    def __init__(self, transition: torch.Tensor, **kwargs) -> None:
        super().__init__(transition, **kwargs)
        self.masked_calls: list[tuple[list[int], list[int], torch.Tensor]] = []
        self._block: tuple[int, list[int]] | None = None

    def forward_masked(self, tokens, offsets, mask, what="a block"):
        n = len(tokens)
        assert tuple(mask.shape) == (n, n) and mask.diagonal().all() and mask[:, 0].all()
        for i, j in torch.nonzero(mask).tolist():
            assert i == j or offsets[j] < offsets[i], (i, j, offsets)
        self.masked_calls.append((list(tokens), list(offsets), mask.clone()))
        self.forward_calls.append(n)
        self._block = (len(self.tokens), list(offsets))
        self._rows = list(tokens)
        self.tokens.extend(tokens)
        return torch.log(self.transition[torch.tensor(tokens)])  # (n, V)

    def keep_rows(self, rows):
        assert self._block is not None, "keep_rows() without forward_masked()"
        base, offsets = self._block
        assert [offsets[r] for r in rows] == list(range(len(rows))), (rows, offsets)  # positions 0, 1, 2...
        kept = [self.tokens[base + r] for r in rows]
        del self.tokens[base:]
        self.tokens.extend(kept)
        self._block = None


def run(backend, prompt, sampling, drafter=None, k=8, costs=None):
    length = DraftLength(k) if drafter is not None else None
    return collect(list(decode_steps(backend, prompt, sampling, drafter=drafter, draft_length=length, costs=costs)))


# -- layout: offsets and masks, by hand -----------------------------------------------------


def test_the_window_layout_matches_the_reference_pattern():
    offsets, mask = window_layout(2, 3)  # rows: L0c1, L0c2, L1c1, L1c2
    assert offsets == (1, 2, 2, 3)
    assert mask.int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],  # level 0 is causal
        [1, 0, 1, 0],  # level 1, column 1: level 0 up to column 1, then itself
        [1, 1, 0, 1],  # level 1, column 2: level 0 up to column 2, then itself
    ]
    offsets, mask = window_layout(1, 4)  # one column, three levels: a chain
    assert offsets == (1, 2, 3) and torch.equal(mask, torch.ones(3, 3, dtype=torch.bool).tril())


def test_the_step_block_puts_tree_and_window_side_by_side():
    offsets, window_mask = window_layout(2, 3)
    draft = TreeDraft([5, 6, 7], parents=(-1, 0, 0), extra=ExtraRows((10, 11, 12, 13), offsets, window_mask))
    tokens, offsets, mask = masked_block(9, draft)
    assert tokens == [9, 5, 6, 7, 10, 11, 12, 13]
    assert offsets == [0, 1, 2, 2, 1, 2, 2, 3]
    assert mask.int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0],  # the pending token
        [1, 1, 0, 0, 0, 0, 0, 0],  # node 0 (depth 1)
        [1, 1, 1, 0, 0, 0, 0, 0],  # node 1 under node 0
        [1, 1, 0, 1, 0, 0, 0, 0],  # node 2 under node 0
        [1, 0, 0, 0, 1, 0, 0, 0],  # level 0, column 1
        [1, 0, 0, 0, 1, 1, 0, 0],  # level 0, column 2
        [1, 0, 0, 0, 1, 0, 1, 0],  # level 1, column 1
        [1, 0, 0, 0, 1, 1, 0, 1],  # level 1, column 2
    ]
    chain = ChainDraft([5, 6], extra=ExtraRows((10,), (1,), torch.ones(1, 1, dtype=torch.bool)))
    assert masked_block(9, chain)[1] == [0, 1, 2, 1]


def test_fit_draft_keeps_the_window_only_where_it_can_run_and_fits():
    offsets, window_mask = window_layout(2, 3)
    draft = TreeDraft([5, 6, 7], parents=(-1, 0, 0), extra=ExtraRows((10, 11, 12, 13), offsets, window_mask))
    kept = fit_draft(draft, 2, True, room=100)
    assert kept.tokens == [5, 6] and kept.extra.tokens == (10, 11, 12, 13)  # k counts nodes only
    assert fit_draft(draft, 3, True, room=7).extra.tokens == (10, 11, 12, 13)  # 3 nodes + 4 rows = 7
    assert fit_draft(draft, 3, True, room=6).extra is None  # one row short: the window goes
    chain = fit_draft(draft, 3, False, room=100)  # a chain-only backend: the best branch, no window
    assert isinstance(chain, ChainDraft) and chain.tokens == [5, 6] and chain.extra is None


def test_a_proposal_is_the_pool_as_a_trie_plus_the_window():
    drafter = LookaheadDrafter(MaskedMarkovBackend(cycle(16)), window=2, ngram=3, candidates=2)
    context = [7, 9, 5, 6, 3, 9, 5, 7, 1, 9]  # 9 is followed by (5, 6) and, later, (5, 7)
    draft = drafter.propose(context, 8, GREEDY, make_generator(0))
    assert draft.tokens == [5, 7, 6] and draft.parents == (-1, 0, 0)  # newest first, shared prefix merged
    assert draft.best_path == (0, 1)
    offsets, window_mask = window_layout(2, 3)
    assert draft.extra.offsets == offsets and torch.equal(draft.extra.mask, window_mask)
    assert len(draft.extra) == 4 and set(draft.extra.tokens) <= set(context[1:])  # drawn from the prompt
    assert drafter.stats().candidates == 2 and drafter.stats().pool_text == 8  # 8 complete 3-grams
    assert drafter.propose(context, 2, GREEDY, make_generator(0)).tokens == [5, 7]  # the node budget
    assert drafter.propose(context, 0, GREEDY, make_generator(0)).tokens == []


def test_text_candidates_with_a_longer_match_before_them_come_first():
    drafter = LookaheadDrafter(MaskedMarkovBackend(cycle(16)), window=1, ngram=3, candidates=3)
    context = [1, 9, 5, 6, 2, 9, 5, 7, 3, 4, 1, 9]  # "1 9" was followed by (5, 6); "2 9", later, by (5, 7)
    draft = drafter.propose(context, 8, GREEDY, make_generator(0))
    assert draft.tokens[:2] == [5, 6]


def test_the_window_turns_into_n_grams_and_moves_up():
    vocab = 32
    drafter = LookaheadDrafter(MaskedMarkovBackend(cycle(vocab)), window=2, ngram=3, candidates=4)
    context = [3, 4, 5, 6]
    draft = drafter.propose(context, 4, GREEDY, make_generator(1))
    level0, level1 = list(draft.extra.tokens[:2]), list(draft.extra.tokens[2:])
    logits = torch.zeros(4, vocab)
    logits[2, 20] = logits[3, 21] = 1.0  # the top level's argmax: 20 after column 1, 21 after column 2
    logits[0, 30] = logits[1, 30] = 5.0  # lower levels' rows are not read
    drafter.observe_extra(logits)
    assert (level1[0], 20) in drafter._jacobi[level0[0]]  # column 1: (L0, L1, new)
    assert (level1[1], 21) in drafter._jacobi[level0[1]]
    assert drafter.stats().pool_jacobi == len({(level0[c], level1[c], 20 + c) for c in range(2)})
    # One token emitted: the window moved up a level and sits behind the new pending token.
    moved = drafter.propose([*context, 7], 4, GREEDY, make_generator(1))
    assert list(moved.extra.tokens) == [*level1, 20, 21]
    # Then two tokens at once: besides moving up, the columns shift left by one; a fresh
    # column enters on the right.
    drafter.observe_extra(torch.zeros(4, vocab))  # top level: token 0 in both columns
    shifted = drafter.propose([*context, 7, 8, 9], 4, GREEDY, make_generator(1))
    assert shifted.extra.tokens[0] == 21 and shifted.extra.tokens[2] == 0


# -- parameters and errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"window": 0}, "window"),
        ({"ngram": 1}, "n-gram size"),
        ({"candidates": 0}, "candidates"),
        ({"window": 2.5}, "whole number"),
        ({"ngram": "four"}, "whole number"),
        ({"candidates": True}, "whole number"),
        ({"window": 1000}, "from 1 to 64"),
    ],
)
def test_bad_parameters_say_what_to_do(kwargs, message):
    with pytest.raises(ConfigError, match=message) as error:
        LookaheadDrafter(MaskedMarkovBackend(cycle(8)), **kwargs)
    assert "'auto'" in str(error.value)


def test_a_backend_without_masked_forwards_is_refused_with_a_clear_message():
    with pytest.raises(ConfigError, match="PyTorch backend") as error:
        LookaheadDrafter(MarkovBackend(cycle(8)))  # chains only
    assert "custom attention mask" in str(error.value) and "another drafter" in str(error.value)
    with pytest.raises(ConfigError, match="PyTorch backend"):
        LookaheadDrafter(MarkovTreeBackend(cycle(8), tree=False))


def test_automatic_parameters_fit_the_cheap_part_of_the_cost_curve():
    assert cheap_rows(None) == 16 and auto_parameters(None) == (3, 3, 4)  # no curve: 16 rows
    cpu = CostModel(verify_s={1: 1.0, 8: 1.3, 32: 3.0})  # 1.5x one row at about 10 rows
    assert cheap_rows(cpu) == 10
    w, n, g = auto_parameters(cpu)
    assert (w, n, g) == (2, 3, 2) and 1 + g * (n - 1) + (n - 1) * w <= 10
    gpu = CostModel(verify_s={1: 1.0, 64: 1.2})  # flat: the largest budget
    assert auto_parameters(gpu) == (7, 5, 8)
    assert auto_parameters(None, ngram=2) == (7, 2, 8)  # a fixed N: W and G fitted around it
    drafter = LookaheadDrafter(MaskedMarkovBackend(cycle(8)), ngram=2, costs=cpu)
    assert drafter.parameters == (4, 2, 5)
    stats = drafter.stats()
    assert (stats.window, stats.ngram, stats.max_candidates) == (4, 2, 5)


# -- the decode loop on a Markov chain --------------------------------------------------------


def test_greedy_equals_vanilla_and_the_pool_gets_hits_on_a_repetitive_chain():
    t = cycle(12)
    prompt = list(range(12)) + [0, 1]
    vanilla = run(MarkovBackend(t), prompt, GREEDY)
    backend = MaskedMarkovBackend(t)
    drafter = LookaheadDrafter(backend, window=3, ngram=4, candidates=3)
    result = run(backend, prompt, GREEDY, drafter, k=9)
    assert result.tokens == vanilla.tokens
    stats = drafter.stats()
    assert stats.pool_hits > 0 and stats.pool_size > 0 and stats.pool_jacobi > 0
    assert result.stats.steps <= 14  # up to 3 drafts + 1 per forward
    assert backend.masked_calls and all(len(tokens) > 9 for tokens, _, _ in backend.masked_calls)
    assert backend.tokens == [*prompt, *result.tokens][:-1]  # the cache holds what was committed


def test_the_window_alone_finds_n_grams_that_get_accepted():
    """Without the text's n-grams, candidates come from the Jacobi window only. On this
    chain the window's columns walk the cycle; once the reply comes round again, their
    n-grams continue the pending token."""
    t = cycle(12, noise=0.001)
    backend = MaskedMarkovBackend(t)
    drafter = LookaheadDrafter(backend, window=4, ngram=3, candidates=4, text_pool=False)
    result = run(backend, [0, 1], GREEDY, drafter, k=8)
    assert result.tokens == run(MarkovBackend(t), [0, 1], GREEDY).tokens
    stats = drafter.stats()
    assert stats.pool_text == 0 and stats.pool_jacobi > 0
    assert stats.pool_hits > 0 and result.stats.accepted > 0


def test_sampled_lookahead_is_lossless():
    """Joint law of the first three reply tokens equals the chain's, with text and window candidates."""
    vocab, draws = 3, 2000
    target = random_transition(vocab, seed=21, sharpness=1.5)
    backend = MaskedMarkovBackend(target)
    drafter = LookaheadDrafter(backend, window=2, ngram=3, candidates=3)
    prompt = [0, 1, 2, 0, 2, 1, 0]
    counts = np.zeros(vocab**3)
    accepted = 0
    for seed in range(draws):
        result = run(backend, prompt, SamplingConfig(temperature=1.0, max_tokens=3, seed=seed), drafter, k=4)
        a, b, c = result.tokens
        counts[(a * vocab + b) * vocab + c] += 1
        accepted += result.stats.accepted
    exact = three_token_law(target, prompt[-1])
    assert accepted > draws // 4  # candidates were accepted (and rejected: the law holds anyway)
    assert chi_square_pvalue(counts, exact) > 1e-3


class FixedCosts(CostModel):
    """A cost curve that ignores the times measured while decoding (no timing in tests)."""

    def observe_verify(self, n, seconds):
        pass

    def observe_draft(self, tokens, seconds):
        pass


def test_automatic_k_charges_the_window_and_stays_lossless():
    t = cycle(12)
    prompt = list(range(12)) + [0, 1]
    cheap = FixedCosts(verify_s={1: 0.010, 4: 0.0101, 8: 0.0102, 16: 0.0105, 33: 0.012})
    backend = MaskedMarkovBackend(t)
    drafter = LookaheadDrafter(backend, window=3, ngram=4, candidates=3, costs=cheap)
    events = list(decode_steps(backend, prompt, GREEDY, drafter=drafter, draft_length=DraftLength("auto"), costs=cheap))
    assert collect(events).tokens == run(MarkovBackend(t), prompt, GREEDY).tokens
    assert max(e.k for e in events) >= 3 and collect(events).stats.accepted > 0
    # Where rows cost like sequential decoding, the window's 9 rows are charged: plain decoding.
    dear = FixedCosts(verify_s={1: 0.010, 2: 0.020, 33: 0.33})
    backend = MaskedMarkovBackend(t)
    drafter = LookaheadDrafter(backend, window=3, ngram=4, candidates=3, costs=dear)
    events = list(decode_steps(backend, prompt, GREEDY, drafter=drafter, draft_length=DraftLength("auto"), costs=dear))
    assert events[0].k == 0 and collect(events).tokens == run(MarkovBackend(t), prompt, GREEDY).tokens


# -- real (tiny, random) models on the torch backend ----------------------------------------


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookahead")
    return {
        "llama": make_tiny_model(root / "llama", "llama", seed=0, n_layers=2),
        "qwen3": make_tiny_model(root / "qwen3", "qwen3", seed=1, n_layers=2, n_kv_heads=1, head_dim=32),
    }


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_float32_greedy_lookahead_equals_vanilla_on_tiny_models(tiny_models, arch):
    backend = TorchBackend(tiny_models[arch], dtype="float32")
    try:
        prompt = backend.tokenize(REPEAT) * 2
        sampling = SamplingConfig(max_tokens=24)
        vanilla = run(backend, prompt, sampling)
        drafter = LookaheadDrafter(backend, window=3, ngram=3, candidates=3)
        result = run(backend, prompt, sampling, drafter, k=6)
        assert result.tokens == vanilla.tokens
        assert result.stats.drafted > 0 and drafter.stats().pool_jacobi > 0
        assert backend.tokens == [*prompt, *result.tokens][:-1]
    finally:
        backend.close()


def test_the_window_does_not_change_the_tree_rows(tiny_models):
    backend = TorchBackend(tiny_models["llama"], dtype="float32")
    try:
        prompt = backend.tokenize(REPEAT)
        backend.prefill(prompt)
        offsets, window_mask = window_layout(3, 3)
        draft = TreeDraft(
            [11, 12, 13, 14], parents=(-1, 0, 0, 2), extra=ExtraRows(tuple(range(100, 106)), offsets, window_mask)
        )
        pending = 42
        tree = backend.forward_tree([pending, *draft.tokens], [-1, 0, 1, 1, 3])
        backend.keep_nodes([0])
        backend.rollback(len(prompt))
        block = backend.forward_masked(*masked_block(pending, draft))
        torch.testing.assert_close(block[:5], tree, rtol=0, atol=1e-4)  # rounding only
        backend.keep_rows([0, 1, 3])  # pending, node 0, node 2: offsets 0, 1, 2
        assert backend.tokens == [*prompt, pending, 11, 13]
        # The window's rows are the model's view of their own column (a causal run of that sequence).
        backend.rollback(len(prompt))
        column = backend.forward([pending, 100, 101, 104])  # L0c1, L0c2 then L1c2 at offset 3
        torch.testing.assert_close(block[5 + 4], column[-1], rtol=0, atol=1e-4)
    finally:
        backend.close()


# -- the embedded model (SmolLM2-135M, float32) ---------------------------------------------------


def test_float32_greedy_lookahead_equals_vanilla_on_the_embedded_model(embedded_hf_dir):
    backend = TorchBackend(embedded_hf_dir, dtype="float32")
    try:
        sampling = SamplingConfig(max_tokens=40)
        hits = {}
        for text in (REPEAT, OPEN):
            prompt = backend.apply_chat_template([{"role": "user", "content": text}])
            vanilla = run(backend, prompt, sampling)
            drafter = LookaheadDrafter(backend, window=3, ngram=4, candidates=3)
            result = run(backend, prompt, sampling, drafter, k=9)
            assert result.tokens == vanilla.tokens, text
            hits[text] = drafter.stats().pool_hits
            assert drafter.stats().pool_jacobi > 0
        assert hits[REPEAT] > 0  # the reply repeats the prompt: the text's n-grams are accepted
    finally:
        backend.close()


# -- llama.cpp (masked forwards through sequence ids, engine/backends/llama_tree.py) ------------------


def test_float32_greedy_lookahead_equals_vanilla_on_a_tiny_gguf(tmp_path):
    backend = LlamaCppBackend(make_tiny_gguf(str(tmp_path / "tiny.gguf")), n_ctx=512)
    try:
        for text in (REPEAT, OPEN):
            prompt = backend.apply_chat_template([{"role": "user", "content": text}])
            sampling = SamplingConfig(max_tokens=40)
            vanilla = run(backend, prompt, sampling)
            drafter = LookaheadDrafter(backend, window=3, ngram=4, candidates=3)
            result = run(backend, prompt, sampling, drafter, k=9)
            assert result.tokens == vanilla.tokens, text
            assert result.stats.accepted > 0 and drafter.stats().pool_jacobi > 0
            assert backend.tokens == [*prompt, *result.tokens][:-1]
        assert len(backend._tree_ids._free) == backend._tree_ids.count  # every temporary id given back
    finally:
        backend.close()


def test_greedy_lookahead_on_the_embedded_gguf_differs_from_vanilla_by_rounding_only(default_gguf):
    """Q4_1 kernels round a row of a 15-row batch differently from a one-token decode: a divergence
    is allowed where the two runs' top candidates lie within that rounding (engine/core/divergence.py)."""
    config = EngineConfig(target=default_gguf, backend="llama.cpp", k=9, measure_costs=False)
    engine = Engine.load(config.with_drafter("lookahead"))
    try:
        hits = {}
        for text in (REPEAT, OPEN):
            comparison = engine.compare(engine.prompt_ids(text), SamplingConfig(max_tokens=40))
            assert comparison.divergence is None or comparison.divergence.explained, comparison.divergence
            hits[text] = comparison.speculative.stats.accepted
        assert hits[REPEAT] > 0  # the reply repeats the prompt: its n-grams are accepted
    finally:
        engine.close()


def test_lookahead_requests_decoded_together_on_llama_cpp_slots_reply_as_alone(tmp_path, monkeypatch):
    """Three requests in one batch step: each sequence's lookahead block is a masked call of one
    forward_batch (its own temporary sequence ids), and each reply is the one it gets alone."""
    from engine.backends import llama_tree

    masked_batches = []
    run_batch = llama_tree.forward_batch
    monkeypatch.setattr(
        llama_tree, "forward_batch", lambda owner, calls: masked_batches.append(calls) or run_batch(owner, calls)
    )
    tiny = make_tiny_gguf(str(tmp_path / "tiny.gguf"))
    config = EngineConfig(target=tiny, backend="llama.cpp", parallel=3, k=9, measure_costs=False)
    engine = Engine.load(config.with_drafter("lookahead", window=3, ngram=4, candidates=3))
    try:
        sampling = SamplingConfig(max_tokens=32)
        prompts = [engine.prompt_ids(text) for text in (REPEAT, OPEN, REPEAT + " " + OPEN)]
        batch = engine.batch()
        events = {}
        try:
            sequences = [batch.join(prompt, sampling) for prompt in prompts]
            widest = 0
            while batch.sequences:
                for sequence, outcome in batch.step():
                    assert not isinstance(outcome, BaseException), outcome
                    events.setdefault(id(sequence), []).append(outcome)
                    widest = max(widest, outcome.batch)
        finally:
            batch.close()
        assert widest == 3 and any(sum(call.masked for call in calls) > 1 for calls in masked_batches)
        for sequence, prompt in zip(sequences, prompts):
            together = collect(events[id(sequence)])
            alone = engine.generate(prompt, sampling)
            assert together.tokens == alone.tokens
            assert together.stats.drafted > 0
    finally:
        engine.close()
