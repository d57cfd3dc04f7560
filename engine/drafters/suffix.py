"""Suffix decoding: draft from what followed the longest earlier match of the text's end.

SuffixDecoding (Oliaro et al., 2024, arXiv 2411.04975; vLLM's and ArcticInference's
`suffix` method) in the engine's terms. Two places are searched for the longest
run of tokens that ends the context (up to `max_match` tokens):

- this generation's own text (the prompt and the reply so far), and
- earlier replies (`SuffixHistory`): every reply this drafter has seen, bounded
  by a token budget, oldest dropped first, kept across generations and
  conversations for as long as the engine is loaded. In a chat, later turns
  repeat earlier code, JSON, names and phrasing.

Every occurrence of that run votes for what came after it. The votes form a tree
(a trie of the continuations, each node's share of the votes is its estimated
probability of being what comes next), and the draft is that tree's most likely
nodes, best first, while a node's share stays at or above `min_prob`; its size is
capped at `spec_factor` x the match length, so a long match (a quote, code being
edited) drafts long and a one-token match drafts one. Of the two places, the
tree with the larger expected number of accepted tokens (the sum of its nodes'
shares) is drafted. A backend that verifies trees gets the tree; one that
verifies chains (a model with recurrent layers) gets its most likely branch.

Drafts carry no distribution, so they are verified as point masses and the
output is the target's, at any temperature.

Where n-gram lookup (ngram.py) copies one earlier occurrence of the last 1-3
tokens, suffix decoding weighs all occurrences of the longest match, and sizes
each draft by how much evidence it has.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

from engine.drafters.base import (
    EMPTY_DRAFT,
    ChainDraft,
    Draft,
    Drafter,
    DraftsTrees,
    FreeToAsk,
    RemembersReplies,
    TreeDraft,
)
from engine.drafters.suffix_spec import SuffixStats

if TYPE_CHECKING:
    import torch

    from engine.core.sampling import SamplingConfig

SEPARATOR = -1  # between two sequences in an index: no match runs across it
MAX_VOTES = 256  # occurrences of a match that vote, the most recent ones: a common token occurs thousands of times
_NOWHERE = np.zeros(0, dtype=np.int64)


class SuffixIndex:
    """Token sequences one after another (SEPARATOR between two), and where each token id occurs."""

    def __init__(self) -> None:
        self._tokens = np.full(1024, SEPARATOR, dtype=np.int64)
        self._size = 0
        self._where: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self._size

    @property
    def tokens(self) -> np.ndarray:
        return self._tokens[: self._size]

    def extend(self, tokens) -> None:
        tokens = list(tokens)
        need = self._size + len(tokens) + 1
        if need > len(self._tokens):
            grown = np.full(max(need, 2 * len(self._tokens)), SEPARATOR, dtype=np.int64)
            grown[: self._size] = self._tokens[: self._size]
            self._tokens = grown
        self._tokens[self._size : self._size + len(tokens)] = tokens
        where = self._where
        for position, token in enumerate(tokens, self._size):
            where.setdefault(token, []).append(position)
        self._size += len(tokens)

    def end_sequence(self) -> None:
        if self._size and self._tokens[self._size - 1] != SEPARATOR:
            self.extend([])  # room for one more
            self._tokens[self._size] = SEPARATOR
            self._size += 1

    def longest_match(self, context: list[int], longest: int) -> tuple[int, np.ndarray]:
        """(m, ends): the largest m <= `longest` for which the context's last m tokens occur here
        followed by at least one token, and the positions where those occurrences end (oldest
        first); (0, empty) when not even the last token does."""
        where = self._where.get(context[-1])
        if not where:
            return 0, _NOWHERE
        tokens = self.tokens
        ends = np.asarray(where, dtype=np.int64)
        ends = ends[ends + 1 < self._size]
        ends = ends[tokens[ends + 1] != SEPARATOR]  # something follows
        if not ends.size:
            return 0, _NOWHERE
        length = 1
        for back in range(1, min(longest, len(context))):
            starts = ends - back
            inside = starts >= 0
            kept = ends[inside][tokens[starts[inside]] == context[-1 - back]]
            if not kept.size:
                break
            ends, length = kept, back + 1
        return length, ends

    def continuations(self, ends: np.ndarray, depth: int) -> list[list[int]]:
        """The up to `depth` tokens after each end position, stopping at a sequence's end."""
        tokens, out = self.tokens, []
        for end in ends.tolist():
            following = tokens[end + 1 : end + 1 + depth].tolist()
            if SEPARATOR in following:
                following = following[: following.index(SEPARATOR)]
            out.append(following)
        return out


