"""The side by side's time chart in the real window: every bar labelled, no label on another or
cut off by the plot, at the tour's 1440x900 and at 1280x720 (issue 36, item 7)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QRectF

from engine.api import Comparison
from tests.app.chat.test_compare_view import result, token
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG


def scene_rect(item) -> QRectF:
    return item.mapRectToScene(item.boundingRect())


def bar_rects(bars) -> list[QRectF]:
    """Each bar of a BarGraphItem in scene coordinates (its boundingRect spans them all)."""
    o = bars.opts
    height = o["height"]
    return [
        bars.mapRectToScene(QRectF(x0, y - height / 2, width, height))
        for x0, y, width in zip(o["x0"], o["y"], o["width"])
        if width > 0
    ]


@pytest.mark.parametrize("size", [(1440, 900), (1280, 720)])
@pytest.mark.parametrize("speeds", [(20, 10), (10, 20)])  # the speculative run shorter, then longer
def test_every_bar_is_labelled_inside_the_plot_and_nothing_overlaps(qtbot, make_window, size, speeds):
    window = make_window(load=False)
    window.resize(*size)
    window.tabs.setCurrentWidget(window.compare_view)
    infos = [token(i, f" w{i}") for i in range(64)]
    spec_speed, vanilla_speed = speeds
    comparison = Comparison(
        result(*infos, tokens_per_s=vanilla_speed, prefill_s=0.87),
        result(*infos, tokens_per_s=spec_speed, prefill_s=0.91),
        None,
    )
    window.compare_view.show_comparison(comparison, greedy=True)
    chart = window.compare_view.chart
    qtbot.waitUntil(lambda: chart.isVisible() and chart.plot.getViewBox().width() > 100)
    qtbot.wait(50)  # the layout's queued passes

    assert window.width() == size[0]  # the side by side asks for no more width than the window has
    view = chart.plot.getViewBox()
    plot_area = view.mapRectToScene(view.boundingRect())
    texts = [chart.labels[label] for label in ("vanilla", "speculative")]
    bars = bar_rects(chart.prefill) + bar_rects(chart.decoding)
    assert len(bars) == 4
    assert all(text.isVisible() and text.toPlainText() for text in texts)  # every bar labelled
    rects = [scene_rect(text) for text in texts]
    for rect in rects:
        assert plot_area.contains(rect), (rect, plot_area)
        assert not any(rect.intersects(bar) for bar in bars)
    assert not rects[0].intersects(rects[1])
    window.grab().save(f"/tmp/sbs/window-{size[0]}-{spec_speed}.png")


def test_a_short_run_is_drawn_in_seconds_not_thousandths(qtbot):
    from app.chat.compare_view import CompareView

    view = CompareView()
    qtbot.addWidget(view)
    view.resize(700, 700)
    view.show()
    infos = [token(i, f" w{i}") for i in range(8)]
    view.show_comparison(
        Comparison(
            result(*infos, tokens_per_s=60, prefill_s=0.43), result(*infos, tokens_per_s=50, prefill_s=0.35), None
        )
    )
    qtbot.wait(50)

    axis = view.chart.plot.getAxis("bottom")
    assert "seconds" in axis.labelString() and "x0.001" not in axis.labelString()
    assert max(value for _, values in axis.tickValues(0, 0.6, 400) for value in values) <= 0.6
