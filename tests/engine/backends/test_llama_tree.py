"""TreeForward on llama.cpp through sequence ids (engine/backends/llama_tree.py), on tiny float32 GGUFs:
each row sees what its mask says, the kept rows leave the cache a chain forward would, masks llama.cpp
cannot express and too many branches are refused before anything runs, hybrids have no TreeForward."""

from __future__ import annotations

import llama_cpp
import pytest
import torch

from engine.api import collect
from engine.backends.capabilities import TreeForward, has
from engine.backends.llama_cpp import LlamaCppBackend
from engine.backends.llama_tree import MaskNotExpressible
from engine.backends.slots import BatchCall
from engine.core.decode import decode_steps
from engine.core.draft_length import DraftLength
from engine.core.feeds import masked_block
from engine.core.sampling import SamplingConfig
from engine.core.tree import ancestor_mask, path_to
from engine.drafters.base import ExtraRows, TreeDraft
from engine.drafters.lookahead import LookaheadDrafter, window_layout
from engine.errors import ConfigError
from tests.factories.gguf_models import make_tiny_gguf
from tests.factories.hybrid_gguf import make_gemma3_gguf, make_lfm2_gguf

PROMPT = "Speculative decoding checks a whole tree of guesses in one forward pass."
TOKENS = [101, 102, 103, 104, 105, 106, 107, 108]
PARENTS = [-1, 0, 0, 1, 1, 2, 3, -1]  # two depth-1 nodes, branching below the first
EXACT = 1e-4  # the same cells in the same order: rounding of the row's own sums only
# A kept row's cell is wherever the block put it, and the next rows land in the freed cells between:
# llama.cpp's F16 cache is then summed in another order than a chain's (as in a unified cache of slots).
NEAR = 2e-2


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    b = LlamaCppBackend(make_tiny_gguf(str(tmp_path_factory.mktemp("tree") / "tiny.gguf")), n_ctx=512)
    yield b
    b.close()


@pytest.fixture
def prompt(backend):
    ids = backend.tokenize(PROMPT)
    backend.prefill(ids)
    yield ids
    backend.rollback(0)
    assert len(backend._tree_ids._free) == backend._tree_ids.count  # every temporary id given back


def chain_logits(backend, base: int, tokens: list[int]) -> torch.Tensor:
    """Logits of a plain forward of `tokens` after the first `base` cached tokens, left rolled back."""
    backend.rollback(base)
    logits = backend.forward(tokens)
    backend.rollback(base)
    return logits


def test_an_attention_model_has_tree_forward_and_spare_sequence_ids(backend):
    assert has(backend, TreeForward) and backend.supports_tree
    assert backend._tree_ids.count == llama_cpp.llama_n_seq_max(backend._ctx) - 1 >= 32


def test_each_tree_node_gets_the_logits_of_its_own_path(backend, prompt):
    base = len(prompt)
    tree = backend.forward_tree(TOKENS, PARENTS)
    assert tree.shape == (len(TOKENS), backend.vocab_size)
    assert backend.tokens == [*prompt, *TOKENS]
    backend.keep_nodes([])
    for node in range(len(TOKENS)):
        path = path_to(PARENTS, node)
        alone = chain_logits(backend, base, [TOKENS[i] for i in path])
        torch.testing.assert_close(tree[node], alone[-1], rtol=0, atol=EXACT)


def test_keep_nodes_leaves_the_cache_a_chain_of_the_path_leaves(backend, prompt):
    base = len(prompt)
    backend.forward_tree(TOKENS, PARENTS)
    backend.keep_nodes([0, 1, 4])
    assert backend.tokens == [*prompt, 101, 102, 105]
    after = backend.forward([7, 8, 9])
    reference = chain_logits(backend, base, [101, 102, 105, 7, 8, 9])[-3:]
    torch.testing.assert_close(after, reference, rtol=0, atol=NEAR)
    assert (after.argmax(-1) == reference.argmax(-1)).all()


