"""Tree verification: the greedy walk, lossless sampling over trees, and the decode loop with trees."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from engine.api import collect
from engine.core import verify_tree
from engine.core.decode import decode_steps
from engine.core.draft_length import DraftLength, expected_tokens_tree
from engine.core.events import Source
from engine.core.sampling import SamplingConfig, make_generator, probabilities
from engine.core.verify_tree import dedupe_siblings, verify_tree_greedy, verify_tree_sampled
from engine.drafters.base import ChainDraft, Drafter, DraftsTrees, ReadsFeatures, TreeDraft
from tests.factories.fake import (
    MarkovBackend,
    MarkovTreeBackend,
    MarkovTreeDrafter,
    random_transition,
)
from tests.stats_helpers import chi_square_pvalue

# A hand-made tree over a vocabulary of 8:    root -> 1 (node 0)
#                                              root -> 2 (node 1) -> 3 (node 2)
#                                                                 -> 4 (node 3) -> 5 (node 4)
TOKENS = [1, 2, 3, 4, 5]
PARENTS = [-1, -1, 1, 1, 3]


def logits_with_argmax(best: list[int], vocab: int = 8) -> torch.Tensor:
    """One row per tree row (root, then each node), peaked at best[row]."""
    rows = torch.randn(len(best), vocab, generator=make_generator(0))
    rows[torch.arange(len(best)), torch.tensor(best)] = 10.0
    return rows


# -- greedy ---------------------------------------------------------------------------


def test_greedy_follows_the_argmax_down_to_a_leaf_then_adds_a_bonus_token():
    # rows: root, node0..node4. Root picks 2, node 1 picks 4, node 3 picks 5, leaf node 4 picks 7.
    logits = logits_with_argmax([2, 0, 4, 0, 5, 7])
    verdict = verify_tree_greedy(logits, TOKENS, PARENTS)
    assert verdict.path == (1, 3, 4) and verdict.accepted == 3
    assert (verdict.token, verdict.source) == (7, Source.BONUS)
    assert verdict.tested_depths == 3
    assert len(verdict.top_ids) == 4 and verdict.top_ids[-1][0] == 7  # root row + one per accepted node


def test_greedy_stops_where_no_child_matches_and_emits_the_argmax():
    logits = logits_with_argmax([2, 0, 6, 0, 5, 7])  # node 1's row wants 6: neither child (3, 4)
    verdict = verify_tree_greedy(logits, TOKENS, PARENTS)
    assert verdict.path == (1,)
    assert (verdict.token, verdict.source) == (6, Source.RESAMPLED)
    assert verdict.tested_depths == 2  # depth 2 was offered (nodes 2 and 3) and rejected
    root_miss = verify_tree_greedy(logits_with_argmax([0, 0, 0, 0, 0, 0]), TOKENS, PARENTS)
    assert (root_miss.path, root_miss.token, root_miss.tested_depths) == ((), 0, 1)


def test_greedy_does_not_depend_on_sibling_order():
    logits = logits_with_argmax([2, 0, 4, 0, 5, 7])
    # Same tree, nodes listed in another order (parents still first): 2, 4, 5, 3, 1.
    order = [1, 3, 4, 2, 0]
    where = {old: new for new, old in enumerate(order)}
    tokens = [TOKENS[i] for i in order]
    parents = [where[PARENTS[i]] if PARENTS[i] >= 0 else -1 for i in order]
    rows = logits[[0, *(i + 1 for i in order)]]
    a = verify_tree_greedy(logits, TOKENS, PARENTS)
    b = verify_tree_greedy(rows, tokens, parents)
    emitted = lambda v, toks: [toks[n] for n in v.path] + [v.token]
    assert emitted(a, TOKENS) == emitted(b, tokens) == [2, 4, 5, 7]


def test_siblings_with_the_same_token_are_refused_and_dedupe_drops_them():
    with pytest.raises(ValueError, match="siblings with the same token"):
        verify_tree_greedy(logits_with_argmax([0] * 4), [1, 1, 2], [-1, -1, 0])
    # node 2 repeats node 0 under the root: it goes, with its child (node 3)
    assert dedupe_siblings([1, 2, 1, 3, 3], [-1, -1, -1, 2, 0]) == [0, 1, 4]


# -- sampled: lossless ----------------------------------------------------------------


def processed(seed: int, vocab: int, config: SamplingConfig) -> torch.Tensor:
    return probabilities(torch.randn(vocab, generator=make_generator(seed)) * 1.5, config)


@pytest.mark.parametrize(
    "config", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5)], ids=["t1", "t0.8-topk5"]
)
def test_first_token_of_a_wide_tree_is_distributed_as_p(config):
    vocab, draws = 8, 6000
    p_root = processed(1, vocab, config)
    ranked = torch.argsort(p_root, descending=True).tolist()
    children = [ranked[0], ranked[6], ranked[2], ranked[7]]  # likely, unlikely (maybe p = 0), ...
    p = torch.stack([p_root, *(processed(10 + t, vocab, config) for t in children)])  # (5, V)
    gen = make_generator(2)
    counts = np.zeros(vocab)
    for _ in range(draws):
        verdict = verify_tree_sampled(p, children, [-1, -1, -1, -1], gen)
        counts[children[verdict.path[0]] if verdict.path else verdict.token] += 1
    assert chi_square_pvalue(counts, p_root.numpy()) > 1e-3


def first_two_counts(vocab: int, draws: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Joint counts of the first two emitted tokens under a depth-2 tree, and the exact law."""
    config = SamplingConfig(temperature=1.0)
    p_root = processed(4, vocab, config)
    following = torch.stack([processed(20 + t, vocab, config) for t in range(vocab)])  # p(. | previous token)
    tokens, parents = [0, 1, 2, 3, 4, 2], [-1, -1, -1, 0, 0, 1]  # 0 -> {3, 4}, 1 -> {2}, and 2 a leaf
    p = torch.stack([p_root, *(following[t] for t in tokens)])  # row i + 1 follows node i
    gen = make_generator(seed)
    counts = np.zeros(vocab * vocab)
    for _ in range(draws):
        v = verify_tree_sampled(p, tokens, parents, gen)
        emitted = [tokens[n] for n in v.path] + [v.token]
        if len(emitted) == 1:  # the next step would draw the second token from p after it
            emitted.append(int(torch.multinomial(following[emitted[0]], 1, generator=gen)))
        counts[emitted[0] * vocab + emitted[1]] += 1
    exact = np.array([float(p_root[a] * following[a, b]) for a, b in itertools.product(range(vocab), repeat=2)])
    return counts, exact


