"""The charts as a newcomer sees them in the window on a 1440x900 and a 1280x720 screen: no text is cut off
by its panel, no two texts sit on each other, no legend covers a bar, and the headline fits its label.

Texts are read where pyqtgraph draws them (scene rectangles of the title, the axis titles, the legends'
words, the reference lines' labels and the TextItems in the plots), after the window laid the dock out.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QRectF, Qt

from engine.core.draft_length import CostModel
from tests.app.charts.test_charts import CHEAP, COSTLY, LINEAR, PLAIN_STEPS, SPEC_STEPS, feed, make_run
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG

SCREENS = [(1440, 900), (1280, 720)]
# Break-even a 0.79, next to the run's whole-run a of 0.80: the acceptance chart's two line labels meet.
NEAR = CostModel(verify_s={1: 0.01, 2: 0.0144, 4: 0.018, 8: 0.0288, 16: 0.054, 33: 0.108}, draft_s_per_token=0.003)


def scene_rect(item) -> QRectF:
    """Where a text item's words are: its bounding rectangle less the document's margin (blank)."""
    margin = item.document().documentMargin() if hasattr(item, "document") else 0.0
    return item.mapRectToScene(item.boundingRect().adjusted(margin, margin, -margin, -margin))


def texts(panel) -> dict[str, QRectF]:
    """Every text the panel draws and where (scene coordinates), by a name that says which it is."""
    found = {}
    title = panel.plot.titleLabel
    if title.isVisible() and title.text:
        found["title"] = scene_rect(title.item)
    for side in ("left", "bottom"):
        axis = panel.plot.getAxis(side)
        if axis.isVisible() and axis.label.isVisible() and axis.label.toPlainText().strip():
            found[f"{side} axis title"] = scene_rect(axis.label)
    if panel.legend.isVisible():
        for _, label in panel.legend.items:
            if label.isVisible() and label.text:
                found[f"legend {label.text!r}"] = scene_rect(label.item)
    for i, item in enumerate(panel.plot.getViewBox().addedItems):
        if isinstance(item, pg.InfiniteLine) and item.isVisible() and getattr(item, "label", None) is not None:
            if item.label.isVisible() and item.label.toPlainText():
                found[f"line label {item.label.toPlainText()!r}"] = scene_rect(item.label.textItem)
        elif isinstance(item, pg.TextItem) and item.isVisible() and item.toPlainText():
            found[f"text {i} {item.toPlainText()!r}"] = scene_rect(item.textItem)
    return found


def bar_rects(panel) -> list[QRectF]:
    """The bars of a panel's vertical bar charts, where they are drawn."""
    box, rects = panel.plot.getViewBox(), []
    for item in box.addedItems:
        if isinstance(item, pg.BarGraphItem) and item.isVisible() and item.opts.get("x") is not None:
            x, height = np.asarray(item.opts["x"], dtype=float), np.asarray(item.opts["height"], dtype=float)
            width = np.broadcast_to(np.asarray(item.opts["width"], dtype=float), x.shape)
            for x0, h, w in zip(x, height, width):
                if h > 0:
                    rects.append(box.mapViewToScene(QRectF(x0 - w / 2, 0, w, h)).boundingRect())
    return rects


def problems(panel) -> list[str]:
    shown = panel.mapToScene(panel.viewport().rect()).boundingRect()
    found = texts(panel)
    out = [f"{name} is cut off" for name, rect in found.items() if not shown.contains(rect.adjusted(1, 1, -1, -1))]
    for (a, ra), (b, rb) in itertools.combinations(found.items(), 2):
        if ra.adjusted(1, 1, -1, -1).intersects(rb.adjusted(1, 1, -1, -1)):
            out.append(f"{a} overlaps {b}")
    words = [(name, rect) for name, rect in found.items() if name.startswith("legend")]
    for bar in bar_rects(panel):
        out.extend(f"{name} covers a bar" for name, rect in words if rect.adjusted(1, 1, -1, -1).intersects(bar))
    return out


@pytest.fixture(
    params=[(screen, dock) for screen in SCREENS for dock in (0.34, 0.4)],
    ids=lambda p: f"{p[0][0]}x{p[0][1]}-dock{p[1]:.0%}",
)
def charts_on_screen(request, qtbot, make_window):
    """The window's charts on a screen, the dock at its default share of the width (0.4) and narrower
    (as the tour's window shows it once the chat asks for its room)."""
    (width, height), share = request.param
    window = make_window(load=False)
    window.resize(int(width * 0.9) if width < 1440 else 1440, int(height * 0.9))
    window.resizeDocks([window.charts_dock], [int(window.width() * share)], Qt.Orientation.Horizontal)
    qtbot.wait(20)
    return window.charts


@pytest.mark.parametrize(
    "costs",
    [CHEAP, COSTLY, NEAR, LINEAR, None],
    ids=["cheap", "costly", "break-even-at-the-run", "no-break-even", "no-cost-model"],
)
def test_no_chart_text_is_cut_off_or_written_over_another(qtbot, charts_on_screen, costs):
    charts = charts_on_screen
    charts.set_cost_model(costs)
    feed(charts, "vanilla", make_run(PLAIN_STEPS))
    feed(charts, "speculative", make_run(SPEC_STEPS))
    qtbot.wait(50)
    charts.redraw()
    qtbot.wait(50)
    charts.redraw()  # a second time: the legends and labels settle on the first layout's sizes
    found = {panel.plot.titleLabel.text: problems(panel) for panel in charts.visible_panels()}
    found = {title: p for title, p in found.items() if p}
    assert not found, "\n".join(f"{title}: {p}" for title, p in found.items())
    summary = charts.summary
    assert summary.heightForWidth(summary.width()) <= summary.height(), "the headline is cut off"
