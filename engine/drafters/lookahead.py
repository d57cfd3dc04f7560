"""Lookahead decoding: Jacobi iterations and an n-gram pool, inside the target's own forward.

Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding" (arXiv 2402.02057). No draft model and no training: every step runs,
in one target forward, a lookahead branch that guesses n-grams by Jacobi
iteration and a verification branch that checks earlier guesses.

The lookahead branch. Jacobi decoding solves y_i = argmax p(y | x, y_1..y_{i-1})
for a window of future positions all at once: start from any guess, recompute
every position from the current guesses in one forward, repeat; the fixed point
is the greedy continuation. Lookahead keeps the last N - 1 iterates as "levels"
of a 2-D window of W columns. With the pending token x_m at offset 0:

    level l, column c (l = 0..N-2, c = 1..W) sits at offset l + c

and attends to the cache, x_m, the level-0 tokens of columns 1..c and the
tokens of its own column in levels 1..l (llama.cpp's examples/lookahead mask,
the blog post's figure). So column c read upwards is a sequence at consecutive
offsets: x_m, L0[1], ..., L0[c], L1[c], ..., L_{N-2}[c]. The target's argmax
after the top level gives a new level (the token at offset c + N - 1 for every
column) and each column's trajectory

    (L0[c], L1[c], ..., L_{N-2}[c], new[c])

is an N-gram whose last token follows its first N - 1 in the target's view; it
goes into the pool, keyed by its first token (at most G continuations per key,
most recent first). The window then moves one level up: L_l <- L_{l+1}, the new
level on top, and everything sits one offset lower, behind the next pending
token. When a step emitted s > 1 tokens the pending token moved s places, so
the columns shift left by s - 1 as well (each token keeps its absolute
position; the s - 1 columns now in the past drop out and fresh columns enter on
the right). Fresh columns, and the whole window at the start or after a jump
past it, are tokens drawn at random from the context (as the reference does),
with the engine's generator. The window uses the argmax even when sampling:
it only makes guesses, and guesses cannot change the output's law.

Where this differs from llama.cpp's example: its window's first column starts
at x_m itself (W - 1 level-0 rows), here level 0 covers offsets 1..W as in the
paper; after a step that emitted several tokens it moves the levels up once per
token and refills the top with copies, here the columns shift so that every
kept guess stays at its absolute position; and its pool is a ring of G slots
per key, verified in slot order, where here the newest comes first (an N-gram
seen again moves to the front).

The verification branch. The pool is also fed from the committed text itself
(every N-gram of the prompt and the reply, as the reference implementations do
optionally), which is what pays on repetitive prompts. Up to G continuations of
the pending token are verified: those from the text ranked by how many tokens
before them match the text's end (prompt lookup's rule), then most recent
first, interleaved with the Jacobi ones (most recent first). They are merged
into a prefix trie (siblings distinct) and returned as an ordinary tree `Draft`,
so the decode loop's tree verification accepts the longest verified candidate:
greedy follows the argmax down the trie, and sampling uses the recursive
rejection rule with point masses (engine/core/verify_tree.py), which is lossless
whatever the candidates were. The window rides along as the draft's extra rows
(`TreeDraft.extra`, an `ExtraRows`); nodes and window never see each other, so the window
cannot change the verdict, and its cache entries are dropped after the step.

On llama.cpp the step's block runs through sequence ids (engine/backends/llama_tree.py), at
about what a chain of as many rows costs; its cost model is the same chain curve.

Costs and defaults. A step runs 1 + n + (N - 1) W rows for n trie nodes (n <=
G (N - 1)). On a GPU rows are nearly free up to a few dozen; on a CPU they are
not (bf16: 8 rows ~1.3x one row, 32 rows much more). The automatic W, N, G take
the largest row count B whose verify ratio T(B) / T(1) on the measured curve
(`CostModel`) is at most CHEAP_RATIO, and split it about evenly: N = 2 below 6
rows, 3 below 24, 4 below 48, else 5; the window takes half of the B - 1 rows
after the pending token, W = (B - 1) // 2 // (N - 1); the candidates take the
rest, G = (B - 1 - (N - 1) W) // (N - 1), at most K_LIMIT nodes. Without a
measured curve B = DEFAULT_ROWS. Parameters given explicitly stay as given and
the others are fitted around them; "auto" ones are re-fitted at every `reset`
(the start of a generation), when the cost curve may have been measured.

The decode loop's node budget k (automatic or fixed) trims the trie; the window
is not counted in k. For automatic k, `tree_expected_tokens(k)` is 1 + the
measured accepted tokens per step (decayed, with an optimistic prior so that the
window gets to run) times the share of the usual trie that k nodes cover, and
it is scaled by (k c_d + T(k+1)) / (k c_d + T(k+1+e)) so that the draft-length
formula, which charges T(k+1), in effect charges the e window rows too.
"""

