"""The run's predicted speedup: the article's formula applied to the drafts the run actually made.

Chains count E(a, n) tokens per step (engine/core/draft_length.py `expected_tokens`, a the run's
acceptance); trees 1 + the sum over depths of the product of the measured per-depth acceptance
(`expected_tokens_tree`). Against that, the sum of the steps' costs in units of one plain forward:
T(n+1+e) / T(1) per step for its n drafts (nodes) and e extra rows, plus the time the run spent
drafting, as timed, over T(1), plus on a recurrent target the expected rollback (a restore and a
replay after each rejection, engine/core/costs.py `rollback_time`). The cost model's draft time (D + n d) is what automatic k plans
with; the prediction takes what drafting cost: a chain's members cost differently (a model's n d
beside free lookups), and catching a draft model's cache up (the prompt at its first draft, the
tokens of steps it sat out) is paid too. Before any forward was timed, drafting is charged at the
cost model's n d.
"""

from __future__ import annotations

from engine.core.draft_length import CostModel, expected_tokens, expected_tokens_tree
from engine.core.events import RunStats


class SpeedupPrediction:
    """The shapes of a run's steps, counted, and the speedup they predict."""

    def __init__(self) -> None:
        # Chain steps by (drafts, extra rows), tree steps by (nodes, depth, extra rows); extra rows
        # (lookahead) add to a step's verify cost only.
        self.drafted_lengths: dict[tuple[int, int], int] = {}
        self.tree_shapes: dict[tuple[int, int, int], int] = {}

    def add(self, drafted: int, tree_depth: int | None, extra: int) -> None:
        """One step of `drafted` drafts (nodes), a tree `tree_depth` deep (None: a chain), `extra` rows."""
        if tree_depth is None:
            shape = (drafted, extra)
            self.drafted_lengths[shape] = self.drafted_lengths.get(shape, 0) + 1
        else:
            shape = (drafted, tree_depth, extra)
            self.tree_shapes[shape] = self.tree_shapes.get(shape, 0) + 1

    def speedup(self, stats: RunStats, costs: CostModel) -> float:
        a, rates = stats.acceptance_rate, stats.depth_acceptance
        gain = sum(c * expected_tokens(a, n) for (n, _), c in self.drafted_lengths.items())
        gain += sum(c * expected_tokens_tree(rates, depth) for (_, depth, _), c in self.tree_shapes.items())
        shapes = [*self.drafted_lengths.items(), *(((n, e), c) for (n, _, e), c in self.tree_shapes.items())]
        cost = sum(c * costs.verify_ratio(n + 1 + e) for (n, e), c in shapes)
        cost += (
            stats.draft_s / costs.verify_time(1)
            if costs.verify_s
            else sum(c * n * costs.draft_ratio() for (n, _), c in shapes)
        )
        # A recurrent target also restores and replays after each rejection (costs.rollback_time;
        # 0 where a rollback is a cut): left out, a run with many rejections read as inefficient.
        cost += sum(
            c * costs.rollback_time(expected_tokens(a, n), n, a**n) for (n, _), c in shapes
        ) / costs.verify_time(1)
        return gain / cost if cost > 0 else 1.0
