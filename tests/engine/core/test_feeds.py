"""Feeds: which one a draft becomes on which target, what it runs, and what the cache keeps."""

from __future__ import annotations

import torch

from engine.backends.capabilities import LayerExit
from engine.core.feeds import ChainFeed, ExitFeed, ExtraRowsFeed, TreeFeed, feed_for
from engine.core.sampling import SamplingConfig, make_generator
from engine.drafters.base import ChainDraft, ExitStart, ExtraRows, TreeDraft
from tests.factories.fake import MarkovBackend, MarkovTreeBackend

GREEDY = SamplingConfig(max_tokens=8)


def cycle(vocab: int = 8) -> torch.Tensor:
    """i -> i + 1 almost surely: drafts that follow it are accepted, others rejected."""
    t = torch.full((vocab, vocab), 0.01)
    for i in range(vocab):
        t[i, (i + 1) % vocab] = 1.0
    return t / t.sum(dim=-1, keepdim=True)


class ExitMarkovBackend(MarkovBackend):
    """A chain backend that also finishes forwards from an exit layer (LayerExit), recording them."""

    def __init__(self, transition: torch.Tensor) -> None:
        super().__init__(transition)
        self.capabilities = frozenset({LayerExit})
        self.exit_calls: list[tuple[list[int], tuple[int, ...], int]] = []

    def forward_from_exit(self, tokens, hidden, exit_layer):
        self.exit_calls.append((list(tokens), tuple(hidden.shape), exit_layer))
        return self.forward(tokens)


class MaskedBackend(MarkovTreeBackend):
    """Runs masked blocks (every row sees the pending token; a node its ancestors) and records keep_rows."""

    def __init__(self, transition: torch.Tensor) -> None:
        super().__init__(transition)
        self.kept_rows: list[list[int]] = []

    def forward_masked(self, tokens, offsets, mask, what="a block"):
        self._base = len(self.tokens)
        self.tokens.extend(tokens)
        return torch.log(self.transition[torch.tensor(tokens)])  # (n, V)

    def keep_rows(self, rows):
        self.kept_rows.append(list(rows))
        kept = [self.tokens[self._base + r] for r in rows]
        del self.tokens[self._base :]
        self.tokens.extend(kept)


def step(feed, backend, pending: int, committed: int):
    """One forward, verdict and commit, as the decode loop runs them."""
    logits = feed.forward(backend, pending)
    verdict, path, tested = feed.verify(logits, GREEDY, make_generator(0))
    feed.commit(backend, path, committed)
    return logits, verdict, path, tested


def test_each_kind_of_draft_gets_its_feed_and_the_target_decides_what_it_can_run():
    tree = TreeDraft([1, 2, 3], parents=(-1, -1, 0), best_path=(1,))
    extras = TreeDraft([1, 2], parents=(-1, 0), extra=ExtraRows((5, 6), (1, 2)))
    exit_chain = ChainDraft([1, 2], exit=ExitStart(torch.zeros(2, 4), 1))
    trees, chains = MaskedBackend(cycle()), MarkovTreeBackend(cycle(), tree=False)

    assert type(feed_for(ChainDraft([1, 2]), 4, chains)) is ChainFeed
    assert type(feed_for(tree, 4, trees)) is TreeFeed
    on_chains = feed_for(tree, 4, chains)  # llama.cpp-like: the branch the drafter marks, as a chain
    assert type(on_chains) is ChainFeed and on_chains.tokens == [2]
    assert type(feed_for(exit_chain, 4, ExitMarkovBackend(cycle()))) is ExitFeed
    assert type(feed_for(exit_chain, 4, chains)) is ChainFeed  # no LayerExit: a full forward, same rows
    with_rows = feed_for(extras, 4, trees)
    assert type(with_rows) is ExtraRowsFeed and with_rows.extra == 2 and with_rows.rows == 2 + 1 + 2
    assert type(feed_for(extras, 4, trees, room=3)) is ChainFeed  # the window does not fit: dropped
    assert type(feed_for(extras, 4, chains)) is ChainFeed  # a chain cannot carry it


def test_a_chain_feed_keeps_the_accepted_prefix_and_rolls_the_rest_back():
    backend = MarkovBackend(cycle())
    backend.prefill([0, 1])  # committed 0 1 2; 2 is pending
    feed = feed_for(ChainDraft([3, 4, 7, 0]), 4, backend)
    logits, verdict, path, tested = step(feed, backend, 2, committed=3)
    assert logits.shape[0] == 5 and feed.rows == 5
    assert path == [0, 1] and tested == 3 and verdict.token == 5  # 7 rejected, 5 follows 4
    assert backend.tokens == [0, 1, 2, 3, 4]


def test_a_tree_feed_keeps_the_accepted_path_only():
    backend = MarkovTreeBackend(cycle())
    backend.prefill([0])  # committed 0 1; 1 is pending
    feed = feed_for(TreeDraft([5, 2, 3, 6], parents=(-1, -1, 1, 2)), 4, backend)
    _, verdict, path, tested = step(feed, backend, 1, committed=2)
    assert path == [1, 2] and tested == 3 and verdict.token == 4  # 2 -> 3 accepted, 6 under 3 rejected
    assert backend.kept_paths == [[0, 2, 3]] and backend.tokens == [0, 1, 2, 3]
    assert feed.tree_depth == 3


def test_an_exit_feed_starts_the_verifying_forward_from_the_exit_rows():
    backend = ExitMarkovBackend(cycle())
    backend.prefill([0])
    feed = feed_for(ChainDraft([2, 3, 5], exit=ExitStart(torch.zeros(3, 4), 2)), 2, backend)  # cut to k = 2
    _, _, path, _ = step(feed, backend, 1, committed=2)
    assert backend.exit_calls == [([1, 2, 3], (3, 4), 2)]  # x_m, d_1, d_2 and their layer-2 rows
    assert path == [0, 1] and backend.tokens == [0, 1, 2, 3]


def test_extra_rows_ride_along_unverified_and_leave_the_cache():
    backend = MaskedBackend(cycle())
    backend.prefill([0])
    draft = TreeDraft([2, 3, 7], parents=(-1, 0, 0), extra=ExtraRows((4, 5), (1, 2)))
    feed = feed_for(draft, 3, backend)
    logits, verdict, path, tested = step(feed, backend, 1, committed=2)
    assert logits.shape[0] == 4 and feed.extra_logits.shape[0] == 2  # p's rows, then the window's
    assert torch.equal(feed.extra_logits, torch.log(cycle()[torch.tensor([4, 5])]))
    assert path == [0, 1] and verdict.token == 4
    assert backend.kept_rows == [[0, 1, 2]] and backend.tokens == [0, 1, 2, 3]
