"""The cost formulas of speculative decoding, and `CostSnapshot`: a cost model frozen after one step.

A step that drafts k tokens costs D + k * d + T(k+1) seconds (draft_length.py says
why); these formulas read T(n), d and D and nothing else, so the engine's learning
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
    attributes `draft_s_per_token` (d) and `draft_fixed_s` (D)."""

    draft_s_per_token: float
    draft_fixed_s: float

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
        """S(a, k) = E(a, k) / ((D + k * d + T(k+1)) / T(1))."""
        if k <= 0:
            return 1.0
        return self.speedup_for(expected_tokens(a, k), k)

    def speedup_for(self, expected: float, k: int) -> float:
        """expected tokens per step / ((draft_time(k) + T(k+1)) / T(1)): any drafter, chain or tree.
        draft_time(k) is k * d plus the draft's fixed cost per step: charged per token, that
        cost made short drafts look no dearer per token than long ones and held automatic k at 1
        (docs/benchmarks.md, "Measurements behind the code")."""
        if k <= 0:
            return 1.0
        return expected / ((self.draft_time(k) + self.verify_time(k + 1)) / self.verify_time(1))


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