def test_first_two_tokens_of_a_depth_two_tree_are_distributed_as_the_target():
    counts, exact = first_two_counts(vocab=5, draws=6000)
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_a_broken_residual_fails_the_same_check(monkeypatch):
    """Drawing from p instead of the residual after rejections over-weights the children."""
    monkeypatch.setattr(verify_tree, "_without", lambda r, token: r)
    counts, exact = first_two_counts(vocab=5, draws=6000)
    assert chi_square_pvalue(counts, exact) < 1e-6


# -- the decode loop with trees -------------------------------------------------------


def run(backend, prompt, sampling, drafter=None, k=6):
    length = DraftLength(k) if drafter is not None else None
    return collect(list(decode_steps(backend, prompt, sampling, drafter=drafter, draft_length=length)))


def second_guessing(target: torch.Tensor) -> torch.Tensor:
    """The target with its two best next tokens swapped after every even token: a drafter
    on it has the target's choice as its first child after odd tokens, second after even ones."""
    guess = target.clone()
    for row in range(0, len(guess), 2):
        first, second = torch.argsort(target[row], descending=True)[:2].tolist()
        guess[row, first], guess[row, second] = target[row, second], target[row, first]
    return guess


def test_greedy_with_a_tree_drafter_equals_vanilla_and_uses_the_tree():
    target = random_transition(8, seed=3, sharpness=1.5)
    guess = second_guessing(target) + 0.3 * random_transition(8, seed=4)
    vanilla = run(MarkovBackend(target), [0, 1, 2], SamplingConfig(max_tokens=60))
    backend = MarkovTreeBackend(target)
    result = run(backend, [0, 1, 2], SamplingConfig(max_tokens=60), MarkovTreeDrafter(guess, width=2, depth=3))
    assert result.tokens == vanilla.tokens
    assert backend.tree_calls  # trees were really verified as trees
    first_children = lambda parents: {min(i for i, p in enumerate(parents) if p == q) for q in set(parents)}
    assert any(
        any(node not in first_children(parents) for node in path[1:])  # a second-best branch was accepted
        for parents, path in zip(backend.tree_calls, backend.kept_paths)
    )
    s = result.stats
    assert 0 < s.accepted < s.drafted
    assert backend.tokens == [0, 1, 2, *result.tokens][:-1]  # the cache holds what was committed


def test_per_depth_counts_add_up():
    target = random_transition(8, seed=5, sharpness=1.5)
    guess = random_transition(8, seed=6, sharpness=1.5) + target
    result = run(MarkovTreeBackend(target), [1], SamplingConfig(max_tokens=50), MarkovTreeDrafter(guess, depth=3))
    s = result.stats
    assert sum(s.depth_accepted) == s.accepted and sum(s.depth_tested) == s.tested
    assert all(a <= t for a, t in zip(s.depth_accepted, s.depth_tested))
    assert list(s.depth_tested) == sorted(s.depth_tested, reverse=True)  # reaching depth d needs d - 1
    assert s.depth_tested[0] == sum(1 for e in result.events if e.drafted)  # every draft offers depth 1
    assert len(s.depth_tested) <= 3
    # predicted tokens per step from the per-depth acceptance = measured tokens per step here
    assert expected_tokens_tree(s.depth_acceptance, 3) == pytest.approx(s.tokens_per_step, rel=0.15)


