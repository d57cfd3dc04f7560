"""Medusa drafting: K heads on the target's last hidden state propose a token tree.

Cai et al. 2024 (arXiv 2401.10774), with an adaptive version of its "sparse tree".
After each step the decode loop hands over the target's final hidden states of
what it kept; the last row h belongs to the token whose logits chose the pending
token x_m. Head d (d = 1..K) maps h to a guess for the token d places after x_m,
so head 1 guesses the pending token's successor, head 2 the one after, and so on.

The tree. Every head offers its top R candidates (rank 0 = its best). A node at
depth d holds one candidate of head d; its children are candidates of head d + 1,
so siblings are distinct tokens. A node is accepted iff its whole path is, which
we estimate (as Medusa does) by the product of per-(head, rank) acceptance
estimates along the path:

    P(node) = acc[1][r_1] * acc[2][r_2] * ... * acc[d][r_d]

acc[d][r] is how often head d's rank-r candidate turned out to be the token the
target committed at that position, counted on the committed text (every step's
guesses are scored once the tokens they guessed are known, so the estimate does
not depend on what the tree happened to contain), blended with a prior that
fades as counts grow. With k nodes to spend (the decode loop's draft length k
is this drafter's node budget), the tree takes the k nodes of highest P,
best first; P never grows down a path, so parents always come before children.
The expected number of accepted tokens is the sum of P over the chosen nodes, so
a step is expected to emit 1 + that sum; `tree_expected_tokens` gives it to the
automatic draft length, which weighs it against the cost of verifying k + 1 rows.

Where the target cannot verify trees (llama.cpp has no features anyway, but a
chain-only features backend might) `TreeDraft.best_path` is the branch with the most
expected accepted tokens.
"""

from __future__ import annotations

import heapq

import torch

from engine.core.draft_length import K_LIMIT
from engine.core.sampling import SamplingConfig
from engine.core.tree import path_to
from engine.drafters.base import EMPTY_DRAFT, Draft, Drafter, DraftsTrees, ReadsFeatures, TreeDraft
from engine.drafters.medusa_spec import MedusaStats
from engine.heads.medusa import MedusaHeads

TOP_K = 10  # candidates per head
PRIOR_TOP1 = 0.5  # prior acceptance of head 1's best candidate...
PRIOR_HEAD_DECAY = 0.7  # ...times this per further head...
PRIOR_RANK_DECAY = 0.4  # ...and this per rank (ranks of one head sum to < 1, as they must)
PRIOR_WEIGHT = 4.0  # the prior counts as this many scored guesses


