"""The Load view's two charts: speedup against batch size B, and aggregate throughput against B.

B is drawn on a log-2 axis (1, 2, 4, 8, 16 equally spaced): the points sit at x = log2(B) and the
ticks name B itself. The speedup chart has the measured points of every speculative mode (automatic
k solid blue, each fixed k sky blue), the predicted curve in the theory panel's green, the 1× line
and the break-even B (vermillion, as the theory panel's break-even); the throughput chart has plain
decoding in orange and the speculative modes in blue, as every other chart. Both legends sit above
their plots, in the hidden top axis's row (as the benchmark's bar chart): inside, they covered points.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.charts.panel import BREAK_EVEN, RUN_COLOURS, SPEEDUP, Panel, set_label_anchor, stepped
from engine import VANILLA

AUTO = "auto"  # LoadPoint.mode of automatic k (engine/bench/load_results.py); a fixed k is "k=N"
FIXED_K = "#56B4E9"  # sky blue: a fixed k beside automatic k's blue
FIXED_SYMBOLS = ("t", "s", "d", "star")


def mode_name(mode: str) -> str:
    """A mode as the legend says it: "speculative, automatic k", "speculative, k = 4", "plain decoding"."""
    if mode == VANILLA:
        return "plain decoding"
    if mode == AUTO:
        return "speculative, automatic k"
    return "speculative, " + mode.replace("=", " = ")


def mode_style(mode: str, index: int) -> dict:
    """Pen, symbol and brush of a mode's points and line; `index` counts the fixed k's drawn so far."""
    if mode == VANILLA:
        colour, symbol, style = RUN_COLOURS["vanilla"], "o", Qt.PenStyle.SolidLine
    elif mode == AUTO:
        colour, symbol, style = RUN_COLOURS["speculative"], "o", Qt.PenStyle.SolidLine
    else:
        colour, symbol, style = FIXED_K, FIXED_SYMBOLS[index % len(FIXED_SYMBOLS)], Qt.PenStyle.DashLine
    return {
        "pen": pg.mkPen(colour, width=2, style=style),
        "symbol": symbol,
        "symbolBrush": pg.mkBrush(colour),
        "symbolPen": pg.mkPen(colour),
        "symbolSize": 8,
    }


def speculative_modes(sweep) -> list[str]:
    """The sweep's speculative modes, automatic k first (as in every legend), then each fixed k."""
    return sorted((m for m in sweep.modes if m != VANILLA), key=lambda m: m != AUTO)


def break_even_mode(sweep) -> str:
    """The mode the sweep's break-evens are for: its fixed k when it swept one, else automatic k."""
    mode = getattr(sweep, "break_even_mode", "")
    return mode or next((m for m in sweep.modes if m not in (VANILLA, AUTO)), AUTO)


def break_evens(sweep, context: int) -> tuple[int | None, int | None]:
    """(measured, predicted) break-even B at `context`: the sweep's per-context pair where it has
    them, else its overall pair for its first context."""
    for c, measured, predicted in getattr(sweep, "break_evens", ()):
        if c == context:
            return measured, predicted
    if sweep.contexts and context == sweep.contexts[0]:
        return sweep.break_even_measured, sweep.break_even_predicted
    return None, None