def test_chain_counts_are_per_position():
    from engine.drafters.ngram import NgramDrafter

    t = torch.full((6, 6), 0.02)
    for i in range(6):
        t[i, (i + 1) % 6] = 1.0
    result = run(
        MarkovBackend(t / t.sum(-1, keepdim=True)),
        [0, 1, 2, 3, 4, 5, 0, 1],
        SamplingConfig(max_tokens=30),
        NgramDrafter(),
        k=4,
    )
    s = result.stats
    assert len(s.depth_tested) == 4 and sum(s.depth_accepted) == s.accepted and sum(s.depth_tested) == s.tested


def test_sampling_through_the_loop_with_trees_is_lossless():
    vocab, draws = 4, 2000
    target = random_transition(vocab, seed=11, sharpness=1.0)
    drafter = MarkovTreeDrafter(random_transition(vocab, seed=12, sharpness=1.0), width=2, depth=2)
    backend = MarkovTreeBackend(target)
    counts = np.zeros(vocab * vocab)
    for seed in range(draws):
        sampling = SamplingConfig(temperature=1.0, max_tokens=4, seed=seed)  # k <= 3: two children + one below
        a, b = run(backend, [0], sampling, drafter, k=6).tokens[:2]
        counts[a * vocab + b] += 1
    exact = np.array([float(target[0, a] * target[a, b]) for a, b in itertools.product(range(vocab), repeat=2)])
    assert backend.tree_calls
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_a_chain_only_backend_verifies_the_best_branch_and_says_so():
    target = random_transition(8, seed=3, sharpness=1.5)
    guess = random_transition(8, seed=4, sharpness=1.5) + target
    vanilla = run(MarkovBackend(target), [0, 1, 2], SamplingConfig(max_tokens=40))
    backend = MarkovTreeBackend(target, tree=False)
    drafter = MarkovTreeDrafter(guess, width=3, depth=3)
    result = run(backend, [0, 1, 2], SamplingConfig(max_tokens=40), drafter, k=9)
    assert result.tokens == vanilla.tokens
    assert not backend.tree_calls
    assert max(backend.forward_calls[1:]) <= 4  # pending + a branch of depth 3, never 9 nodes
    assert result.stats.accepted > 0
    assert result.stats.notes and "chains only" in result.stats.notes[0]
    assert result.events[0].stats.notes == result.stats.notes  # from the first step on
    assert not run(MarkovTreeBackend(target), [0, 1, 2], SamplingConfig(max_tokens=5), drafter).stats.notes


class BranchDrafter(Drafter):
    """Always the same two-branch tree, with a best branch that is not the first child."""

    name = "branches"
    capabilities = frozenset({DraftsTrees})

    def propose(self, context, k, sampling, generator):
        return TreeDraft([5, 6, 7], parents=(-1, -1, 1), best_path=(1, 2))

    def tree_expected_tokens(self, nodes):
        return None


def test_the_best_branch_is_the_one_the_drafter_marks():
    t = torch.full((8, 8), 0.01)
    t[0, 6], t[6, 7], t[7, 0] = 1.0, 1.0, 1.0  # the target writes 6 7 0 6 7 0 ...
    backend = MarkovTreeBackend(t / t.sum(-1, keepdim=True), tree=False)
    result = run(backend, [0], SamplingConfig(max_tokens=4), BranchDrafter(), k=3)
    assert list(result.tokens[:3]) == [6, 7, 0]
    assert result.events[0].accepted == 2 and backend.forward_calls[0] == 3  # pending 0, then 6 7


class FeatureProbe(Drafter):
    """Records the features it is given; drafts a two-node tree once it has any."""

    name = "probe"
    capabilities = frozenset({ReadsFeatures, DraftsTrees})

    def __init__(self):
        self.seen: list[torch.Tensor] = []
        self.drafted_without_features = False

    def reset(self):
        self.seen.clear()

    def observe_features(self, features):
        self.seen.append(features)

    def propose(self, context, k, sampling, generator):
        if not self.seen:
            return ChainDraft([])
        return TreeDraft([1, 2], parents=(-1, -1))

    def tree_expected_tokens(self, nodes):
        return None


@pytest.mark.parametrize("tree", [True, False])
def test_features_of_the_kept_rows_reach_the_drafter(tree):
    t = torch.full((4, 4), 0.01)
    t[0, 1], t[1, 2], t[2, 3], t[3, 0] = 1.0, 1.0, 1.0, 1.0
    backend = MarkovTreeBackend(t / t.sum(-1, keepdim=True), tree=tree)
    probe = FeatureProbe()
    result = run(backend, [3, 0], SamplingConfig(max_tokens=8), probe, k=2)
    assert result.events[0].drafted == 0  # no hidden state before the first forward: a plain step
    committed = [3, 0, *result.tokens]
    at = 1  # the pending token of step 0 is committed[1]
    for event, features in zip(result.events[:-1], probe.seen):  # the last step may be cut short
        rows = features.argmax(dim=1).tolist()  # one-hot features -> the tokens of the kept rows
        assert rows == committed[at : at + event.accepted + 1]
        at += event.accepted + 1


def test_a_features_drafter_on_a_backend_without_features_is_refused():
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="hidden states"):
        run(MarkovBackend(random_transition(4, seed=0)), [0], SamplingConfig(max_tokens=2), FeatureProbe())