def test_a_lookahead_block_sees_what_its_mask_says_and_keeps_the_accepted_path(backend, prompt):
    base = len(prompt)
    offsets, window = window_layout(3, 3)
    draft = TreeDraft([11, 12, 13, 14], parents=(-1, 0, 0, 2), extra=ExtraRows(tuple(range(200, 206)), offsets, window))
    tokens, block_offsets, mask = masked_block(42, draft)
    block = backend.forward_masked(tokens, block_offsets, mask, what="a lookahead step")
    backend.rollback(base)
    tree = backend.forward_tree([42, *draft.tokens], [-1, 0, 1, 1, 3])
    backend.rollback(base)
    torch.testing.assert_close(block[:5], tree, rtol=0, atol=EXACT)  # the window changes no tree row
    # Level 1, column 2 (row 5 + 3 + 1) reads upwards: x_m, level 0's columns 1 and 2, then itself.
    torch.testing.assert_close(block[9], chain_logits(backend, base, [42, 200, 201, 204])[-1], rtol=0, atol=EXACT)

    backend.forward_masked(tokens, block_offsets, mask)
    backend.keep_rows([0, 1, 3])  # x_m, node 0, node 2: offsets 0, 1, 2
    assert backend.tokens == [*prompt, 42, 11, 13]
    after = backend.forward([5, 6])
    torch.testing.assert_close(after, chain_logits(backend, base, [42, 11, 13, 5, 6])[-2:], rtol=0, atol=NEAR)


def test_a_block_larger_than_one_decode_runs_in_pieces_cut_between_positions(backend, prompt):
    offsets, window = window_layout(4, 4)
    draft = TreeDraft([11, 12, 13], parents=(-1, 0, -1), extra=ExtraRows(tuple(range(300, 312)), offsets, window))
    args = masked_block(42, draft)
    whole = backend.forward_masked(*args)
    backend.rollback(len(prompt))
    backend._rows.size = 5  # this instance's decodes take 5 rows at most
    try:
        pieces = backend.forward_masked(*args)
    finally:
        backend._rows.size = llama_cpp.llama_n_batch(backend._ctx)
    torch.testing.assert_close(pieces, whole, rtol=0, atol=EXACT)


def test_a_rollback_into_a_block_keeps_its_first_rows_and_one_before_it_drops_it(backend, prompt):
    base = len(prompt)
    backend.forward_tree(TOKENS, PARENTS)
    backend.rollback(base + 2)  # nodes 0 and 1: a chain from offset 0
    assert backend.tokens == [*prompt, 101, 102]
    torch.testing.assert_close(backend.forward([9]), chain_logits(backend, base, [101, 102, 9])[-1:], rtol=0, atol=NEAR)
    backend.forward_tree(TOKENS, PARENTS)
    backend.rollback(base - 3)
    assert backend.tokens == prompt[:-3]
    backend.prefill(prompt)  # the cache is usable again, and holds the prompt only
    torch.testing.assert_close(backend.forward([9]), chain_logits(backend, base, [9]), rtol=0, atol=NEAR)


@pytest.mark.parametrize(
    ("mask_rows", "offsets", "message"),
    [
        ([[1, 0], [1, 1]], [1, 0], "later offset"),  # row 1 sees row 0, placed after it
        ([[1, 0, 0], [1, 1, 0], [1, 0, 1]], [0, 1, 3], "no gap"),  # row 2 skips offsets 1 and 2
        ([[1, 0], [0, 1]], [0, 1], "start right after the cache"),  # row 1 does not see offset 0
        ([[0, 0], [1, 1]], [0, 1], "see itself"),
    ],
)
def test_a_mask_llama_cpp_cannot_express_is_refused_before_anything_runs(backend, prompt, mask_rows, offsets, message):
    mask = torch.tensor(mask_rows, dtype=torch.bool)
    with pytest.raises(MaskNotExpressible, match=message):
        backend.forward_masked([5, 6, 7][: len(offsets)], offsets, mask)
    assert backend.tokens == prompt
    torch.testing.assert_close(backend.forward([9]), chain_logits(backend, len(prompt), [9]), rtol=0, atol=EXACT)


def test_more_branches_than_sequence_ids_are_refused_with_what_to_do(backend, prompt):
    leaves = backend._tree_ids.count + 1
    with pytest.raises(ConfigError, match=rf"needs {leaves} sequence ids.*lower k"):
        backend.forward_tree(list(range(10, 10 + leaves)), [-1] * leaves)
    assert backend.tokens == prompt


def test_keep_rows_needs_rows_at_offsets_0_1_2(backend, prompt):
    backend.forward_tree(TOKENS, PARENTS)
    with pytest.raises(ValueError, match="offsets 0, 1, 2"):
        backend.keep_rows([0, 3])  # node 3 sits at offset 2
    with pytest.raises(ValueError, match="not a path"):
        backend.keep_nodes([0, 3])  # node 3 hangs below node 1, not below node 0
    backend.keep_nodes([0, 2, 5])
    assert backend.tokens == [*prompt, 101, 103, 106]


