"""How many tokens each sequence of a batch drafts: the article's section 4 made operational.

One sequence alone drafts what its own DraftLength chooses (engine/core/draft_length.py):
the k that maximizes its predicted speedup. In a batch the forward is shared, so what
counts is the batch's goodput, expected tokens per second over all its sequences:

    G(k_1..k_B) = sum_i E_i(k_i) / (sum_i (D_i(k_i) + rollback_i(k_i)) + T(sum_i (k_i + 1)))

with E_i the sequence's expected tokens for k_i drafts (its per-depth acceptance, or its
tree drafter's estimate), D_i its drafting time and T the verify cost over the batch's
total rows. Where T(rows) is flat (a memory-bound forward: weights read once for any
number of rows) drafting is nearly free and every sequence drafts; where the batch has
made the forward compute-bound (T grows with every row), each draft row costs what a
sequence's own token costs and pays only if it is accepted nearly always: G falls with
any k > 0 and speculation switches off, to come back when load falls. The lengths are
found by handing out draft rows one at a time (`best_lengths`).
A fixed k (`--k N`, a request's own n_max / n_min) stays as it is; automatic k never
exceeds what the sequence's bounds and room allow.
"""

from __future__ import annotations

import heapq

from engine.core.costs import CostFormulas

CLEAR_GAIN = 1.005  # a change must raise the goodput by this much (timing noise is not a gain)


def choose_draft_lengths(sequences: list, costs: CostFormulas) -> list[int]:
    """Each sequence's draft length for this step (engine/core/sequence.py Sequence: its drafter,
    DraftLength and k_limit)."""
    if len(sequences) == 1:  # one sequence: its own choice, exactly as it decodes alone
        s = sequences[0]
        return [0 if s.drafter is None else max(0, min(s.draft_length.choose(costs), s.k_limit))]
    ks: list[int] = []
    curves: list[list[tuple[float, float | None]] | None] = []
    free: list[bool] = []  # automatic k: this step chooses it
    for s in sequences:
        limit = s.k_limit
        if s.drafter is None or limit <= 0:
            ks.append(0)
            curves.append(None)
            free.append(False)
            continue
        curve = s.draft_length.expected_by_k()
        free.append(s.draft_length.auto)
        ks.append(0 if s.draft_length.auto else max(0, min(s.draft_length.choose(costs), limit)))
        curves.append(curve[: limit + 1] if s.draft_length.auto else curve)
    chosen = best_lengths(ks, curves, free, costs)
    return [s.draft_length.bounded(k) if auto else k for s, k, auto in zip(sequences, chosen, free)]


def best_lengths(ks: list[int], curves: list, free: list[bool], costs: CostFormulas) -> list[int]:
    """`ks` with each `free` entry set to maximize the batch's goodput; curves[i] holds E(k) and
    P(all k accepted) for k = 0, 1, ... of sequence i (None: plain decoding, 1 token per step).

    Every draft row costs the batch the same (the shared forward's next row, a drafted token's d),
    so the next row goes to the sequence it gains most tokens: rows are handed out one at a time,
    best gain first, and the allocation kept is the one with the highest goodput on the way (T(rows)
    may be flat again after a step, so one row that does not pay does not end the search)."""
    ks = [0 if f else k for k, f in zip(ks, free)]
    expected, spent = [], []
    for k, curve in zip(ks, curves):
        e, all_accepted = curve[min(k, len(curve) - 1)] if curve is not None else (1.0, None)
        expected.append(e)
        spent.append(_own_cost(costs, k, e, all_accepted))
    rows = sum(k + 1 for k in ks)
    tokens, seconds = sum(expected), sum(spent)
    best, chosen = tokens / max(seconds + costs.verify_time(rows), 1e-12), list(ks)
    gains = [(-(curves[i][1][0] - curves[i][0][0]), i) for i in range(len(ks)) if free[i] and len(curves[i]) > 1]
    heapq.heapify(gains)
    while gains:
        _, i = heapq.heappop(gains)
        k = ks[i] = ks[i] + 1
        e, all_accepted = curves[i][k]
        cost = _own_cost(costs, k, e, all_accepted)
        tokens, seconds, rows = tokens + e - expected[i], seconds + cost - spent[i], rows + 1
        expected[i], spent[i] = e, cost
        g = tokens / max(seconds + costs.verify_time(rows), 1e-12)
        if g > best * CLEAR_GAIN:
            best, chosen = g, list(ks)
        if k + 1 < len(curves[i]):
            heapq.heappush(gains, (-(curves[i][k + 1][0] - e), i))
    return chosen


def _own_cost(costs: CostFormulas, k: int, expected: float, all_accepted: float | None) -> float:
    """A sequence's seconds outside the shared forward: drafting k tokens and, on a target that
    replays, its expected rollback."""
    if k <= 0:
        return 0.0
    return costs.draft_time(k) + costs.rollback_time(expected, k, all_accepted)
