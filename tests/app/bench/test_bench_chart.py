"""The benchmark's chart at the sizes the dialog takes on a 1440x900 and a 1280x720 screen: no two pieces of
text overlap (prompt names, speedups, kinds' names, the legend, the title), and none leaves its place."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QRectF
from PySide6.QtGui import QImage, QPainter
from PySide6.QtWidgets import QApplication

from app.bench.dialog import BenchDialog
from tests.app.bench.sample_report import sample_report
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG

# The dialog's size on each screen: 1100 wide, its height the screen's less 40 (BenchDialog.__init__).
SCREENS = {"1440x900": (1100, 820), "1280x720": (1100, 680)}


def tick_names(chart) -> list[tuple[str, QRectF]]:
    """The prompts' names under the bars, in scene coordinates, as drawn."""
    axis = chart.plot.getAxis("bottom")
    if hasattr(axis, "drawn"):
        return list(axis.drawn)
    image = QImage(10, 10, QImage.Format.Format_ARGB32)  # pyqtgraph's own tick labels (before upright names)
    painter = QPainter(image)
    _, _, texts = axis.generateDrawSpecs(painter)
    painter.end()
    return [(text, axis.mapRectToScene(rect)) for rect, _, text in texts]


def texts(chart) -> dict[str, list[tuple[str, QRectF]]]:
    labels = getattr(chart, "speedups", None) or [i for i in chart.labels if "×" in i.textItem.toPlainText()]
    kinds = getattr(chart, "kinds", None) or [i for i in chart.labels if "×" not in i.textItem.toPlainText()]
    return {
        "names": tick_names(chart),
        "speedups": [(i.textItem.toPlainText(), i.sceneBoundingRect()) for i in labels],
        "kinds": [(i.textItem.toPlainText(), i.sceneBoundingRect()) for i in kinds],
        "legend": [(label.text, label.item.sceneBoundingRect()) for _, label in chart.legend.items],
        "title": [("title", chart.plot.titleLabel.item.sceneBoundingRect())],
    }


@pytest.mark.parametrize("screen", SCREENS)
def test_no_text_of_the_chart_overlaps_or_leaves_its_place(qtbot, screen):
    dialog = BenchDialog()
    qtbot.addWidget(dialog)
    dialog.resize(*SCREENS[screen])
    dialog.show()
    qtbot.waitExposed(dialog)
    report = sample_report()
    dialog.show_report(report)
    chart = dialog.chart
    chart.grab()  # lays it out and paints it: the names are placed as they are drawn
    QApplication.processEvents()  # the layout's own pass, posted by the first
    chart.grab()

    found = texts(chart)
    assert len(found["names"]) >= len(report.prompts) // 2 and len(found["kinds"]) == 3
    everything = [(group, text, rect) for group, items in found.items() for text, rect in items]
    for i, (group_a, a, rect_a) in enumerate(everything):
        for group_b, b, rect_b in everything[i + 1 :]:
            assert not rect_a.intersects(rect_b), f"{group_a} {a!r} overlaps {group_b} {b!r} on a {screen} screen"
    widget = QRectF(chart.rect())
    plot = chart.plot.getViewBox().sceneBoundingRect()
    for group, text, rect in everything:
        assert widget.contains(rect), f"{group} {text!r} is cut off by the chart's edge on a {screen} screen"
    for _, text, rect in [e for e in everything if e[0] in ("speedups", "kinds")]:
        assert plot.contains(rect), f"{text!r} leaves the plot on a {screen} screen"
    axis = chart.plot.getAxis("bottom").sceneBoundingRect()
    for text, rect in found["names"]:
        assert axis.contains(rect), f"the name {text!r} leaves its axis on a {screen} screen"