def test_a_hybrid_model_has_no_tree_forward_and_lookahead_says_why(tmp_path):
    hybrid = LlamaCppBackend(make_lfm2_gguf(str(tmp_path / "lfm2.gguf")), n_ctx=256)
    try:
        assert not has(hybrid, TreeForward) and hybrid.replays_on_rollback
        assert llama_cpp.llama_n_seq_max(hybrid._ctx) == 1  # no recurrent state made for temporary ids
        with pytest.raises(ConfigError, match="recurrent layers keep one state per sequence") as error:
            LookaheadDrafter(hybrid)
        assert "n-gram lookup" in str(error.value)
        with pytest.raises(ConfigError, match="recurrent layers"):  # called anyway: refused, nothing runs
            hybrid.forward_tree([5, 6], [-1, -1])
    finally:
        hybrid.close()


def test_lookahead_on_a_sliding_window_model_equals_vanilla(tmp_path):
    """Gemma 3's sliding layers mask by position too: with a window shorter than the prompt, the
    groups' rows still see exactly what a chain would."""
    gemma = LlamaCppBackend(make_gemma3_gguf(str(tmp_path / "gemma3.gguf"), sliding_window=4, mix=0.3), n_ctx=256)
    try:
        prompt = gemma.tokenize("one two three four five one two three four five one two three four five one two")
        sampling = SamplingConfig(max_tokens=32)
        vanilla = collect(list(decode_steps(gemma, prompt, sampling)))
        drafter = LookaheadDrafter(gemma, window=3, ngram=4, candidates=3)
        result = collect(list(decode_steps(gemma, prompt, sampling, drafter=drafter, draft_length=DraftLength(9))))
        assert result.tokens == vanilla.tokens and result.stats.accepted > 0
    finally:
        gemma.close()


# -- several sequences (slots): masked calls in one batched forward ---------------------------------------


def test_masked_calls_of_several_slots_run_in_one_forward_as_each_would_alone(tmp_path):
    b = LlamaCppBackend(make_tiny_gguf(str(tmp_path / "tiny.gguf")), n_ctx=256, slots=3)
    try:
        assert b._tree_ids.first == 3  # the temporary ids come after the slots' 0, 1, 2
        seqs = [b, b.open_slot(), b.open_slot()]
        assert all(has(s, TreeForward) for s in seqs)
        prompts = [b.tokenize(text) for text in (PROMPT, "A second request, longer than the first one is.", "Third")]
        offsets, window = window_layout(3, 3)
        look = masked_block(
            42, TreeDraft([11, 12, 13], parents=(-1, 0, -1), extra=ExtraRows(tuple(range(200, 206)), offsets, window))
        )
        tree_parents = [-1, 0, 1, 1, 0]
        tree = [7, 8, 9, 10, 11]

        def alone():
            for s, p in zip(seqs, prompts):
                s.prefill(p)
            out = [seqs[0].forward([5, 6]), seqs[1].forward_masked(*look), seqs[2].forward_tree(tree, tree_parents)]
            seqs[1].keep_rows([0, 1, 2])  # x_m, node 0, node 1: offsets 0, 1, 2
            seqs[2].keep_nodes([0, 1, 3])
            return out, [s.forward([4]) for s in seqs]

        solo, solo_next = alone()
        for s in seqs:
            s.rollback(0)
        for s, p in zip(seqs, prompts):
            s.prefill(p)
        tree_offsets = [0, 1, 2, 2, 1]
        calls = [
            BatchCall(seqs[0], [5, 6]),
            BatchCall(seqs[1], *look, what="a lookahead step"),
            BatchCall(seqs[2], tree, tree_offsets, ancestor_mask(tree_parents), "a tree", tree_parents),
        ]
        together = b.forward_batch(calls)
        seqs[1].keep_rows([0, 1, 2])
        seqs[2].keep_nodes([0, 1, 3])  # the call carried the tree's parents
        assert [s.tokens[len(p) :] for s, p in zip(seqs, prompts)] == [[5, 6], [42, 11, 12], [7, 8, 10]]
        for mine, theirs in zip(together, solo):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=NEAR)
        for s, expected in zip(seqs, solo_next):
            torch.testing.assert_close(s.forward([4]), expected, rtol=0, atol=NEAR)
        assert len(b._tree_ids._free) == b._tree_ids.count
        seqs[1].forward_masked(*look)
        seqs[1].close()  # a slot closed with a block not kept gives its ids back
        assert len(b._tree_ids._free) == b._tree_ids.count
    finally:
        b.close()