from __future__ import annotations

import torch

from engine.backends.capabilities import TreeForward, require
from engine.core.draft_length import K_LIMIT, CostModel
from engine.core.sampling import SamplingConfig
from engine.drafters.base import (
    EMPTY_DRAFT,
    Draft,
    Drafter,
    DraftsTrees,
    ExtraRows,
    ReadsCosts,
    ReadsExtraRows,
    TreeDraft,
)
from engine.drafters.lookahead_spec import LIMITS, LookaheadStats, check_parameters  # noqa: F401 (LIMITS: tests)

AUTO = "auto"
CHEAP_RATIO = 1.5  # rows whose verify ratio T(n) / T(1) stays under this count as cheap
DEFAULT_ROWS = 16  # the row budget without a measured cost curve
MAX_ROWS = 64  # the largest automatic row budget
SUFFIX_MATCH = 3  # text candidates are ranked by up to this many matching tokens before them
DECAY = 0.9  # weight of the past in the acceptance estimate, per step
PRIOR_STEPS = 2.0  # the prior counts as this many steps...
PRIOR_ACCEPTED = 1.0  # ...that accepted this many tokens each


def cheap_rows(costs: CostModel | None) -> int:
    """The row budget B: the largest n <= MAX_ROWS with T(n) / T(1) <= CHEAP_RATIO on the
    measured curve (at least 4), or DEFAULT_ROWS when there is no curve."""
    if costs is None or len(costs.verify_s) < 2:
        return DEFAULT_ROWS
    best = 1
    for n in range(1, MAX_ROWS + 1):
        if costs.verify_ratio(n) <= CHEAP_RATIO:
            best = n
    return max(best, 4)


