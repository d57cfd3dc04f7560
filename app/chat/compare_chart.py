"""The side by side's time chart: each run's prefill and decoding, one labelled bar per run.

The bar of a run is its prefill (reading the prompt, grey) followed by its decoding (in the
run's colour). The line above each bar names the run and gives the same numbers as the
verdict below the chart (`run_times`, one text for both), so the chart and the verdict can
never disagree; its prefill and decoding are written in their bars' colours, as a legend. The speedup compares the coloured parts only (figures.DECODE_SPEEDUP).

The y axis counts rows: run i has its bar in row 2i and its label in row 2i + 1, and the
chart is tall enough for a label's line to fit in its row (`ROW_PX`).
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QPalette

from app.charts.panel import RUN_COLOURS
from engine import RunStats
from engine.figures import DECODE_SPEEDUP, TIME_TO_FIRST_TOKEN

RUN_ORDER = ("speculative", "vanilla")  # bottom to top: vanilla, which ran first, on top
PREFILL_COLOUR = "#999999"
ROW_PX = 22  # pixels per row: one line of the labels' 8 pt text and some air
BAR_HEIGHT = 0.7  # rows


def run_times(stats: RunStats) -> str:
    """'time to first token 0.12 s (prefill 0.11 s) · decoding 2.72 s': a run's times, as the
    verdict, the panes and this chart all say them."""
    first = f"{stats.time_to_first_token_s:.2f} s" if stats.time_to_first_token_s > 0 else "…"
    return f"{TIME_TO_FIRST_TOKEN.name} {first} (prefill {stats.prefill_s:.2f} s) · decoding {stats.wall_s:.2f} s"


class CompareChart(pg.PlotWidget):
    """Prefill and decoding time of both runs of a comparison, as stacked horizontal bars."""

    def __init__(self, parent=None) -> None:
        palette = parent.palette() if parent is not None else QPalette()
        self.fg = palette.color(QPalette.ColorRole.Text)
        super().__init__(parent=parent, background=palette.color(QPalette.ColorRole.Base))
        self.plot = self.getPlotItem()
        self.plot.hideButtons()
        self.plot.setMenuEnabled(False)
        self.plot.hideAxis("left")  # the labels name the runs
        self.plot.setLabel("bottom", "seconds")
        self.plot.getAxis("bottom").enableAutoSIPrefix(False)  # "seconds (x0.001)" under 0..500 reads as a bug
        self.plot.getViewBox().setMouseEnabled(x=False, y=False)
        self.plot.enableAutoRange(enable=False)
        self.plot.setYRange(-0.5, 2 * len(RUN_ORDER) - 0.5, padding=0)
        self.plot.setXRange(0, 1, padding=0)
        rows = np.arange(len(RUN_ORDER)) * 2.0
        self.prefill = pg.BarGraphItem(
            x0=np.zeros(len(rows)),
            y=rows,
            width=np.zeros(len(rows)),
            height=BAR_HEIGHT,
            brush=PREFILL_COLOUR,
            pen=pg.mkPen(None),
        )
        self.decoding = pg.BarGraphItem(
            x0=np.zeros(len(rows)),
            y=rows,
            width=np.zeros(len(rows)),
            height=BAR_HEIGHT,
            brushes=[RUN_COLOURS[label] for label in RUN_ORDER],
            pen=pg.mkPen(None),
        )
        self.plot.addItem(self.prefill)
        self.plot.addItem(self.decoding)
        self.labels = {}
        for i, label in enumerate(RUN_ORDER):
            text = pg.TextItem("", anchor=(0, 0.5))
            text.setPos(0, 2 * i + 1)
            self.plot.addItem(text)
            self.labels[label] = text
        # rows of ROW_PX pixels, plus the bottom axis and its title
        self.setFixedHeight(2 * len(RUN_ORDER) * ROW_PX + 52)
        self.setToolTip(
            f"<b>{TIME_TO_FIRST_TOKEN.name.capitalize()}</b>: {TIME_TO_FIRST_TOKEN.tip}<br>"
            f"<b>Decoding</b>: the grey part of a bar is the prefill; the coloured part is "
            f"decoding, which the {DECODE_SPEEDUP.name} compares. {DECODE_SPEEDUP.tip}"
        )
        self.clear_runs()

    def show_runs(self, runs: dict[str, RunStats]) -> None:
        """Both runs' bars and labels (a run missing from `runs` shows nothing)."""
        prefill = np.array([runs[label].prefill_s if label in runs else 0.0 for label in RUN_ORDER])
        decoding = np.array([runs[label].wall_s if label in runs else 0.0 for label in RUN_ORDER])
        self.prefill.setOpts(width=prefill)
        self.decoding.setOpts(x0=prefill, width=decoding)
        for label, text in self.labels.items():
            stats = runs.get(label)
            text.setVisible(stats is not None)
            if stats is not None:
                text.setHtml(self._label_html(label, stats))
        longest = float((prefill + decoding).max()) if len(runs) else 0.0
        self.plot.setXRange(0, longest if longest > 0 else 1.0, padding=0.02)

    def _label_html(self, label: str, stats: RunStats) -> str:
        """The run's name and `run_times`, its prefill and decoding written in their bars' colours
        (the line doubles as the legend)."""
        times = html.escape(run_times(stats))
        for part, colour in (
            (f"prefill {stats.prefill_s:.2f} s", PREFILL_COLOUR),
            (f"decoding {stats.wall_s:.2f} s", RUN_COLOURS[label]),
        ):
            times = times.replace(part, f"<span style='color:{colour}; font-weight:600'>{part}</span>")
        return (
            f"<span style='font-size:8pt; color:{self.fg.name()}'>"
            f"<b style='color:{RUN_COLOURS[label]}'>{label}</b>: {times}</span>"
        )

    def clear_runs(self) -> None:
        self.show_runs({})
