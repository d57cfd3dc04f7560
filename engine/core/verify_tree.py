"""Tree verification: which branch of a token tree the target keeps, and the next token.

Notation as in verify.py: p is the target. A tree of n draft nodes is given by
`parents` (engine/core/tree.py): node i follows parents[i], or the pending token when
parents[i] == -1. Target rows: row 0 is p after the pending token (the root),
row i + 1 is p after node i. Tree drafters (Medusa, EAGLE, lookahead) propose
deterministic candidates: every node is a point mass, q = delta(node token).

Sampled rule (SpecInfer's multi-draft recursive rejection sampling, with
deterministic drafts). Start at the root with r = p_root; for its children
c_1, c_2, ... in order (siblings carry distinct tokens):

    accept c_j with probability r(c_j)             (= min(1, r(c_j) / q(c_j)), q = delta)
    on rejection r <- norm(max(0, r - delta_{c_j}))  (c_j's mass removed, renormalized)

On acceptance move to c_j and repeat with r = p at c_j. When every child is
rejected, emit y ~ r (the final residual); at a leaf, emit a bonus y ~ p.

Why it is lossless: each try is the one-draft point-mass rule of verify.py
applied to r, so "accept c_j, else draw from the residual" emits a token
distributed exactly as r (r(c_j) from the acceptance, (1 - r(c_j)) * r(x) /
(1 - r(c_j)) for every other x). By induction over the children, the token
emitted at a node is distributed exactly as p at that node: child c_j is
accepted with total probability p(c_j), and a token that is no child with
p(x). (Equivalently: draw y ~ p and accept the child equal to y, if any.) Given
that the token equals child c, the walk continues with p after c, which is the
target's conditional; so every emitted sequence has the target's law, whatever
candidates the drafter chose, as long as it chose them before the verifier's
draws. Typical acceptance (Medusa-2's lossy rule) is not offered.

Greedy (temperature 0) is the same rule with p one-hot on the argmax: from the
root, follow the child whose token is the target's argmax at the current node;
emit the argmax where no child matches (or after a leaf). Sibling order does not
matter because siblings are distinct.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.events import Source
from engine.core.sampling import sample
from engine.core.tree import check_parents
from engine.core.verify import Verdict, _top_candidates


@dataclass(frozen=True)
class TreeVerdict(Verdict):
    path: tuple[int, ...] = ()  # accepted node indices, depth 1 first (len == accepted)
    tested_depths: int = 0  # depths where the walk met at least one child (accepted + 1 on a rejection)


def children_of(tokens: list[int], parents: list[int] | tuple[int, ...]) -> list[dict[int, int]]:
    """For the root (index 0) and every node i (index i + 1): {child token: child node index}.

    Raises ValueError when two siblings carry the same token (use `dedupe_siblings`).
    """
    check_parents(parents)
    if len(tokens) != len(parents):
        raise ValueError(f"{len(tokens)} tokens but {len(parents)} parents")
    children: list[dict[int, int]] = [{} for _ in range(len(tokens) + 1)]
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        siblings = children[parent + 1]
        if token in siblings:
            raise ValueError(f"nodes {siblings[token]} and {i} are siblings with the same token {token}")
        siblings[token] = i
    return children


def dedupe_siblings(tokens: list[int], parents: list[int] | tuple[int, ...]) -> list[int]:
    """Nodes to keep so that no two siblings share a token: a repeated sibling and its
    whole subtree are dropped (the first one stays). Returns kept node indices, in order."""
    check_parents(parents)
    seen: set[tuple[int, int]] = set()
    dropped: set[int] = set()
    keep = []
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        if parent in dropped or (parent, token) in seen:
            dropped.add(i)
            continue
        seen.add((parent, token))
        keep.append(i)
    return keep


def verify_tree_greedy(logits: torch.Tensor, tokens: list[int], parents: list[int] | tuple[int, ...]) -> TreeVerdict:
    """Greedy rule on raw target logits (n+1, V): follow the child equal to the argmax."""
    children = children_of(tokens, parents)
    rows = logits.float().numpy()  # (n+1, V)
    best = rows.argmax(axis=1)  # (n+1,)
    path: list[int] = []
    row = 0  # the root: the pending token's row
    while (node := children[row].get(int(best[row]))) is not None:
        path.append(node)
        row = node + 1
    token = int(best[row])
    tested = len(path) + bool(children[row])
    source = _source(tokens, children[row])
    accepted_rows = [0, *(node + 1 for node in path)]
    top_ids, top_logits, probs = zip(*(_top_candidates(rows[r]) for r in accepted_rows))
    return TreeVerdict(len(path), token, source, probs[:-1], probs[-1], top_ids, top_logits, tuple(path), tested)


def verify_tree_sampled(
    p: torch.Tensor, tokens: list[int], parents: list[int] | tuple[int, ...], generator: torch.Generator
) -> TreeVerdict:
    """Recursive rejection sampling over processed target probabilities p (n+1, V), drafts as point masses."""
    children = children_of(tokens, parents)
    path: list[int] = []
    p_path: list[float] = []
    row = 0
    while True:
        p_row = p[row]  # (V,)
        residual = p_row
        accepted = None
        for child_token, node in children[row].items():  # insertion order = node order
            # Accept with probability r(c) (q is a point mass on c).
            if float(torch.rand(1, generator=generator)) < float(residual[child_token]):
                accepted = node
                break
            residual = _without(residual, child_token)  # norm(max(0, r - delta_c))
        if accepted is None:
            token = sample(residual, generator)  # all children rejected, or a leaf (residual = p)
            tested = len(path) + bool(children[row])
            source = _source(tokens, children[row])
            return TreeVerdict(
                len(path), token, source, tuple(p_path), float(p_row[token]), path=tuple(path), tested_depths=tested
            )
        path.append(accepted)
        p_path.append(float(p_row[tokens[accepted]]))
        row = accepted + 1


def _without(r: torch.Tensor, token: int) -> torch.Tensor:
    """r with `token`'s mass removed and renormalized; r itself when nothing would be left
    (a rejection that had probability ~0 in the first place)."""
    out = r.clone()
    out[token] = 0.0
    total = out.sum()
    if not total > 0:
        return r
    return out / total


def _source(tokens: list[int], children_here: dict[int, int]) -> Source:
    if not tokens:
        return Source.PLAIN
    return Source.RESAMPLED if children_here else Source.BONUS
