"""`CostSnapshot`: the engine's cost model as it stood after one step, frozen.

The engine's `CostModel` keeps learning as it decodes (every step times its
draft and its verify forward), while the charts draw on the GUI thread from T(n)
and the draft cost. So the GUI never reads a live one: the engine process sends
a copy with each step, taken between two steps, and the controller freezes it
here, on its worker thread, before it travels with the step. No Qt here.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import CostModel


@dataclass(frozen=True)
class CostSnapshot:
    verify_s: tuple[tuple[int, float], ...] = ()  # (n tokens, seconds per forward of n), by n
    draft_s_per_token: float = 0.0
    window: int = 7

    @classmethod
    def of(cls, costs: CostModel) -> CostSnapshot:
        """The numbers of `costs` now; call it on the thread that updates `costs`."""
        return cls(tuple(sorted(costs.verify_s.items())), costs.draft_s_per_token, costs.window)

    def model(self) -> CostModel:
        """A `CostModel` of these numbers for its formulas (T(n), speedup, break-even): the caller's
        own, which nothing else updates."""
        return CostModel(verify_s=dict(self.verify_s), draft_s_per_token=self.draft_s_per_token, window=self.window)