class SuffixHistory:
    """Earlier replies, searched like the text: at most `capacity` tokens, the oldest dropped first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.replies: list[list[int]] = []
        self.index = SuffixIndex()
        self.tokens = 0  # in `replies`

    def add(self, reply: list[int]) -> None:
        if self.capacity <= 0 or not reply:
            return
        reply = list(reply[-self.capacity :])
        self.replies.append(reply)
        self.tokens += len(reply)
        if self.tokens <= self.capacity:
            self.index.extend(reply)
            self.index.end_sequence()
            return
        # Over budget: drop the oldest replies down to three quarters of it, and index the rest anew
        # (a rebuild once per quarter of the budget, not per reply).
        while len(self.replies) > 1 and self.tokens > 0.75 * self.capacity:
            self.tokens -= len(self.replies.pop(0))
        self.index = SuffixIndex()
        for kept in self.replies:
            self.index.extend(kept)
            self.index.end_sequence()

    def clear(self) -> None:
        self.replies.clear()
        self.index = SuffixIndex()
        self.tokens = 0


class Tree:
    """A speculation tree: its nodes best first, each with its parent (-1: the root's child) and share."""

    def __init__(self, tokens: list[int], parents: list[int], shares: list[float], match: int) -> None:
        self.tokens, self.parents, self.shares, self.match = tokens, parents, shares, match

    @property
    def expected(self) -> float:
        """Tokens it is expected to have accepted: the sum of its nodes' shares."""
        return sum(self.shares)

    def best_path(self) -> tuple[int, ...]:
        """Node indices from depth 1 down, always to the child with the largest share."""
        best: dict[int, int] = {}
        for node, parent in enumerate(self.parents):
            if parent not in best or self.shares[node] > self.shares[best[parent]]:
                best[parent] = node
        path, node = [], best.get(-1)
        while node is not None:
            path.append(node)
            node = best.get(node)
        return tuple(path)


def build_tree(continuations: list[list[int]], budget: int, min_share: float, chain: bool, match: int) -> Tree:
    """The `budget` most likely nodes of the continuations' trie (a node's share: the
    continuations through it over all of them), each at least `min_share`; with `chain`,
    only the most likely branch."""
    total = len(continuations)
    root: dict[int, list] = {}  # token -> [votes, children]
    for continuation in continuations:
        level = root
        for token in continuation:
            entry = level.get(token)
            if entry is None:
                entry = level[token] = [0, {}]
            entry[0] += 1
            level = entry[1]
    tokens, parents, shares = [], [], []
    if chain:
        level, parent = root, -1
        while level and len(tokens) < budget:
            token, (votes, children) = max(level.items(), key=lambda item: item[1][0])
            if votes / total < min_share:
                break
            tokens.append(token)
            parents.append(parent)
            shares.append(votes / total)
            level, parent = children, len(tokens) - 1
        return Tree(tokens, parents, shares, match)
    order = 0  # ties: the earlier pushed first
    frontier = []
    for token, entry in root.items():
        frontier.append((-entry[0] / total, order, token, entry, -1))
        order += 1
    heapq.heapify(frontier)
    while frontier and len(tokens) < budget:
        negative, _, token, (votes, children), parent = heapq.heappop(frontier)
        if -negative < min_share:
            break  # the best left is below it, and so is everything under it
        tokens.append(token)
        parents.append(parent)
        shares.append(-negative)
        node = len(tokens) - 1
        for child, entry in children.items():
            heapq.heappush(frontier, (-entry[0] / total, order, child, entry, node))
            order += 1
    return Tree(tokens, parents, shares, match)


class SuffixDrafter(Drafter):
    name = "suffix"

    def __init__(
        self,
        *,
        trees: bool,
        max_depth: int = 24,
        max_match: int = 32,
        spec_factor: float = 8.0,
        min_prob: float = 0.2,
        history_tokens: int = 200_000,
    ) -> None:
        """Defaults from `specdeck-cli bench` on the shipped prompts (docs/benchmarks.md): the paper's
        factor 1 and share 0.1 drafted 2.18 tokens per forward on PyTorch's input-reusing prompts,
        8 and 0.2 drafted 3.24 (2.95x vanilla, n-gram lookup 2.26-2.50x)."""
        self.trees = trees  # chains where the target verifies chains only (recurrent layers)
        # free: a lookup in its indexes (it follows the context whether or not its draft is used)
        self.capabilities = frozenset({FreeToAsk, RemembersReplies, *((DraftsTrees,) if trees else ())})
        self.max_depth, self.max_match = max_depth, max_match
        self.spec_factor, self.min_prob = spec_factor, min_prob
        self.history = SuffixHistory(history_tokens)
        self._text = SuffixIndex()
        self._prompt_length: int | None = None  # where this generation's reply starts in its context
        self._context: list[int] = []  # the context of the last proposal (its reply goes to the history)
        self._stats = _Counts()

    def begin(self, prompt: list[int]) -> None:
        self._finish_reply()
        self._text = SuffixIndex()
        self._text.extend(prompt)
        self._prompt_length = len(prompt)
        self._context = list(prompt)

    def reset(self) -> None:
        self._stats = _Counts()

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        if k <= 0 or not context:
            return EMPTY_DRAFT
        self._follow(context)
        self._stats.lookups += 1
        best = None
        for source, index in (("text", self._text), ("history", self.history.index)):
            if not len(index):
                continue
            match, ends = index.longest_match(context, self.max_match)
            if match == 0:
                continue
            budget = min(k, max(1, math.floor(self.spec_factor * match)))
            continuations = index.continuations(ends[-MAX_VOTES:], min(self.max_depth, budget))
            tree = build_tree(continuations, budget, self.min_prob, not self.trees, match)
            if tree.tokens and (best is None or tree.expected > best[1].expected):
                best = (source, tree)
        if best is None:
            self._stats.last_match = 0
            return EMPTY_DRAFT
        source, tree = best
        counts = self._stats
        counts.hits += 1
        counts.from_history += source == "history"
        counts.last_match, counts.last_nodes = tree.match, len(tree.tokens)
        if not self.trees:
            return ChainDraft(tokens=tree.tokens, expected=tree.expected)
        return TreeDraft(
            tokens=tree.tokens, parents=tuple(tree.parents), best_path=tree.best_path(), expected=tree.expected
        )

    def tree_expected_tokens(self, nodes: int) -> None:
        """No estimate per budget (each draft carries its own, `expected`): automatic k uses the chain formula."""
        return None

    def _follow(self, context: list[int]) -> None:
        """Index what the context gained since the last proposal (the reply's new tokens)."""
        indexed = len(self._text)
        if (
            self._prompt_length is None
            or len(context) < indexed
            or (indexed and context[indexed - 1] != self._text.tokens[indexed - 1])
        ):
            self.begin(context)  # not told the prompt (or another text): this context is the prompt
            return
        self._text.extend(context[indexed:])
        self._context = context

    def _finish_reply(self) -> None:
        if self._prompt_length is not None:
            self.history.add(self._context[self._prompt_length :])
        self._prompt_length, self._context = None, []

    def forget(self) -> None:
        self.history.clear()
        self._prompt_length, self._context = None, []

    def stats(self) -> SuffixStats:
        c = self._stats
        return SuffixStats(
            lookups=c.lookups,
            hits=c.hits,
            from_history=c.from_history,
            match_length=c.last_match,
            draft_size=c.last_nodes,
            history_tokens=self.history.tokens,
        )

    def close(self) -> None:
        self.history.clear()


class _Counts:
    def __init__(self) -> None:
        self.lookups = self.hits = self.from_history = self.last_match = self.last_nodes = 0
