"""The charts' redraw budget: the window's drawing may not take the engine's cores."""

from __future__ import annotations

from app.charts.live import FIRST_REDRAW_MS, REDRAW_MS, SLOWEST_REDRAW_MS, RedrawPace


class Clocks:
    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 5.0

    def frame(self, interval_ms: int, cpu_share: float) -> None:
        """One interval passes, in which the GUI thread used `cpu_share` of a core."""
        self.wall += interval_ms / 1000
        self.cpu += cpu_share * interval_ms / 1000


def pace_and_clocks(budget: float = 0.08) -> tuple[RedrawPace, Clocks]:
    clocks = Clocks()
    return RedrawPace(budget, clock=lambda: clocks.wall, cpu=lambda: clocks.cpu), clocks


def test_costly_drawing_is_spaced_out_until_the_window_keeps_to_its_budget():
    pace, clocks = pace_and_clocks(budget=0.08)
    interval = pace.redrawn()
    assert interval == FIRST_REDRAW_MS
    cost_per_redraw_s = 0.016  # six panels painted on a small CPU
    for _ in range(20):
        # The GUI thread's share: the redraws' cost at this interval, plus 2% for the tokens.
        share = cost_per_redraw_s / (interval / 1000) + 0.02
        clocks.frame(interval, share)
        interval = pace.redrawn()
    final_share = cost_per_redraw_s / (interval / 1000) + 0.02
    assert interval > 4 * REDRAW_MS
    assert final_share < 0.1


def test_cheap_drawing_stays_smooth():
    pace, clocks = pace_and_clocks()
    interval = pace.redrawn()
    for _ in range(10):
        clocks.frame(interval, 0.03)
        interval = pace.redrawn()
    assert interval == REDRAW_MS


def test_however_costly_the_charts_still_move_every_two_seconds():
    pace, clocks = pace_and_clocks()
    interval = pace.redrawn()
    for _ in range(30):
        clocks.frame(interval, 1.0)  # drawing takes the whole core
        interval = pace.redrawn()
    assert interval == SLOWEST_REDRAW_MS


def test_a_new_reply_after_a_pause_starts_at_the_first_pace_again():
    pace, clocks = pace_and_clocks()
    interval = pace.redrawn()
    for _ in range(30):
        clocks.frame(interval, 1.0)
        interval = pace.redrawn()
    clocks.frame(10_000, 0.0)  # the user reads the reply
    assert pace.redrawn() == FIRST_REDRAW_MS