def auto_parameters(
    costs: CostModel | None, window: int | None = None, ngram: int | None = None, candidates: int | None = None
) -> tuple[int, int, int]:
    """(W, N, G): the given ones as they are, the others fitted to the row budget (module docstring)."""
    rows = cheap_rows(costs)
    if ngram is None:
        ngram = 2 if rows < 6 else 3 if rows < 24 else 4 if rows < 48 else 5
    if window is None:
        window = max(1, (rows - 1) // 2 // (ngram - 1))
    if candidates is None:
        candidates = max(1, (rows - 1 - (ngram - 1) * window) // (ngram - 1))
        candidates = min(candidates, max(1, K_LIMIT // (ngram - 1)))
    return window, ngram, candidates


def window_layout(window: int, ngram: int) -> tuple[tuple[int, ...], torch.Tensor]:
    """Offsets and mask (bool (e, e)) of the window's e = (N - 1) W rows, level-major:
    row l W + c - 1 is level l, column c (offset l + c). It sees level 0's columns 1..c
    and its own column in levels 1..l (and, through the decode loop, x_m and the cache)."""
    levels = ngram - 1
    offsets = tuple(level + c for level in range(levels) for c in range(1, window + 1))
    mask = torch.zeros(levels * window, levels * window, dtype=torch.bool)
    for level in range(levels):
        for c in range(1, window + 1):
            row = level * window + c - 1
            mask[row, :c] = True  # level 0, columns 1..c
            for below in range(1, level + 1):
                mask[row, below * window + c - 1] = True  # this column, levels 1..level
    return offsets, mask


class LookaheadDrafter(Drafter):
    name = "lookahead"
    capabilities = frozenset({DraftsTrees, ReadsExtraRows, ReadsCosts})

    def __init__(
        self,
        target_backend,
        window: int | str = AUTO,
        ngram: int | str = AUTO,
        candidates: int | str = AUTO,
        costs: CostModel | None = None,
        text_pool: bool = True,
    ) -> None:
        """`costs`: the target's cost model (the one the decode loop uses), for the automatic
        parameters and for charging the window's rows to automatic k; may be set later.
        `text_pool`: also take candidates from the prompt's and the reply's own n-grams."""
        self._asked = check_parameters(window, ngram, candidates)
        require(target_backend, TreeForward, "Lookahead decoding")
        self.target = target_backend
        self.costs = costs
        self.text_pool = bool(text_pool)
        self.reset()

    # -- parameters -------------------------------------------------------------------------

    @property
    def parameters(self) -> tuple[int, int, int]:
        """(W, N, G) in use."""
        return self.window, self.ngram, self.max_candidates

    @property
    def extra_rows(self) -> int:
        return (self.ngram - 1) * self.window

    def _fit_parameters(self) -> None:
        shape = getattr(self, "window", None), getattr(self, "ngram", None)
        self.window, self.ngram, self.max_candidates = auto_parameters(self.costs, *self._asked)
        if shape != (self.window, self.ngram):
            self._offsets, self._mask = window_layout(self.window, self.ngram)

    # -- the decode loop's calls ------------------------------------------------------------

    def reset(self) -> None:
        self._fit_parameters()
        self._levels: list[list[int]] | None = None  # N - 1 levels of W tokens (columns 1..W)
        self._anchor = 0  # index in the context of the token the window sits behind
        self._jacobi: dict[int, list[tuple[int, ...]]] = {}  # first token -> continuations, newest first
        self._text: dict[int, dict[tuple[int, ...], int]] = {}  # first token -> {continuation: position}, newest last
        self._indexed = 0  # start positions of the context already in self._text
        self._running = False  # the last proposal carried the window
        self.steps = self.hits = self.accepted = 0
        self.candidates = self.nodes = 0
        self._w_steps = PRIOR_STEPS
        self._w_accepted = PRIOR_STEPS * PRIOR_ACCEPTED
        self._w_offered = PRIOR_STEPS * self.max_candidates * (self.ngram - 1) / 2

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        self._running = False
        if k <= 0 or not context:
            return EMPTY_DRAFT
        if self.text_pool:
            self._index_text(context)
        self._place_window(context, generator)
        tokens, parents, paths = _trie(self._candidates(context))
        offered = len(tokens)
        tokens, parents = tokens[:k], parents[:k]
        self.candidates = sum(1 for path in paths if path[0] < len(tokens))
        self.nodes = len(tokens)
        self.steps += 1
        self._w_steps = self._w_steps * DECAY + 1
        self._w_accepted *= DECAY
        self._w_offered = self._w_offered * DECAY + offered
        self._running = True
        best = tuple(node for node in paths[0] if node < len(tokens)) if paths else ()
        window = ExtraRows(tuple(t for level in self._levels for t in level), self._offsets, self._mask)
        return TreeDraft(tokens, parents=tuple(parents), best_path=best, extra=window)

    def observe_extra(self, logits: torch.Tensor) -> None:
        """The window's rows ran: the top level's argmax is the next level; every column's
        trajectory becomes an N-gram of the pool; the window moves up one level."""
        if not self._running or self._levels is None or logits.shape[0] != self.extra_rows:
            return
        self._running = False
        top = logits[(self.ngram - 2) * self.window :].argmax(dim=-1).tolist()  # (W,) offsets c + N - 1
        for c in range(self.window):
            gram = [level[c] for level in self._levels] + [top[c]]
            self._add_jacobi(gram[0], tuple(gram[1:]))
        self._levels = self._levels[1:] + [top]
        self._anchor += 1  # level l, column c: context index anchor + l + c (offset l + c after it)

    def observe(self, drafted: int, accepted: int) -> None:
        self._w_accepted += accepted
        self.accepted += accepted
        if accepted > 0:
            self.hits += 1

    def tree_expected_tokens(self, nodes: int) -> float:
        gain = self._w_accepted / self._w_steps  # accepted tokens per step
        offered = self._w_offered / self._w_steps  # trie nodes per step before the budget
        cover = min(1.0, nodes / offered) if offered > 0 else 0.0
        expected = 1.0 + gain * cover
        costs = self.costs
        if costs is not None and costs.verify_s and nodes > 0:
            draft = nodes * costs.draft_ratio()
            charged, real = costs.verify_ratio(nodes + 1), costs.verify_ratio(nodes + 1 + self.extra_rows)
            expected *= (draft + charged) / (draft + real)
        return expected

    def stats(self) -> LookaheadStats:
        jacobi = sum(len(v) for v in self._jacobi.values())
        text = sum(len(v) for v in self._text.values())
        return LookaheadStats(
            window=self.window,
            ngram=self.ngram,
            max_candidates=self.max_candidates,
            extra_rows=self.extra_rows,
            pool_size=jacobi + text,
            pool_jacobi=jacobi,
            pool_text=text,  # n-grams: from the window and the text
            steps=self.steps,  # steps that ran the window
            pool_hits=self.hits,  # steps where a candidate had at least one token accepted
            accepted=self.accepted,
            candidates=self.candidates,  # candidates in this step's tree
            nodes=self.nodes,
        )

    # -- the window -------------------------------------------------------------------------

    def _place_window(self, context: list[int], generator: torch.Generator) -> None:
        """Lay the window behind the pending token context[-1], keeping every token at its
        absolute position where it can (module docstring)."""
        pending = len(context) - 1
        shift = pending - self._anchor
        if self._levels is None or not 0 <= shift < self.window or len(self._levels) != self.ngram - 1:
            self._levels = [self._random(context, self.window, generator) for _ in range(self.ngram - 1)]
        elif shift:
            self._levels = [level[shift:] + self._random(context, shift, generator) for level in self._levels]
        self._anchor = pending

    @staticmethod
    def _random(context: list[int], count: int, generator: torch.Generator) -> list[int]:
        """`count` tokens drawn from the context (past its first token, usually BOS)."""
        start = 1 if len(context) > 1 else 0
        picks = torch.randint(start, len(context), (count,), generator=generator).tolist()
        return [context[i] for i in picks]

    # -- the pool ---------------------------------------------------------------------------

    def _add_jacobi(self, first: int, continuation: tuple[int, ...]) -> None:
        known = self._jacobi.setdefault(first, [])
        if continuation in known:
            known.remove(continuation)
        known.insert(0, continuation)
        del known[self.max_candidates :]

    def _index_text(self, context: list[int]) -> None:
        """Add the N-grams of the context that are complete and not indexed yet."""
        span = self.ngram - 1
        if len(context) < self._indexed + span:  # a shorter context than last time: start over
            self._text, self._indexed = {}, 0
        for start in range(self._indexed, len(context) - span):
            known = self._text.setdefault(context[start], {})
            continuation = tuple(context[start + 1 : start + 1 + span])
            known.pop(continuation, None)
            known[continuation] = start
            if len(known) > self.max_candidates:
                del known[next(iter(known))]  # the oldest
        self._indexed = max(self._indexed, len(context) - span)

    def _candidates(self, context: list[int]) -> list[tuple[int, ...]]:
        """Up to G distinct continuations of the pending token: from the text (longest match
        before them first, then newest) interleaved with the window's (newest first)."""
        pending = context[-1]

        def matched(start: int) -> int:
            n = 0
            while n < SUFFIX_MATCH and start - 1 - n >= 0 and context[start - 1 - n] == context[-2 - n]:
                n += 1
            return n

        text = sorted(self._text.get(pending, {}).items(), key=lambda item: (-matched(item[1]), -item[1]))
        jacobi = self._jacobi.get(pending, [])
        out: list[tuple[int, ...]] = []
        for i in range(max(len(text), len(jacobi))):
            for continuation in ([text[i][0]] if i < len(text) else []) + ([jacobi[i]] if i < len(jacobi) else []):
                if continuation not in out:
                    out.append(continuation)
        return out[: self.max_candidates]


def _trie(candidates: list[tuple[int, ...]]) -> tuple[list[int], list[int], list[list[int]]]:
    """Merge candidates into a prefix trie: (tokens, parents, each candidate's node path).
    Nodes come candidate by candidate, so parents precede children and cutting the list
    after k nodes leaves a valid tree holding the first candidates whole."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}
    paths: list[list[int]] = []
    for candidate in candidates:
        parent, path = -1, []
        for token in candidate:
            node = children.get((parent, token))
            if node is None:
                node = children[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            path.append(node)
            parent = node
        paths.append(path)
    return tokens, parents, paths
