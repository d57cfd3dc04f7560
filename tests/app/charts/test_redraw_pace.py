"""The charts' redraw budget: the window's drawing may not take the engine's cores."""

from __future__ import annotations

import time

import pyqtgraph as pg
import pytest

from app.charts.live import (
    FIRST_REDRAW_MS,
    REDRAW_BUDGET,
    REDRAW_MS,
    SHARED_CORES_BUDGET,
    SLOWEST_REDRAW_MS,
    LiveCharts,
    RedrawPace,
)
from tests.app.charts.test_charts import make_run
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG


def settle(pace: RedrawPace, cost_s: float, redraws: int = 12) -> int:
    interval = pace.interval_ms
    for _ in range(redraws):
        interval = pace.redrawn(cost_s)
    return interval


def test_before_any_redraw_is_measured_the_first_comes_soon():
    assert RedrawPace().interval_ms == FIRST_REDRAW_MS


def test_costly_redraws_are_spaced_out_until_they_keep_to_the_budget():
    pace = RedrawPace(budget=0.015, slowest_ms=10_000)
    cost_s = 0.030  # a redraw on a 2-core machine whose cores both decode
    interval = settle(pace, cost_s)
    assert cost_s / (interval / 1000) == pytest.approx(0.015, rel=0.05)


def test_cheap_redraws_stay_smooth():
    pace = RedrawPace(budget=0.015)
    assert settle(pace, 0.0004) == REDRAW_MS  # a fast machine, a GPU decoding: 25 Hz


def test_however_costly_the_charts_still_move_more_than_twice_a_second():
    pace = RedrawPace(budget=0.015)
    assert settle(pace, 2.0) == SLOWEST_REDRAW_MS < 500


def test_while_the_engine_decodes_on_the_windows_cores_fast_redraws_keep_to_a_third_of_that(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.set_sharing_cores(True)
    cost_s = 0.001  # a redraw and its painting on a fast machine
    assert settle(charts.pace, cost_s) == pytest.approx(1000 * cost_s / SHARED_CORES_BUDGET, rel=0.02)  # 200 ms
    assert SHARED_CORES_BUDGET == pytest.approx(REDRAW_BUDGET / 3)
    charts.set_sharing_cores(False)  # a GPU, or a server elsewhere
    assert settle(charts.pace, cost_s) == pytest.approx(1000 * cost_s / REDRAW_BUDGET, rel=0.05)  # 67 ms


def test_on_shared_cores_costly_redraws_still_come_more_than_twice_a_second(qtbot):
    """On 2 cores that both decode a redraw costs ~28 ms: at 0.5% of a core that was one every
    5.6 s, and a 4 s reply was drawn only when it ended."""
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.set_sharing_cores(True)
    assert settle(charts.pace, 0.028) == SLOWEST_REDRAW_MS < 500


def test_a_new_budget_scales_the_measured_pace_at_once():
    pace = RedrawPace(budget=0.015, slowest_ms=10_000)
    settled = settle(pace, 0.028)
    pace.set_budget(0.005, 6000)
    assert pace.interval_ms == pytest.approx(3 * settled, abs=1)  # the next reply's first redraw is already spaced
    pace.set_budget(0.015, 3000)
    assert pace.interval_ms == pytest.approx(settled, abs=2)


def test_one_slow_frame_moves_the_pace_halfway():
    pace = RedrawPace(budget=0.015, slowest_ms=10_000)
    steady = settle(pace, 0.006)  # 400 ms
    slow = pace.redrawn(0.030)  # a resize: 2000 ms wanted
    assert steady < slow < 2000
    assert slow == pytest.approx((steady + 2000) / 2, abs=1)


def test_the_pace_carries_over_to_the_next_reply():
    """A short reply would be over before it found its pace: it starts at the last one's."""
    pace = RedrawPace(budget=0.015)
    settled = settle(pace, 0.004)
    # The user reads the reply for a minute; nothing is redrawn meanwhile.
    assert pace.interval_ms == settled != FIRST_REDRAW_MS


def test_the_charts_count_their_painting_in_what_a_redraw_costs(qtbot, monkeypatch):
    """A window whose panels are slow to paint redraws them less often."""
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.resize(900, 700)
    charts.show()
    qtbot.waitUntil(lambda: charts.throughput.painted_s > 0)  # shown and painted once
    paint = pg.GraphicsView.paintEvent

    def slow_paint(view, event) -> None:  # under Panel.paintEvent, which times it
        paint(view, event)
        started = time.thread_time()
        while time.thread_time() - started < 0.010:  # 10 ms of CPU per panel painted
            pass

    charts.pace = RedrawPace(slowest_ms=10_000)  # no cap: the budget alone decides
    monkeypatch.setattr(pg.GraphicsView, "paintEvent", slow_paint)
    for event in make_run([(4, 4, 2)] * 30):
        charts.add_step("speculative", event)
    for _ in range(10):
        charts.redraw()
        charts.throughput.viewport().repaint()  # what the event loop does after each redraw
    # 10 ms of painting a redraw, over a 1.5% budget: two thirds of a second at least.
    assert charts.pace.interval_ms >= 0.010 / REDRAW_BUDGET * 1000 * 0.9


def test_a_run_that_ends_is_drawn_at_once_whatever_the_pace(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.pace = RedrawPace(budget=1e-9, slowest_ms=10_000)  # every redraw "too costly": a slow pace
    charts.redraw()
    events = make_run([(4, 4, 2)] * 12)
    for event in events[:-1]:
        charts.add_step("speculative", event)
    with qtbot.assertNotEmitted(charts.sig_redrawn, wait=300):
        pass  # mid-run: the next redraw is seconds away
    with qtbot.waitSignal(charts.sig_redrawn, timeout=300):
        charts.add_step("speculative", events[-1])  # finish_reason "length"
    assert charts.series()["acceptance"]["speculative"][0][-1] == len(events) - 1


def test_steps_that_arrive_between_redraws_do_not_put_the_next_one_off(qtbot):
    """Steps come every 0.25 s; a redraw due 0.1 s after a batch comes 0.1 s after it, not a whole
    interval after: counted from each batch, 0.45 s redraws came every 0.5-0.7 s."""
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.pace = RedrawPace(budget=1e-9, slowest_ms=600)  # every redraw "too costly": 0.6 s apart
    events = make_run([(4, 4, 2)] * 40)
    charts.add_step("speculative", events[0])
    charts.redraw()
    redrawn = []
    charts.sig_redrawn.connect(lambda: redrawn.append(time.monotonic()))
    started = time.monotonic()
    for event in events[1:6]:  # a batch every 0.25 s
        qtbot.wait(250)
        charts.add_step("speculative", event)
    qtbot.wait(100)
    assert redrawn and redrawn[0] - started == pytest.approx(0.6, abs=0.15)
    assert len(redrawn) >= 2  # 0.6 and 1.2 s, where counting from the batches gave one at 1.35 s


def test_the_summary_says_a_run_is_starting_until_its_first_step(qtbot):
    from app.charts.live import summary_html

    charts = LiveCharts()
    qtbot.addWidget(charts)
    assert "No run yet" in charts.summary.text()
    charts.begin_run()
    assert "No run yet" not in charts.summary.text() and "first step" in charts.summary.text()
    charts.end_run()  # stopped or failed before any step
    assert "No run yet" in charts.summary.text()
    assert "No run yet" not in summary_html({"stats": {}}, "#000", running=True)