def predicted_curves(sweep, context: int) -> dict[str, list[tuple[int, float]]]:
    """Mode -> the formula's (B, speedup) at `context`: every mode the sweep predicted there, else
    its overall prediction (automatic k's, first context) for the first context."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for c, b, mode, s in getattr(sweep, "predicted_by_context", ()):
        if c == context:
            curves.setdefault(mode, []).append((b, s))
    if not curves and sweep.predicted and sweep.contexts and context == sweep.contexts[0]:
        curves[AUTO] = list(sweep.predicted)
    return {mode: sorted(points) for mode, points in curves.items()}


class BatchChart(Panel):
    """A chart against B on a log-2 axis, its legend above the plot."""

    def __init__(self, title: str, y_label: str | tuple[str, ...], parent=None, tip: str = "") -> None:
        super().__init__(title, "batch size B (requests decoded together)", y_label, parent, tip=tip)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.showGrid(x=True, y=True, alpha=0.15)
        self.scene().removeItem(self.legend)
        self.legend = pg.LegendItem(offset=None, labelTextColor=self.fg, labelTextSize="8pt", verSpacing=-6)
        self.legend.setColumnCount(2)
        self.plot.legend = self.legend
        self.plot.layout.removeItem(self.plot.getAxis("top"))  # hidden, never shown: its cell takes the legend
        self.plot.layout.addItem(self.legend, 1, 1, alignment=Qt.AlignmentFlag.AlignCenter)
        self.items: list = []  # what show() added, removed by the next
        self.setMinimumSize(360, 300)

    def clear_data(self) -> None:
        for item in self.items:
            self.plot.removeItem(item)
        self.items = []
        self.legend.clear()

    def add(self, item, name: str | None = None):
        self.plot.addItem(item)
        self.items.append(item)
        if name:
            self.legend.addItem(item, name)
        return item

    def set_batches(self, batches: tuple[int, ...]) -> None:
        """Ticks at each B measured, and a little room either side."""
        xs = [math.log2(b) for b in batches] or [0.0]
        self.plot.getAxis("bottom").setTicks([[(math.log2(b), str(b)) for b in batches]])
        self.plot.setXRange(min(xs) - 0.5, max(xs) + 0.5, padding=0)  # either side, room for a value's label

    def show_series(self, series: dict) -> None:  # Panel's; the Load view calls show() instead
        raise NotImplementedError


class SpeedupChart(BatchChart):
    """Measured speedup per speculative mode, the predicted curve, 1× and the break-even B."""

    def __init__(self, parent=None) -> None:
        super().__init__(
            ("Speedup against batch size", "Speedup against B"),
            ("speedup over plain decoding ×", "speedup ×"),
            parent,
            tip="Aggregate tokens per second of speculative decoding over plain decoding's at the same "
            "batch size. Above 1× speculation pays; the break-even B is the first batch size where it "
            "no longer does.",
        )
        self.plain = pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen(self.muted(170), width=1.5, style=Qt.DotLine))
        self.plot.addItem(self.plain)
        self.plain_sample = pg.PlotDataItem(pen=self.plain.pen)
        self.break_even = pg.InfiniteLine(
            angle=90,
            pen=pg.mkPen(BREAK_EVEN, width=1.5, style=Qt.DashLine),
            label="",
            labelOpts={"position": 0.92, "color": BREAK_EVEN, "anchors": [(1, 0), (1, 0)]},
        )
        self.break_even.setVisible(False)
        self.plot.addItem(self.break_even)
        self.curves: dict[str, pg.PlotDataItem] = {}  # mode -> its measured points
        self.predicted: pg.PlotDataItem | None = None
        self.values: list[pg.TextItem] = []  # the automatic-k speedups written beside their points

    def clear_data(self) -> None:
        super().clear_data()
        self.curves, self.predicted, self.values = {}, None, []
        self.break_even.setVisible(False)

    def show(self, sweep, context: int) -> None:
        self.clear_data()
        batches = sweep.batches
        tops = [1.0]
        fixed = 0
        for mode in speculative_modes(sweep):
            measured = [(b, sweep.speedup(b, mode, context)) for b in batches]
            measured = [(b, s) for b, s in measured if s is not None]
            if not measured:
                continue
            style = mode_style(mode, fixed)
            fixed += mode != AUTO
            xs, ys = np.log2([b for b, _ in measured]), np.array([s for _, s in measured])
            self.curves[mode] = self.add(pg.PlotDataItem(xs, ys, antialias=True, **style), mode_name(mode))
            tops.append(float(ys.max()))
        predictions = predicted_curves(sweep, context)
        for mode, points in predictions.items():
            xs, ys = np.log2([b for b, _ in points]), np.array([s for _, s in points])
            style = Qt.PenStyle.DashLine if mode == AUTO else Qt.PenStyle.DotLine
            name = "predicted (formula)" if len(predictions) == 1 else "predicted, " + mode_name(mode).split(", ")[1]
            curve = self.add(pg.PlotDataItem(xs, ys, pen=pg.mkPen(SPEEDUP, width=2, style=style), antialias=True), name)
            self.predicted = self.predicted or curve
            tops.append(float(ys.max()))
        self.legend.addItem(self.plain_sample, "1× (plain decoding)")
        top = stepped(max(tops) * 1.18)
        self.plot.setYRange(0.0, top, padding=0)
        self.set_batches(batches)
        mode = break_even_mode(sweep)
        if mode in self.curves or self.curves:
            self._write_values(mode if mode in self.curves else next(iter(self.curves)), top)
        several = sum(m != VANILLA for m in sweep.modes) > 1
        self._show_break_even(*break_evens(sweep, context), mode_name(mode).split(", ")[1] if several else "")

    def _write_values(self, mode: str, top: float) -> None:
        """`mode`'s speedups beside its points, on the side of each point with more room to the
        nearest other line (the 1× line counts); where neither side has a label's room and the
        lines at that B are bunched, just over them (further away, a label was read as another
        line's). The lines mostly fall to the right, so a label above goes right of its point and
        one below goes left (set_batches leaves room at both ends)."""
        drawn = [c.getData() for c in self.items if isinstance(c, pg.PlotDataItem) and c is not self.curves[mode]]
        xs_labelled, ys_labelled = self.curves[mode].getData()
        line = 16.0 * top / (self.plot.getViewBox().height() or 300.0)  # a label's height, in speedup units
        colour = FIXED_K if mode != AUTO else RUN_COLOURS["speculative"]
        for x, y in zip(xs_labelled, ys_labelled):
            others = [1.0] + [float(v) for xs, ys in drawn for v in ys[np.isclose(xs, x)]]
            room_above = min((v - y for v in others if v >= y), default=top - y)
            room_below = min((y - v for v in others if v <= y), default=y)
            if max(room_above, room_below) >= line or max(others) - y > 3 * line:
                below, at = room_below > room_above, float(y)  # beside it, even if close to a line
            else:
                below, at = False, max(others)  # just over the lines bunched at this B
            self.values.append(self._value(x, at, right=not below, below=below, text=y, colour=colour))

    def _show_break_even(self, measured: int | None, predicted: int | None, mode: str = "") -> None:
        at = measured if measured is not None else predicted
        if at is None:
            return
        self.break_even.setValue(math.log2(at))
        if measured is None:
            text = f"predicted break-even B = {predicted}"
        elif predicted is None or predicted == measured:
            text = f"break-even B = {measured}"
        else:
            text = f"break-even B = {measured} (predicted {predicted})"
        self.break_even.setVisible(True)  # first: a hidden label ignores its new text
        self.break_even.label.setFormat(f"{text} at {mode}" if mode else text)
        # On the roomier side of the line: left of it the label ran off a plot whose break-even is its first B.
        (low, high), _ = self.plot.getViewBox().viewRange()
        side = (1, 0) if math.log2(at) - low > high - math.log2(at) else (0, 0)
        set_label_anchor(self.break_even, side)

    def _value(self, x: float, y: float, right: bool, below: bool, text: float, colour: str) -> pg.TextItem:
        item = pg.TextItem(
            html=f'<span style="color:{colour}; font-size:8pt">{text:.2f}×</span>',
            anchor=(0.0 if right else 1.0, -0.1 if below else 1.1),
        )
        item.textItem.document().setDocumentMargin(1)
        item.setPos(float(x), y)
        return self.add(item)

    @property
    def break_even_batch(self) -> int | None:
        """The B the break-even line stands at, as drawn (None: no line)."""
        return round(2 ** self.break_even.value()) if self.break_even.isVisible() else None


class ThroughputChart(BatchChart):
    """Aggregate tokens per second against B: plain decoding and every speculative mode."""

    def __init__(self, parent=None) -> None:
        super().__init__(
            ("Aggregate throughput against batch size", "Throughput against B"),
            ("aggregate tokens/s (all requests)", "tokens/s"),
            parent,
            tip="Tokens per second over all the requests in flight together (the medians over the prompts).",
        )
        self.curves: dict[str, pg.PlotDataItem] = {}

    def clear_data(self) -> None:
        super().clear_data()
        self.curves = {}

    def show(self, sweep, context: int) -> None:
        self.clear_data()
        modes = [VANILLA] * (VANILLA in sweep.modes) + speculative_modes(sweep)
        top, fixed = 1.0, 0
        for mode in modes:
            points = [p for p in (sweep.point(b, mode, context) for b in sweep.batches) if p is not None]
            if not points:
                continue
            style = mode_style(mode, fixed)
            fixed += mode not in (AUTO, VANILLA)
            xs = np.log2([p.batch for p in points])
            ys = np.array([p.aggregate_tps for p in points])
            self.curves[mode] = self.add(pg.PlotDataItem(xs, ys, antialias=True, **style), mode_name(mode))
            top = max(top, float(ys.max()))
        self.set_batches(sweep.batches)
        self.plot.setYRange(0.0, stepped(top * 1.05), padding=0)
