"""The verification rule: which drafted tokens the target keeps, and the next token.

Notation as in the seed article and the papers: p is the target, q is the draft.

Given drafted tokens x_1..x_n, target rows p_1..p_{n+1} (p_i is the distribution
for the position of x_i; p_{n+1} is the one after x_n) and draft rows q_1..q_n:

    for i = 1..n:
        accept x_i with probability min(1, p_i(x_i) / q_i(x_i))
        on the first rejection, emit y ~ norm(max(0, p_i - q_i)) and stop
    if all n were accepted, emit a bonus token y ~ p_{n+1}

P(emit x) = min(p, q)(x) + (1 - sum min(p, q)) * norm(max(0, p - q))(x) = p(x): the
output is distributed exactly as p (article, section 2).

A drafter without a distribution (n-gram lookup) proposes a point mass:
q = delta(x_i). The same rule then reads: accept with probability p_i(x_i); on
rejection draw from p_i with x_i removed and renormalized.

Greedy (temperature 0) is the same rule with p one-hot on the target's argmax:
accept while the draft equals the argmax, and emit the argmax at the first
mismatch (or after the last draft). It has its own fast path on raw logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.core.events import Source
from engine.core.sampling import sample

TOP_RECORDED = 4  # candidates kept per greedy row, to explain batched-vs-single rounding


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many drafted tokens were kept (0..n)
    token: int  # the token emitted after them
    source: Source  # RESAMPLED, BONUS or PLAIN (nothing was drafted)
    p_draft: tuple[float, ...]  # p_i(x_i) for the kept tokens
    p_token: float  # p(token) in the row that produced it
    top_ids: tuple[tuple[int, ...], ...] = ()  # per emitted token (greedy only)
    top_logits: tuple[tuple[float, ...], ...] = ()


def residual_distribution(p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what to draw from after a rejection."""
    residual = torch.clamp(p_row - q_row, min=0.0)
    total = residual.sum()
    if not total > 0:  # p == q to rounding: a rejection had probability ~0; p is the right answer
        return p_row
    return residual / total


def verify_sampled(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft: list[int],
    generator: torch.Generator,
) -> Verdict:
    """Modified rejection sampling over processed distributions.

    p: (n+1, V) processed target probabilities; q: (n, V) processed draft
    probabilities, or None for a point-mass drafter; draft: the n drafted ids.
    """
    n = len(draft)
    if n == 0:
        token = sample(p[0], generator)
        return Verdict(0, token, Source.PLAIN, (), float(p[0, token]))
    ids = torch.tensor(draft, dtype=torch.long)
    rows = torch.arange(n)
    p_x = p[rows, ids]  # (n,)
    q_x = q[rows, ids].clamp_min(1e-30) if q is not None else torch.ones(n)  # (n,)
    u = torch.rand(n, generator=generator)  # one uniform per drafted token
    rejected = (u >= p_x / q_x).nonzero()
    accepted = int(rejected[0]) if len(rejected) else n
    kept = tuple(float(v) for v in p_x[:accepted])
    if accepted == n:
        token = sample(p[n], generator)
        return Verdict(n, token, Source.BONUS, kept, float(p[n, token]))
    p_row = p[accepted]
    if q is not None:
        q_row = q[accepted]
    else:
        q_row = torch.zeros_like(p_row)
        q_row[draft[accepted]] = 1.0
    token = sample(residual_distribution(p_row, q_row), generator)
    return Verdict(accepted, token, Source.RESAMPLED, kept, float(p_row[token]))


def verify_greedy(logits: torch.Tensor, draft: list[int]) -> Verdict:
    """Greedy rule on raw target logits (n+1, V): keep drafts while they equal the argmax.

    Runs once per target forward, so it works on a numpy view of the logits:
    per-row argmax and the few candidates kept for explaining divergences cost
    microseconds there, against hundreds for the same torch calls on one row.
    """
    rows = logits.float().numpy()  # (n+1, V); CPU float32 logits: a view, no copy
    best = rows.argmax(axis=1)  # (n+1,)
    n = len(draft)
    accepted = 0
    while accepted < n and best[accepted] == draft[accepted]:
        accepted += 1
    token = int(best[accepted])
    source = Source.PLAIN if n == 0 else (Source.BONUS if accepted == n else Source.RESAMPLED)
    top_ids, top_logits, probs = zip(*(_top_candidates(row) for row in rows[: accepted + 1]))
    return Verdict(accepted, token, source, probs[:accepted], probs[accepted], top_ids, top_logits)


def _top_candidates(row: np.ndarray) -> tuple[tuple[int, ...], tuple[float, ...], float]:
    """The TOP_RECORDED best ids and logits of one row, and the softmax probability of the best."""
    work = row.copy()
    ids = []
    for _ in range(min(TOP_RECORDED, len(row))):
        i = int(work.argmax())
        ids.append(i)
        work[i] = -np.inf
    values = tuple(float(row[i]) for i in ids)
    peak = values[0]
    log_z = peak + float(np.log(np.exp(row - peak).sum()))
    return tuple(ids), values, float(np.exp(peak - log_z))
