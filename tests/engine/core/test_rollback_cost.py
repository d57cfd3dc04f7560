"""The cost of a rollback that replays (recurrent and hybrid targets), as the cost model counts it.

On such a target a rejected draft costs a restore and a replay of the kept tokens. What a user
notices: automatic k drafts shorter there than where a rollback is free, and the predicted
speedup the charts draw (the snapshot's formulas) charges the rollback.
"""

from __future__ import annotations

import random
import time

import pytest

from engine.core.costs import CostSnapshot
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.sampling import SamplingConfig
from engine.service import wire
from tests.factories.fake import MarkovBackend, MarkovDrafter, cycle_transition

CURVE = ((1, 0.010), (2, 0.011), (3, 0.012), (4, 0.013), (5, 0.014), (6, 0.015))


def test_the_speedup_charges_the_expected_rollback_and_nothing_where_a_rollback_is_a_cut():
    cut = CostSnapshot(CURVE, draft_s_per_token=0.001)
    replay = CostSnapshot(CURVE, draft_s_per_token=0.001, replays=True, rollback_fixed_s=0.004)
    a, k = 0.7, 4
    assert cut.rollback_time(2.0, k) == 0.0
    # P(reject) = 1 - a^k; E[j | reject] = (E - 1 - k a^k) / P(reject); replay j + 1 tokens
    expected = (1 - a ** (k + 1)) / (1 - a)
    rejected = 1 - a**k
    replayed = (expected - 1 - k * a**k) / rejected + 1
    t_replayed = 0.010 + (replayed - 1) * 0.001  # T is linear on this curve
    rollback = rejected * (0.004 + t_replayed)
    assert replay.speedup(a, k) == pytest.approx(expected / ((0.001 * k + 0.014 + rollback) / 0.010))
    assert replay.speedup(a, k) < cut.speedup(a, k)
    assert replay.speedup(1.0, k) == pytest.approx(cut.speedup(1.0, k))  # nothing rejected: nothing replayed


def test_automatic_k_drafts_shorter_where_rejections_are_dear():
    def chosen(costs: CostModel) -> int:
        length = DraftLength("auto", k_max=8)
        rng = random.Random(0)
        for _ in range(60):  # each draft accepted with probability 0.8, up to the first rejection
            kept = next((i for i in range(8) if rng.random() > 0.8), 8)
            length.observe(min(kept + 1, 8), kept)
        return length.choose(costs)

    flat = {1: 0.010, 2: 0.0102, 4: 0.0106, 8: 0.0114}  # a forward's rows nearly free (a GPU)
    free = CostModel(verify_s=dict(flat), draft_s_per_token=0.0003)
    dear = CostModel(verify_s=dict(flat), draft_s_per_token=0.0003, replays=True, rollback_fixed_s=0.002)
    assert 0 < chosen(dear) < chosen(free)


class SlowRollback(MarkovBackend):
    """A recurrent target in miniature: every rollback restores and replays, here a sleep."""

    replays_on_rollback = True
    ROLLBACK_S = 0.01

    def _forward(self, tokens, all_logits):
        time.sleep(0.0005 + 0.0001 * len(tokens))  # a forward's fixed cost, then its rows
        return super()._forward(tokens, all_logits)

    def _truncate(self, length: int) -> None:
        time.sleep(self.ROLLBACK_S)


class FreeRollback(SlowRollback):
    replays_on_rollback = False

    def _truncate(self, length: int) -> None:
        pass


def run(backend_type) -> tuple[float, CostModel]:
    """Mean drafts per step of a sampled reply with automatic k, and the cost model after it."""
    target, draft = cycle_transition(12, noise=0.15), cycle_transition(12, noise=0.02)
    costs = CostModel(verify_s={1: 0.0006, 2: 0.0007, 4: 0.0009, 8: 0.0013})
    steps = list(
        decode_steps(
            backend_type(target),
            [0, 1, 2],
            SamplingConfig(temperature=1.0, max_tokens=120, seed=3),
            drafter=MarkovDrafter(draft),
            draft_length=DraftLength("auto", k_max=8),
            costs=costs,
        )
    )
    stats = steps[-1].stats
    return stats.drafted / stats.steps, costs


def test_a_slow_rollback_is_timed_and_lowers_automatic_k():
    slow_k, slow = run(SlowRollback)
    free_k, free = run(FreeRollback)
    assert slow.replays and not free.replays
    assert slow.rollback_fixed_s >= 0.5 * SlowRollback.ROLLBACK_S  # measured: the sleep, beyond the replay
    assert free.rollback_fixed_s == 0.0
    assert slow_k < free_k
    snapshot = slow.snapshot()
    assert snapshot.speedup(0.8, 4) < CostSnapshot(snapshot.verify_s, snapshot.draft_s_per_token).speedup(0.8, 4)


def test_the_rollback_term_crosses_the_wire():
    costs = CostSnapshot(CURVE, draft_s_per_token=0.001, replays=True, rollback_fixed_s=0.004)
    back = wire.costs_from_dict(wire.loads(wire.dumps(wire.costs_to_dict(costs))))
    assert back == costs
    assert back.speedup(0.6, 5) == costs.speedup(0.6, 5)


def test_the_runs_predicted_speedup_charges_the_rollbacks_it_made():
    """The run's prediction (the efficiency a user reads) counts the restores and replays too;
    left out, a hybrid run with many rejections read as delivering less than its formula."""
    from engine.core.events import RunStats
    from engine.core.prediction import SpeedupPrediction

    def predicted(replays: bool) -> float:
        costs = CostModel()
        for n, seconds in CURVE:
            costs.observe_verify(n, seconds)
        costs.replays, costs.rollback_fixed_s = replays, 0.004
        steps = SpeedupPrediction()
        for _ in range(10):
            steps.add(4, None, 0)
        stats = RunStats(steps=10, drafted=40, accepted=18, tested=26, draft_s=0.01)
        return steps.speedup(stats, costs)

    assert predicted(replays=True) < 0.85 * predicted(replays=False)
