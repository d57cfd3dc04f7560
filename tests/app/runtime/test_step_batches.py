"""Steps reach the window in batches (fewer wake-ups of the GUI while the engine decodes), and none is lost."""

from __future__ import annotations

from types import SimpleNamespace

from app.runtime.steps import StepBatches
from engine.core.draft_length import CostModel


def step(index: int, finish_reason: str | None = None):
    return SimpleNamespace(index=index, finish_reason=finish_reason)


def test_steps_close_together_travel_together_and_the_first_and_last_go_at_once():
    now = [0.0]
    batches = []
    with StepBatches(batches.append, clock=lambda: now[0]) as on_step:
        for i in range(10):
            on_step("speculative", step(i, "length" if i == 9 else None), None, CostModel())
            now[0] += 0.012  # 80 steps a second
    indices = [[s[1].index for s in batch] for batch in batches]
    assert indices[0] == [0]  # the reply starts at once
    assert sum(indices, []) == list(range(10))  # every step, in order, once
    assert len(batches) < 6  # not one wake-up per step
    assert indices[-1][-1] == 9  # the last step was not held back


def test_what_is_held_when_the_run_breaks_off_is_handed_over():
    now = [0.0]
    batches = []
    try:
        with StepBatches(batches.append, clock=lambda: now[0]) as on_step:
            on_step("speculative", step(0), None, CostModel())
            on_step("speculative", step(1), None, CostModel())  # held: too soon after the first
            raise ConnectionError("the engine died")
    except ConnectionError:
        pass
    assert [s[1].index for batch in batches for s in batch] == [0, 1]
