"""The theory panel's batch axis: with B sequences sharing each verify forward the predicted speedup
falls, the break-even acceptance rises, and past the break-even B no acceptance pays (the article's
failure mode 2); at B = 1 it is the article's formula, as before."""

from __future__ import annotations

import numpy as np
import pytest

from app.charts.batch_theory import batch_speedup, break_even_acceptance_at, break_even_batch
from app.charts.live import LiveCharts, RedrawPace
from engine import break_even_acceptance
from tests.app.charts.test_charts import CHEAP, LINEAR, PLAIN_STEPS, SPEC_STEPS, drawn, feed, make_run
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG


@pytest.fixture
def charts(qtbot):
    widget = LiveCharts()
    qtbot.addWidget(widget)
    widget.resize(1200, 700)
    widget.pace = RedrawPace(budget=1.0)
    widget.show()
    qtbot.waitExposed(widget)
    widget.set_cost_model(CHEAP)
    feed(widget, "vanilla", make_run(PLAIN_STEPS))
    feed(widget, "speculative", make_run(SPEC_STEPS))
    widget.redraw()
    return widget


def test_at_b_1_the_batch_formula_is_the_articles():
    for a in (0.0, 0.3, 0.8, 1.0):
        assert batch_speedup(CHEAP, a, 4, 1) == pytest.approx(CHEAP.speedup(a, 4))
    assert break_even_acceptance_at(CHEAP, 4, 1) == pytest.approx(break_even_acceptance(CHEAP, 4))


def test_the_speedup_falls_as_the_batch_fills_the_forward():
    speedups = [batch_speedup(CHEAP, 0.8, 4, b) for b in (1, 2, 4, 8, 16)]
    assert speedups == sorted(speedups, reverse=True) and speedups[0] > 2 and speedups[-1] < 1
    assert break_even_batch(CHEAP, 0.8, 4) == 8
    # Verification that costs every row from the start never pays, at any B.
    assert break_even_batch(LINEAR, 0.8, 4) == 1


def test_raising_b_moves_the_panels_predicted_speedup_down(charts):
    theory = charts.theory
    assert theory.batch_box.isVisible() and theory.batch_box.isEnabled() and theory.batch_box.value() == 1
    a, alone = drawn(theory.speedup)
    alone = alone.copy()
    break_even_alone = theory.break_even.value()

    theory.batch_box.setValue(8)  # as a user would
    _, at_8 = drawn(theory.speedup)
    assert np.all(at_8[a > 0.05] < alone[a > 0.05])  # lower at every acceptance that drafts anything
    assert theory.break_even.isVisible() and theory.break_even.value() > break_even_alone + 0.3
    legend = [label.text for _, label in theory.legend.items]
    assert "break-even B = 8 at a = 0.80" in legend  # the run's acceptance, the panel's k
    assert "this run's speedup" not in legend  # measured alone: not a point of B = 8's curve

    theory.batch_box.setValue(32)
    _, at_32 = drawn(theory.speedup)
    assert at_32.max() < 1.0
    assert not theory.break_even.isVisible() and "no break-even at B = 32" in theory.note

    theory.batch_box.setValue(1)  # back to the article's formula, exactly as before
    np.testing.assert_allclose(drawn(theory.speedup)[1], alone)
    assert theory.break_even.value() == pytest.approx(break_even_alone)
    assert not any("break-even B" in label.text for _, label in theory.legend.items)


def test_the_b_box_keeps_clear_of_the_title_and_waits_for_a_cost_model(qtbot):
    widget = LiveCharts()
    qtbot.addWidget(widget)
    widget.resize(1200, 700)
    widget.show()
    qtbot.waitExposed(widget)
    widget.redraw()
    theory = widget.theory
    assert theory.batch_box.isVisible() and not theory.batch_box.isEnabled()  # no T(rows) to read yet
    title = theory.mapFromScene(theory.plot.titleLabel.item.sceneBoundingRect()).boundingRect()
    assert not theory.batch_box.geometry().intersects(title)
    assert theory.rect().contains(theory.batch_box.geometry())
    widget.set_cost_model(CHEAP)
    widget.redraw()
    assert theory.batch_box.isEnabled()
