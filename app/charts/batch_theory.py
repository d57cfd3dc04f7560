"""The article's speedup formula with a batch: B sequences share every verify forward (no Qt here).

Plain decoding of B sequences runs one forward over B rows per step: B tokens in T(B) seconds.
Speculative decoding drafts k tokens for each and verifies all of them in one forward over
B * (k + 1) rows: B * E(a, k) tokens in B * D(k) + T(B * (k + 1)) seconds, D(k) a sequence's
drafting (and, on a target that replays, its expected rollback). So

    S(a, k, B) = E(a, k) * T(B) / (B * D(k) + T(B * (k + 1)))

which at B = 1 is the article's formula as the theory panel draws it (CostFormulas.speedup).
Where T(rows) is flat (the weights are read once for any number of rows) the extra rows are
nearly free; once the batch fills the forward, T grows with every row and S falls below 1: the
break-even B. T is the cost model's measured curve; past the largest row count it measured, the
engine's own rule extends it along its last (or average, if steeper) slope (costs.on_curve), an
assumption the panel's tooltip states. The engine's automatic k maximizes this same goodput per
batch (engine/core/batch_k.py); here k is the one the panel draws.
"""

from __future__ import annotations

import numpy as np

from engine import expected_tokens

LARGEST_BATCH = 256  # the break-even B is looked for up to here


def batch_speedup(costs, a: float, k: int, batch: int) -> float:
    """S(a, k, B) over `costs` (a CostSnapshot or CostModel: T(n), draft and rollback times)."""
    if k <= 0:
        return 1.0
    a = min(max(a, 0.0), 1.0)
    expected = expected_tokens(a, k)
    own = costs.draft_time(k) + costs.rollback_time(expected, k, a**k)
    return expected * costs.verify_time(batch) / (batch * own + costs.verify_time(batch * (k + 1)))


def batch_speedups(costs, a: np.ndarray, k: int, batch: int) -> np.ndarray:
    return np.array([batch_speedup(costs, x, k, batch) for x in a])


def break_even_acceptance_at(costs, k: int, batch: int) -> float | None:
    """Smallest a at which drafting k tokens for each of B sequences beats plain decoding; None if none does."""
    if k <= 0 or batch_speedup(costs, 1.0, k, batch) <= 1.0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if batch_speedup(costs, mid, k, batch) > 1.0 else (mid, hi)
    return hi


def break_even_batch(costs, a: float, k: int, largest: int = LARGEST_BATCH) -> int | None:
    """Smallest B at which drafting k tokens at acceptance a no longer beats plain decoding
    (1 when it never did; None when it still pays at `largest`)."""
    for batch in range(1, largest + 1):
        if batch_speedup(costs, a, k, batch) <= 1.0:
            return batch
    return None
