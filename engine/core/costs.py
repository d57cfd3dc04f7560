"""The cost formulas of speculative decoding, and `CostSnapshot`: a cost model frozen after one step.

A step that drafts k tokens costs D + k * d + T(k+1) seconds (draft_length.py says
why), plus, on a target whose rollback replays (a recurrent or hybrid model:
engine/backends/checkpoints.py), the expected rollback cost `rollback_time` below;
these formulas read T(n), d, D and the rollback's overhead R, so the engine's learning
`CostModel` (engine/core/draft_length.py) and a `CostSnapshot` of it share them
(`CostFormulas`). The engine keeps learning as it decodes (every step times its draft
and its verify forward), while a reader on another thread or in another process draws
from what the model said after a step: each step's record carries a snapshot
(`StepEvent.costs`), taken on the engine's thread between two steps, which travels
as it is (engine/service/wire.py) and answers T(n), the speedup and the break-even
as the model did. Light: no torch, no llama.cpp, no Qt.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property


def expected_tokens(a: float, k: int) -> float:
    """E[tokens per step] = (1 - a^(k+1)) / (1 - a); k + 1 when a = 1."""
    if k <= 0:
        return 1.0
    a = min(max(a, 0.0), 1.0)
    if a >= 1.0 - 1e-12:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def on_curve(times: dict[int, float], sizes: list[int], n: int) -> float:
    """T(n) from measured `times` (`sizes` = sorted keys): linear between two sizes, proportional
    below the smallest; past the largest, the last segment's slope, or the curve's average slope
    where that is steeper: two neighbouring timings a little noisy made the last segment flat, and
    a long draft then looked as cheap to verify as a short one (docs/benchmarks.md, "Measurements behind the code")."""
    if n in times:
        return times[n]
    i = bisect.bisect_left(sizes, n)  # sizes[i - 1] < n < sizes[i]
    if i == 0:
        return times[sizes[0]] * n / sizes[0]
    lower = sizes[i - 1]
    if i == len(sizes):  # beyond the curve
        if i == 1:
            return times[lower] * n / lower
        last = (times[lower] - times[sizes[i - 2]]) / (lower - sizes[i - 2])
        average = (times[lower] - times[sizes[0]]) / (lower - sizes[0])
        return times[lower] + max(last, average, 0.0) * (n - lower)
    upper = sizes[i]
    t = (n - lower) / (upper - lower)
    return times[lower] * (1 - t) + times[upper] * t


class CostFormulas:
    """The formulas over a cost model's numbers: a subclass gives `verify_time(n)` (T(n)) and the
    attributes `draft_s_per_token` (d), `draft_fixed_s` (D), `replays` (whether a rejection costs
    a restore and a replay) and `rollback_fixed_s` (R, the restore's part)."""

    draft_s_per_token: float
    draft_fixed_s: float
    replays: bool = False
    rollback_fixed_s: float = 0.0

    def verify_time(self, n: int) -> float:
        raise NotImplementedError

    def draft_time(self, k: int) -> float:
        """Seconds to draft k tokens: the draft's fixed cost per step (feeding it the step's
        pending tokens, the drafter's own work) plus k times its cost per token."""
        return self.draft_fixed_s + k * self.draft_s_per_token if k > 0 else 0.0

    def draft_ratio(self) -> float:
        """c_d = d / T(1)."""
        return self.draft_s_per_token / self.verify_time(1)

    def verify_ratio(self, n: int) -> float:
        """T(n) / T(1)."""
        return self.verify_time(n) / self.verify_time(1)

    def speedup(self, a: float, k: int) -> float:
        """S(a, k) = E(a, k) / ((D + k * d + T(k+1) + rollback) / T(1)); every draft accepted with
        probability a^k."""
        if k <= 0:
            return 1.0
        return self.speedup_for(expected_tokens(a, k), k, min(max(a, 0.0), 1.0) ** k)

    def speedup_for(self, expected: float, k: int, all_accepted: float | None = None) -> float:
        """expected tokens per step / ((draft_time(k) + T(k+1) + rollback_time) / T(1)): any drafter,
        chain or tree. draft_time(k) is k * d plus the draft's fixed cost per step: charged per
        token, that cost made short drafts look no dearer per token than long ones and held
        automatic k at 1 (docs/benchmarks.md, "Measurements behind the code"). `all_accepted`:
        the probability that the step keeps all k drafts (rollback_time says what None means)."""
        if k <= 0:
            return 1.0
        step = self.draft_time(k) + self.verify_time(k + 1) + self.rollback_time(expected, k, all_accepted)
        return expected / (step / self.verify_time(1))

    def rollback_time(self, expected: float, k: int, all_accepted: float | None = None) -> float:
        """The expected seconds a step of k drafts spends rolling back; 0 where a rollback is a cut.

        A replaying target saved its state before the verify forward over [x_m, d_1..d_k]; a
        rejection after j accepted drafts restores it and replays x_m, d_1..d_j, j + 1 tokens:

            rollback = P(reject) * (R + T(E[j | reject] + 1))
            P(reject) = 1 - P(all k accepted)
            E[j | reject] = (E[accepted] - k * P(all k accepted)) / P(reject),  E[accepted] = expected - 1

        R is the restore (and whatever the replay costs beyond a forward of its tokens, measured:
        `CostModel.observe_rollback`); T the verify curve, since a replay is a forward. Without
        `all_accepted` (a tree), P(all) is taken from the one acceptance a with E(a, k) = expected."""
        if not self.replays or k <= 0:
            return 0.0
        if all_accepted is None:
            all_accepted = _uniform_acceptance(expected, k) ** k
        rejected = 1.0 - min(max(all_accepted, 0.0), 1.0)
        if rejected <= 1e-9:
            return 0.0
        accepted_if_rejected = (expected - 1.0 - k * (1.0 - rejected)) / rejected
        replayed = min(max(accepted_if_rejected + 1.0, 1.0), float(k))
        return rejected * (self.rollback_fixed_s + self.verify_time(replayed))


def _uniform_acceptance(expected: float, k: int) -> float:
    """The a in [0, 1] with E(a, k) = expected (E grows with a), by bisection."""
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < expected else (lo, mid)
    return (lo + hi) / 2


def break_even_acceptance(costs: CostFormulas, k: int) -> float | None:
    """Smallest a at which drafting k tokens beats plain decoding; None if no a <= 1 does."""
    if k <= 0 or costs.speedup(1.0, k) <= 1.0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if costs.speedup(mid, k) > 1.0:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class CostSnapshot(CostFormulas):
    """A `CostModel`'s numbers as they stood at one moment (`CostModel.snapshot()`), with its formulas.
    Nothing updates it: any thread may read it while the engine decodes."""

    verify_s: tuple[tuple[int, float], ...] = ()  # (n tokens, seconds per forward of n), by n
    draft_s_per_token: float = 0.0
    draft_fixed_s: float = 0.0
    window: int = 7  # the timings each number is the low median of
    replays: bool = False  # a rejection restores a state and replays the kept tokens (rollback_time)
    rollback_fixed_s: float = 0.0  # R: a rollback's seconds beyond the forward of what it replays

    @cached_property
    def _curve(self) -> tuple[dict[int, float], list[int]]:
        return dict(self.verify_s), [n for n, _ in self.verify_s]

    def snapshot(self) -> CostSnapshot:
        """Itself (already one), as `CostModel.snapshot()` gives one."""
        return self

    def verify_time(self, n: int) -> float:
        """T(n), as the model it was taken from said."""
        if not self.verify_s:
            return float(n)  # unmeasured: assume no parallelism at all (the pessimistic case)
        return on_curve(*self._curve, n)