class MedusaDrafter(Drafter):
    name = "medusa"
    capabilities = frozenset({ReadsFeatures, DraftsTrees})

    def __init__(self, heads: MedusaHeads, target_backend, top_k: int = TOP_K) -> None:
        self.heads = heads
        self.target = target_backend
        self.num_heads = heads.config.num_heads
        self.top_k = max(1, min(top_k, target_backend.vocab_size))
        k, r = self.num_heads, self.top_k
        self._prior = torch.tensor(
            [[PRIOR_TOP1 * PRIOR_HEAD_DECAY**h * PRIOR_RANK_DECAY**i for i in range(r)] for h in range(k)],
            dtype=torch.float64,
        )  # (K, R)
        self.reset()

    # -- the decode loop's calls ------------------------------------------------------

    def reset(self) -> None:
        self._features: torch.Tensor | None = None  # (hidden,) of the last kept row
        self._hits = torch.zeros(self.num_heads, self.top_k, dtype=torch.float64)  # head, rank -> hits
        self._scored = torch.zeros(self.num_heads, dtype=torch.float64)  # head -> guesses scored
        self._guesses: list[list] = []  # [context length, candidates (K, R), heads scored so far]
        self._plan: list[tuple[int, int, int, float]] | None = None
        self.nodes = 0

    def observe_features(self, features: torch.Tensor) -> None:
        self._features = features[-1].detach()

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        self._score(context)
        if k <= 0 or self._features is None:  # the first step has no hidden state yet: plain
            return EMPTY_DRAFT
        candidates = self._candidates(self._features)  # K lists of R token ids, best first
        self._guesses.append([len(context), candidates, 0])
        plan = self.plan()[:k]
        tokens = [candidates[depth][rank] for _, depth, rank, _ in plan]
        parents = [parent for parent, _, _, _ in plan]
        # The branch to verify on a chain-only backend: most expected accepted tokens.
        reach: list[float] = []
        for parent, _, _, prob in plan:
            reach.append((reach[parent] if parent >= 0 else 0.0) + prob)
        best = max(range(len(plan)), key=reach.__getitem__) if plan else -1
        self.nodes = len(tokens)
        return TreeDraft(tokens, parents=tuple(parents), best_path=tuple(path_to(parents, best)))

    def tree_expected_tokens(self, nodes: int) -> float:
        return 1.0 + sum(prob for _, _, _, prob in self.plan()[:nodes])

    # -- the heads ------------------------------------------------------------------------

    def _candidates(self, hidden: torch.Tensor) -> list[list[int]]:
        with torch.inference_mode():
            hidden = hidden.to(next(self.heads.parameters()).dtype)  # (hidden,)
            if self.heads.config.shared_lm_head:
                # K small residual blocks, then the target's LM head once over the K states.
                logits = self.target.lm_head(self.heads.features(hidden))  # (K, V)
            else:
                logits = self.heads(hidden)  # (K, V): each head's own LM head
            return torch.topk(logits.float(), self.top_k, dim=-1).indices.tolist()

    # -- acceptance estimates and the tree shape -----------------------------------------------

    def acceptance(self) -> torch.Tensor:
        """acc[head][rank]: scored hits blended with the prior, (K, R)."""
        return (self._hits + PRIOR_WEIGHT * self._prior) / (self._scored[:, None] + PRIOR_WEIGHT)

    def plan(self) -> list[tuple[int, int, int, float]]:
        """The best K_LIMIT nodes, best first: (parent, depth 0-based, rank, P(node))."""
        if self._plan is None:
            acc = self.acceptance().tolist()
            plan: list[tuple[int, int, int, float]] = []
            heap = [(-acc[0][r], r, -1, 0, r) for r in range(self.top_k)]  # (-P, tiebreak, parent, depth, rank)
            heapq.heapify(heap)
            tiebreak = self.top_k
            while heap and len(plan) < K_LIMIT:
                neg, _, parent, depth, rank = heapq.heappop(heap)
                plan.append((parent, depth, rank, -neg))
                if depth + 1 < self.num_heads:
                    node = len(plan) - 1
                    for r in range(self.top_k):
                        heapq.heappush(heap, (neg * acc[depth + 1][r], tiebreak, node, depth + 1, r))
                        tiebreak += 1
            self._plan = plan
        return self._plan

    def _score(self, context: list[int]) -> None:
        """Score earlier guesses whose positions the context now holds: a guess made at
        context length m by head h (0-based) was for context[m + h]."""
        changed = False
        for guess in self._guesses:
            m, candidates, head = guess
            while head < self.num_heads and m + head < len(context):
                truth = context[m + head]
                self._scored[head] += 1
                if truth in candidates[head]:
                    self._hits[head, candidates[head].index(truth)] += 1
                head += 1
                changed = True
            guess[2] = head
        self._guesses = [g for g in self._guesses if g[2] < self.num_heads]
        if changed:
            self._plan = None

    def stats(self) -> MedusaStats:
        scored = self._scored.clamp_min(1)
        return MedusaStats(
            heads=self.num_heads,
            candidates_per_head=self.top_k,
            nodes=self.nodes,
            # Per head: how often its best candidate, and any of its candidates, was right.
            head_top1=tuple(round(v, 4) for v in (self._hits[:, 0] / scored).tolist()),
            head_top_k=tuple(round(v, 4) for v in (self._hits.sum(dim=1) / scored).tolist()),
            scored=tuple(int(v) for v in self._scored.tolist()),
        )
