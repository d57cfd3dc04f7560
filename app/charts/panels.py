"""The live chart panels: one pyqtgraph PlotWidget each, fed from `app.charts.data.chart_series`.

Every panel makes its plot items once and only calls `setData`/`setOpts` on
redraw; none of them computes anything beyond picking its part of the series.
Colours follow the Okabe-Ito palette (safe for colour-blind readers): one colour
per run everywhere, one per kind of time, and the theory plot's own.
"""

from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPalette
from PySide6.QtWidgets import QGraphicsItem, QHBoxLayout, QWidget

from app.charts.data import drafter_columns_of
from engine import figures, stats_owner

RUN_COLOURS = {"speculative": "#0072B2", "vanilla": "#E69F00"}  # blue, orange
TIME_COLOURS = {"draft": "#D55E00", "verify": "#56B4E9", "other": "#999999"}  # vermillion, sky, grey
BREAK_EVEN = "#D55E00"
SPEEDUP = "#009E73"  # green
ACCEPTED = "#009E73"  # green, as accepted draft tokens are in the chat
POOL_COLOURS = {"window": "#CC79A7", "text": "#0072B2"}  # reddish purple, blue
RUN_ORDER = ("speculative", "vanilla")
HEADROOM = 1.4  # y range over the data's top, so a top-right legend never covers data
HISTOGRAM_HEADROOM = 1.6  # its legend is wide: beside a tall bar in a narrow panel it needs more
RISING_HEADROOM = 1.7  # counts that rise from the bottom left, under a two-row legend at the top left
STEPS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)  # range tops: these times a power of ten


def stepped(value: float) -> float:
    """The smallest of STEPS times a power of ten at or above `value` (1.0 for nothing positive)."""
    if not np.isfinite(value) or value <= 0:
        return 1.0
    scale = 10.0 ** np.floor(np.log10(value))
    for step in STEPS:
        if step * scale >= value * (1 - 1e-9):
            return step * scale
    return 10.0 * scale


EMPTY = (np.zeros(0), np.zeros(0))


class Panel(pg.PlotWidget):
    """A PlotWidget themed from the Qt palette, with a title, axis labels and a legend."""

    def __init__(
        self,
        title: str | tuple[str, ...],
        x_label: str,
        y_label: str | tuple[str, ...],
        parent=None,
        axis_items=None,
        tip: str = "",
    ) -> None:
        """`title` and `y_label`: a text, or texts longest first; the longest that fits is shown (the
        y axis title runs along the plot's height, which a small window makes short). `tip`: what the
        chart shows, for its tooltip."""
        palette = parent.palette() if parent is not None else QPalette()
        self.fg = palette.color(QPalette.ColorRole.Text)
        self.bg = palette.color(QPalette.ColorRole.Base)
        super().__init__(parent=parent, background=self.bg, axisItems=axis_items)
        self.plot = self.getPlotItem()
        tick_font = QFont(self.font())
        tick_font.setPointSizeF(8.5)
        for side in ("left", "bottom"):
            axis = self.plot.getAxis(side)
            axis.setPen(pg.mkPen(self.fg))
            axis.setTextPen(pg.mkPen(self.fg))
            axis.setTickFont(tick_font)
            axis.enableAutoSIPrefix(False)  # it labels an empty 0..1 step axis "(x0.001)"
            # Ticks, labels and the grid (which the axes draw) are painted from a pixmap until the
            # range moves: half of what painting a panel cost while a reply streams.
            axis.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        # No `units=`: pyqtgraph would SI-scale them into "ktokens/s".
        self._titles: tuple[str, ...] = ()
        self._y_labels = (y_label,) if isinstance(y_label, str) else tuple(y_label)
        self.plot.setLabel("bottom", x_label, **self.label_style())
        self.plot.setLabel("left", self._y_labels[0], **self.label_style())
        if tip:
            self.setToolTip(tip)
        self.plot.showGrid(x=True, y=True, alpha=0.15)
        # Room on the right for the last x tick label, which pyqtgraph drops when it would overflow.
        self.plot.layout.setContentsMargins(2, 2, 14, 2)
        # No clip-to-view or downsampling: with them each setData cost a millisecond (a fifth of a
        # redraw) to save drawing a few thousand points, which costs less.
        self.legend = self.plot.addLegend(
            offset=(-6, 6),
            labelTextColor=self.fg,
            labelTextSize="8pt",
            verSpacing=-6,
            brush=pg.mkBrush(self.bg.red(), self.bg.green(), self.bg.blue(), 200),
        )
        # Small enough that a splitter can squeeze three columns to where LiveCharts reflows to two.
        self.setMinimumSize(170, 140)
        self._fitted: dict[int, tuple[float, float]] = {}  # axis (0 x, 1 y) -> what fit() asked for
        self._shown: dict[int, list[float]] = {}  # axis -> the view range that gave
        self.painted_s = 0.0  # the GUI thread's CPU time in paintEvent, in all (what LiveCharts' pace counts)
        self.set_title(title)
        self.plot.getViewBox().sigResized.connect(self._fit_words)

    def label_style(self) -> dict:
        return {"color": self.fg.name(), "font-size": "9pt"}

    def paintEvent(self, event) -> None:
        started = time.thread_time()
        super().paintEvent(event)
        self.painted_s += time.thread_time() - started

    def fit(self, axis: str, low: float, high: float, padding: float = 0.02) -> None:
        """Show `low`..`high` on `axis` ("x" or "y"), the top rounded up to a `stepped` value, so
        that a growing run moves the range (and redraws the cached axis) a few times, not at
        every frame. A range the user has zoomed or panned since is left alone until
        `unfit` (LiveCharts.reset: a new run)."""
        index = 0 if axis == "x" else 1
        wanted = (low, stepped(high - low) + low)
        if self._fitted.get(index) == wanted:
            return
        box = self.plot.getViewBox()
        shown = self._shown.get(index)
        if shown is not None and not np.allclose(box.viewRange()[index], shown):
            return  # the user's zoom
        (box.setXRange if index == 0 else box.setYRange)(*wanted, padding=padding)
        self._fitted[index], self._shown[index] = wanted, list(box.viewRange()[index])

    def unfit(self) -> None:
        """Forget what `fit` showed: the next run fits its ranges from scratch, zoomed or not."""
        self._fitted.clear()
        self._shown.clear()

    def set_title(self, title: str | tuple[str, ...]) -> None:
        """`title`: a text, or texts longest first (the longest that fits the panel's width is shown)."""
        titles = (title,) if isinstance(title, str) else tuple(title)
        if titles != self._titles:
            self._titles = titles
            self._fit_words()

    @property
    def full_title(self) -> str:
        """The panel's title in its longest wording, whatever fits now (the exports' names)."""
        return self._titles[0] if self._titles else ""

    def _fit_words(self, *_) -> None:
        """Show the longest title and y axis title that fit: a clipped one reads as a broken window."""
        # The title sits over the plot, not over the y axis: the view box's width is its room.
        box_width = self.plot.getViewBox().width()
        room = box_width - 8 if box_width > 0 else self.width() - 60
        title = longest_fitting(self._titles, self._font(10, bold=True), room)
        if title != self.plot.titleLabel.text:
            self.plot.setTitle(title, color=self.fg.name(), size="10pt", bold=True)
            # A title sets its own width as the plot's minimum, and a plot wider than its
            # widget is drawn cut off on the right, axis and all.
            self.plot.titleLabel.setMinimumWidth(0)
        axis = self.plot.getAxis("left")
        height = axis.geometry().height() or self.height() * 0.6
        label = longest_fitting(self._y_labels, self._font(9), height - 4)
        if label != axis.labelText:
            self.plot.setLabel("left", label, **self.label_style())

    def _font(self, points: float, bold: bool = False) -> QFont:
        font = QFont(self.font())
        font.setPointSizeF(points)
        font.setBold(bold)
        return font

    def show_series(self, series: dict) -> None:
        raise NotImplementedError

    def clear_data(self) -> None:
        raise NotImplementedError

    def legend_headroom(self, minimum: float, maximum: float = 3.0) -> float:
        """Top of the y range over the data's top so that a legend at the top clears the data:
        from the legend's and the plot's heights in pixels once laid out, else `minimum`."""
        plot_height = self.plot.getViewBox().height()
        legend_height = self.legend.boundingRect().height() + 10  # its offset, and a margin
        if not self.legend.isVisible() or plot_height <= 0:
            return minimum
        if plot_height <= legend_height:
            return maximum
        return min(max(minimum, plot_height / (plot_height - legend_height)), maximum)

    def muted(self, alpha: int = 110) -> QColor:
        """The foreground colour, faded: for reference lines that must not compete with data."""
        colour = QColor(self.fg)
        colour.setAlpha(alpha)
        return colour


class CappedAxis(pg.AxisItem):
    """An axis with no ticks above `top`: the range above it is headroom for a legend, not values."""

    def __init__(self, orientation: str, top: float = 1.0) -> None:
        super().__init__(orientation)
        self.top = top

    def tickValues(self, minVal, maxVal, size):
        levels = super().tickValues(minVal, maxVal, size)
        return [(spacing, [v for v in values if v <= self.top + 1e-9]) for spacing, values in levels]


def longest_fitting(texts: tuple[str, ...], font: QFont, room: float) -> str:
    """The first of `texts` (longest first) that is at most `room` pixels wide, else the last."""
    metrics = QFontMetrics(font)
    return next((text for text in texts if metrics.horizontalAdvance(text) <= room), texts[-1] if texts else "")


def set_label_anchor(line: pg.InfiniteLine, anchor: tuple[float, float]) -> None:
    if line.label.anchors[0] != anchor:
        line.label.anchors = [anchor, anchor]
        line.label.updatePosition()


LABEL_CLEARANCE = 0.15  # a line label's height on the 0..1 acceptance axis, with a margin


def label_sides(overall: float | None, break_even: float | None) -> tuple[bool, bool]:
    """Whether the "whole run" and "break-even" labels go above their lines.

    Apart, the whole-run label goes above its line and the break-even one below,
    except where that would cut them off at the top or bottom of the axis. When
    the two lines are closer than a label's height, a label on the inner side
    would sit on the other line and its label: the upper line's label goes above
    it and the lower one's below, so the gap between the lines separates them.
    """
    overall_above = overall is None or overall <= 1.0 - LABEL_CLEARANCE
    break_even_above = break_even is not None and break_even < LABEL_CLEARANCE
    if overall is not None and break_even is not None and abs(overall - break_even) < LABEL_CLEARANCE:
        # Outer sides where they fit; at the very top (or bottom) both go to the one side
        # left, where the lines' opposite ends (left, right) keep the labels apart.
        upper_above = max(overall, break_even) <= 1.0 - LABEL_CLEARANCE
        lower_above = min(overall, break_even) < LABEL_CLEARANCE
        if overall >= break_even:
            return upper_above, lower_above
        return lower_above, upper_above
    return overall_above, break_even_above


def shows(curve: pg.PlotDataItem, x, y) -> bool:
    """Whether `curve` already draws these points: handed over again, pyqtgraph would build its
    path again and repaint the panel, for nothing (the theory curves between two cost models, a
    histogram between two steps that changed no bar)."""
    shown_x, shown_y = curve.xData, curve.yData
    if shown_x is None or shown_y is None or len(shown_x) != len(x) or len(shown_y) != len(y):
        return False
    return bool(np.array_equal(shown_x, x) and np.array_equal(shown_y, y, equal_nan=True))


def set_bars(bars: pg.BarGraphItem, x, height) -> None:
    """Bars at `x` this tall, unless they are already (each setOpts rebuilds and repaints them)."""
    shown_x, shown_height = bars.opts.get("x"), bars.opts.get("height")
    if (
        shown_x is not None
        and shown_height is not None
        and np.shape(shown_x) == np.shape(x)
        and np.shape(shown_height) == np.shape(height)
        and np.array_equal(shown_x, x)
        and np.array_equal(shown_height, height)
    ):
        return
    bars.setOpts(x=x, height=height)


def set_curve(curve: pg.PlotDataItem, x: np.ndarray, y: np.ndarray) -> None:
    if shows(curve, x, y):
        return
    # skipFiniteCheck saves a pass over the data, but a NaN in a path it did not
    # check breaks the drawing, so it is only skipped when the data is all finite.
    finite = bool(np.isfinite(y).all())
    curve.setData(x, y, skipFiniteCheck=finite, connect="all" if finite else "finite")


class ThroughputPanel(Panel):
    """Tokens per second over a rolling window; the run colours are explained once, in the header."""

    def __init__(self, parent=None) -> None:
        super().__init__(
            "Tokens per second",
            "decoding time (s)",
            ("tokens/s (last 16 steps)", "tokens/s"),
            parent,
            tip="How fast the reply was decoded, over the last 16 steps (prefill left out). With the "
            "side by side, the vanilla run's line is orange.",
        )
        self.legend.hide()
        self.curves = {}
        for label in RUN_ORDER:
            self.curves[label] = self.plot.plot([], [], pen=pg.mkPen(RUN_COLOURS[label], width=2), antialias=True)
        self.plot.enableAutoRange(enable=False)

    def show_series(self, series: dict) -> None:
        right, top = 0.0, 0.0
        for label, curve in self.curves.items():
            x, y = series["throughput"].get(label, EMPTY)
            set_curve(curve, x, y)
            if len(x):
                right, top = max(right, float(x[-1])), max(top, float(np.nanmax(y, initial=0.0)))
        self.fit("x", 0.0, right)
        self.fit("y", 0.0, top * 1.05)

    def clear_data(self) -> None:
        self.show_series({"throughput": {}})


class AcceptancePanel(Panel):
    def __init__(self, parent=None) -> None:
        super().__init__(
            ("Per-token acceptance a", "Acceptance a"),
            "step",
            ("a (last 16 steps)", "a"),
            parent,
            tip=f"{figures.PER_TOKEN_ACCEPTANCE.tip} The dashed lines: the whole run's a, and the "
            f"{figures.BREAK_EVEN.name}: {figures.BREAK_EVEN.tip}",
        )
        self.legend.hide()  # the two reference lines carry their own labels
        self.curve = self.plot.plot([], [], pen=pg.mkPen(RUN_COLOURS["speculative"], width=2), antialias=True)
        self.overall = pg.InfiniteLine(
            angle=0,
            pen=pg.mkPen(self.muted(170), width=1, style=Qt.DashLine),
            label="",
            labelOpts={"position": 0.02, "color": self.muted(220), "anchors": [(0, 1), (0, 1)]},
        )
        self.break_even = pg.InfiniteLine(
            angle=0,
            pen=pg.mkPen(BREAK_EVEN, width=1.5, style=Qt.DashLine),
            label="",
            labelOpts={"position": 0.98, "color": BREAK_EVEN, "anchors": [(1, 0), (1, 0)]},
        )
        for line in (self.overall, self.break_even):
            line.setVisible(False)
            self.plot.addItem(line)
        self.plot.setYRange(0.0, 1.0, padding=0.03)
        self.plot.getViewBox().setLimits(yMin=-0.05, yMax=1.05)
        self.plot.enableAutoRange(enable=False)

    def show_series(self, series: dict) -> None:
        x, y = series["acceptance"].get("speculative", EMPTY)
        set_curve(self.curve, x, y)
        self.fit("x", 0.0, float(x[-1]) if len(x) else 1.0)  # the draft length panel's x too (linked)
        measured = series["theory"]["measured"]
        self.overall.setVisible(measured is not None)
        if measured is not None:
            self.overall.setValue(measured[0])
            self.overall.label.setFormat(f"whole run {measured[0]:.2f}")
        break_even = series["theory"]["break_even"]
        self.break_even.setVisible(break_even is not None and len(x) > 0)
        if break_even is not None:
            self.break_even.setValue(break_even)
            self.break_even.label.setFormat(
                "break-even: every a pays" if break_even < 0.005 else f"break-even {break_even:.2f}"
            )
        overall_above, break_even_above = label_sides(
            measured[0] if measured is not None else None, break_even if self.break_even.isVisible() else None
        )
        set_label_anchor(self.overall, (0, 1) if overall_above else (0, 0))
        set_label_anchor(self.break_even, (1, 1) if break_even_above else (1, 0))

    def clear_data(self) -> None:
        self.curve.setData([], [])
        self.overall.setVisible(False)
        self.break_even.setVisible(False)


class HistogramPanel(Panel):
    def __init__(self, parent=None) -> None:
        super().__init__(
            ("Draft tokens accepted per step", "Accepted per step"),
            "draft tokens accepted",
            ("share of drafting steps", "share of steps"),
            parent,
            axis_items={"left": CappedAxis("left")},
            tip="How many drafted tokens each step kept. The dots: what the per-token acceptance a "
            "predicts (the first rejection ends a step, so the counts fall geometrically).",
        )
        self.bars = pg.BarGraphItem(
            x=[], height=[], width=0.75, brush=RUN_COLOURS["speculative"], pen=pg.mkPen(None), name="measured"
        )
        self.plot.addItem(self.bars)
        self.model = self.plot.plot(
            [],
            [],
            pen=pg.mkPen(self.fg, width=1.5),
            symbol="o",
            symbolSize=6,
            symbolBrush=self.fg,
            symbolPen=None,
            name="predicted from a",
        )
        self.plot.getAxis("bottom").setTickSpacing(major=1, minor=1)
        self.plot.getAxis("left").setTickSpacing(major=0.5, minor=0.1)
        self.plot.getAxis("left").setStyle(maxTextLevel=0)  # labels at 0, 0.5, 1 only
        self.plot.enableAutoRange(axis="y", enable=False)
        self.plot.setYRange(0.0, 1.0, padding=0.02)

    def show_series(self, series: dict) -> None:
        h = series["accepted_histogram"]
        if h["steps"]:
            set_bars(self.bars, h["bins"], h["measured"])
            set_curve(self.model, h["bins"], h["predicted"])
            # Headroom above the tallest bar, and the legend over the lower half of the
            # bars, keep the legend off the data.
            top = max(float(h["measured"].max()), float(h["predicted"].max()))
            self.fit("y", 0.0, min(1.0, top) * self.legend_headroom(HISTOGRAM_HEADROOM), padding=0.0)
            tallest_on_right = int(np.argmax(h["measured"])) >= len(h["bins"]) / 2
            self.legend.setOffset((6, 6) if tallest_on_right else (-6, 6))
        else:
            self.bars.setOpts(x=[], height=[])
            self.model.setData([], [])
        self.plot.setXRange(-0.5, max(len(h["bins"]), 4) - 0.5, padding=0.02)

    def clear_data(self) -> None:
        self.bars.setOpts(x=[], height=[])
        self.model.setData([], [])
        self.plot.setXRange(-0.5, 3.5, padding=0.02)


class DraftLengthPanel(Panel):
    """What was asked and drafted per step; for tree drafters, the tree's nodes and the accepted length.

    A tree drafter's k is its node budget and what it drafted is the tree's size,
    so the same two series read "node budget" and "tree nodes"; the accepted
    length per step (the path the target kept) is drawn over them in green.
    """

    TITLES = {False: "Draft length k", True: "Tree size and accepted length"}
    NAMES = {False: ("k asked", "drafted"), True: ("node budget k", "tree nodes")}

    def __init__(self, parent=None) -> None:
        super().__init__(self.TITLES[False], "step", "tokens", parent, tip=figures.DRAFT_LENGTH.tip)
        self.tree = False
        self.asked = self.plot.plot([], [], pen=pg.mkPen(RUN_COLOURS["speculative"], width=2), stepMode="left")
        # What the drafter actually proposed (an n-gram drafter often finds fewer than k),
        # as a filled area under the line: symbols would cost 100 ms a frame on a long run.
        fill = QColor(RUN_COLOURS["speculative"])
        fill.setAlpha(70)
        self.drafted = self.plot.plot([], [], pen=None, stepMode="left", fillLevel=0, fillBrush=fill)
        self.drafted.setZValue(-1)
        self.accepted = self.plot.plot([], [], pen=pg.mkPen(ACCEPTED, width=1.5), stepMode="left")
        self.accepted.setVisible(False)
        self.plot.enableAutoRange(enable=False)  # x: the acceptance panel's (linked)
        self.plot.setYRange(0.0, 4.0 * HEADROOM)
        self._fill_legend()

    def set_tree(self, tree: bool) -> None:
        """Tree drafters (Medusa, EAGLE, lookahead): name the series for trees, show the accepted length."""
        tree = bool(tree)
        if tree == self.tree:
            return
        self.tree = tree
        self.set_title(self.TITLES[tree])
        self.accepted.setVisible(tree)
        self._fill_legend()

    def _fill_legend(self) -> None:
        self.legend.clear()
        asked, drafted = self.NAMES[self.tree]
        self.legend.addItem(self.asked, asked)
        self.legend.addItem(self.drafted, drafted)
        if self.tree:
            self.legend.addItem(self.accepted, "accepted")

    def show_series(self, series: dict) -> None:
        lengths = series["draft_length"]
        if not lengths:
            self.clear_data()
            return
        set_curve(self.asked, *lengths["k"])
        set_curve(self.drafted, *lengths["drafted"])
        if self.tree:
            set_curve(self.accepted, *lengths["accepted"])
        else:
            self.accepted.setData([], [])
        top = max(float(lengths["k"][1].max()), float(lengths["drafted"][1].max()), 1.0)
        self.fit("y", 0.0, top * self.legend_headroom(HEADROOM))

    def clear_data(self) -> None:
        self.asked.setData([], [])
        self.drafted.setData([], [])
        self.accepted.setData([], [])


class TimeSplitPanel(Panel):
    """Seconds spent drafting, verifying and on everything else, as one stacked bar per run.

    The share line above each bar is written in the parts' colours, so it doubles
    as the legend without covering a bar. The y axis counts the view's pixels, so
    that each run gets a slot of the view's height: its note (wrapped to the
    view's width, one or two lines) at the top, its bar in what is left below.
    """

    NOTE_GAP = 3  # pixels between a note and its bar, and above a note
    BAR_MAX = 26  # pixels: a bar no thicker than this, however tall the panel

    def __init__(self, parent=None) -> None:
        super().__init__(
            ("Where the time goes", "Time split"),
            "seconds",
            "",
            parent,
            tip="Decoding time split into drafting, verifying (the target's forward over the drafted "
            "tokens) and the rest (sampling, the acceptance rule, bookkeeping).",
        )
        self.legend.hide()
        self.bars = {}
        for part, colour in TIME_COLOURS.items():
            self.bars[part] = pg.BarGraphItem(x0=[], y=[], width=[], height=1, brush=colour, pen=pg.mkPen(None))
            self.plot.addItem(self.bars[part])
        self.notes = {}
        for label in RUN_ORDER:
            self.notes[label] = pg.TextItem("", anchor=(0, 0))
            self.plot.addItem(self.notes[label])
        self.plot.showGrid(x=True, y=False, alpha=0.15)
        self.plot.getViewBox().setMouseEnabled(y=False)
        self.plot.enableAutoRange(enable=False)
        self._labels: list[str] = []
        self._laid_out: tuple | None = None  # (ticks, bar heights, view height) last set
        self._html: dict[str, str] = {}  # run label -> its note's text as last set
        self._split: dict = {}  # the series' time split last shown
        self._short = False  # notes give the seconds alone: the plot is too short for the shares
        self._short_for: tuple | None = None  # (height, width, runs) _short was decided for
        # The view box gets its size after the widget's resize event: lay out when it does.
        self.plot.getViewBox().sigResized.connect(self._lay_out)

    def show_series(self, series: dict) -> None:
        split = series["time_split"]
        self._labels = labels = [label for label in RUN_ORDER if label in split]
        start = np.zeros(len(labels))
        for part, bar in self.bars.items():
            width = np.array([split[label][part] for label in labels])
            bar.setOpts(x0=start.copy(), width=width)
            start += width
        self._split = split
        self._write_notes()
        longest = max((sum(parts.values()) for parts in split.values()), default=1.0) or 1.0
        self.fit("x", 0.0, longest, padding=0.03)
        self._lay_out()

    def _write_notes(self) -> None:
        for label, note in self.notes.items():
            note.setVisible(label in self._split)
            if label in self._split:
                html = self._shares(self._split[label], short=self._short)
                if self._html.get(label) != html:  # each setHtml re-lays the note out and repaints it
                    self._html[label] = html
                    note.setHtml(html)

    def _lay_out(self, *_) -> None:
        box = self.plot.getViewBox()
        # In a short plot (a small screen) the shares do not fit above the bars: each note then says
        # only the run's seconds, and the tooltip what the colours are.
        short = self._needs_short(box.height())
        if short != self._short:
            self._short = short
            self._write_notes()
        height = box.height() if box.height() > 0 else 120.0  # pixels; a guess until laid out
        # A line longer than the plot would be cut off at its right edge: wrap it instead.
        (x0, x1), _ = box.viewRange()
        left = -x0 / (x1 - x0) * box.width() if x1 > x0 else 0.0  # where x = 0 is, in pixels
        width = max(box.width() - left - 4, 60)
        slot = height / max(len(self._labels), 1)
        rows, bar_heights, ticks = [], [], []
        for i, label in enumerate(self._labels):  # the first run on top
            note = self.notes[label]
            if note.textItem.textWidth() != width:
                note.setTextWidth(width)
            top = height - i * slot - self.NOTE_GAP
            note.setPos(0, top)
            note_height = note.textItem.boundingRect().height()
            bar = min(max(slot - note_height - 3 * self.NOTE_GAP, 4.0), self.BAR_MAX)
            centre = top - note_height - self.NOTE_GAP - bar / 2
            rows.append(centre)
            bar_heights.append(bar)
            ticks.append((centre, label))
        # Each of these repaints the panel and its cached axis even when nothing moved: only
        # on a change (most redraws while a reply streams change the bars' lengths alone).
        if (ticks, bar_heights, height) != self._laid_out:
            self._laid_out = (ticks, bar_heights, height)
            self.plot.getAxis("left").setTicks([ticks])
            for bar in self.bars.values():
                bar.setOpts(y=np.array(rows), height=np.array(bar_heights))
            self.plot.setYRange(0, height, padding=0)

    def _needs_short(self, height: float) -> bool:
        """Whether the full notes, wrapped to the view's width, leave each run's bar less than 4 pixels."""
        if height <= 0 or not self._labels:
            return False
        width = max(self.plot.getViewBox().width() - 4, 60)
        # Asked at every redraw; the answer changes with the plot's size and the runs shown, hardly
        # ever with the percentages: measured again only when those change.
        key = (round(height), round(width), tuple(self._labels))
        if key == self._short_for:
            return self._short
        self._short_for = key
        slot = height / len(self._labels)
        probe = pg.TextItem("", anchor=(0, 0))
        for label in self._labels:
            probe.setHtml(self._shares(self._split[label], short=False))
            probe.setTextWidth(width)
            if slot - probe.textItem.boundingRect().height() - 3 * self.NOTE_GAP < 4:
                return True
        return False

    def _shares(self, parts: dict, short: bool = False) -> str:
        total = sum(parts.values()) or 1.0
        if short:
            return f"<span style='font-size:8pt; color:{self.fg.name()}'>{total:.3g} s</span>"
        words = [f"<span style='color:{TIME_COLOURS[p]}'>{p} {100 * v / total:.0f}%</span>" for p, v in parts.items()]
        return (
            f"<span style='font-size:8pt; color:{self.fg.name()}'>{total:.3g} s:</span> "
            f"<span style='font-size:8pt; font-weight:600'>{' · '.join(words)}</span>"
        )

    def clear_data(self) -> None:
        self.show_series({"time_split": {}})


class DepthPanel(Panel):
    """accepted / tested per draft depth: per Medusa head ("head k"), per tree depth for EAGLE and
    lookahead ("depth k") or per chain position ("position k").

    The counts above each bar say how much evidence it rests on: a deep head
    is only tested when every head before it was right.
    """

    LABELS = {
        "head": "Acceptance per head",
        "depth": "Acceptance per tree depth",
        "position": "Acceptance per draft position",
    }
    MAX_NAMED_TICKS = 5  # "head 1".."head 5"; beyond that, numbers and the axis says what they are
    MAX_COUNTS = 8  # more bars than this and the count labels would run into each other

    def __init__(self, parent=None) -> None:
        super().__init__(
            self.LABELS["position"],
            "",
            "accepted / tested",
            parent,
            axis_items={"left": CappedAxis("left")},
            tip="The per-token acceptance a at each draft position (or Medusa head, or tree depth): "
            "a position is tested only when every one before it was accepted; the counts say "
            "how many times.",
        )
        self.legend.hide()
        self.label = "position"
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=RUN_COLOURS["speculative"], pen=pg.mkPen(None))
        self.plot.addItem(self.bars)
        self.counts: list[pg.TextItem] = []  # "accepted/tested" above each bar, reused from redraw to redraw
        self._axis_for: tuple | None = None  # (bars, label) the bottom axis was last set for
        self.plot.getAxis("left").setTickSpacing(major=0.5, minor=0.1)
        self.plot.getViewBox().setMouseEnabled(y=False)
        self.plot.enableAutoRange(enable=False)
        self.plot.setYRange(0.0, 1.25, padding=0.0)  # room above a full bar for its count
        self.clear_data()

    def set_label(self, label: str) -> None:
        """ "head" for Medusa heads, "depth" for other tree drafters, "position" for chain drafters."""
        self.label = label if label in self.LABELS else "position"
        self.set_title(self.LABELS[self.label])

    def tick_labels(self, n: int) -> list[str]:
        return [f"{self.label} {k}" if n <= self.MAX_NAMED_TICKS else str(k) for k in range(1, n + 1)]

    def show_series(self, series: dict) -> None:
        depth = series["depth"]
        n = len(depth["depth"])
        heights = np.nan_to_num(depth["rate"], nan=0.0)
        set_bars(self.bars, depth["depth"], heights)
        # Ticks, axis label and range change with the number of bars only: set again, each would
        # repaint the cached axis at every redraw of a streaming reply.
        if (n, self.label) != self._axis_for:
            self._axis_for = (n, self.label)
            self.plot.getAxis("bottom").setTicks([list(zip(range(1, n + 1), self.tick_labels(n)))])
            self.plot.setLabel(
                "bottom", self.label if n > self.MAX_NAMED_TICKS else "", color=self.fg.name(), size="9pt"
            )
            self.plot.setXRange(0.5, max(n, 4) + 0.5, padding=0.02)
        shown = n if n <= self.MAX_COUNTS else 0
        while len(self.counts) > shown:
            self.plot.removeItem(self.counts.pop())
        while len(self.counts) < shown:
            self.counts.append(pg.TextItem("", color=self.fg, anchor=(0.5, 1)))
            self.plot.addItem(self.counts[-1])
        for text, k, height, accepted, tested in zip(
            self.counts, depth["depth"], heights, depth["accepted"], depth["tested"]
        ):
            words = f"{int(accepted)}/{int(tested)}"
            if text.toPlainText() != words:
                text.setText(words)
            if (text.pos().x(), text.pos().y()) != (float(k), float(height) + 0.02):
                text.setPos(float(k), float(height) + 0.02)

    def clear_data(self) -> None:
        empty = np.zeros(0)
        self.show_series({"depth": {"depth": empty, "rate": empty, "accepted": empty, "tested": empty}})


# -- the drafter panel: numbers only some drafters have --------------------------------------


def _finite(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points where y is a number (a step without a drafter snapshot is NaN)."""
    keep = np.isfinite(y)
    return x[keep], y[keep]


def _latest(values: np.ndarray) -> int | None:
    finite = values[np.isfinite(values)] if len(values) else values
    return int(finite[-1]) if len(finite) else None


class PoolPanel(Panel):
    """Lookahead: the n-gram pool's size over steps, split into n-grams the Jacobi window
    produced and n-grams taken from the prompt and the reply; W, N and G in the title."""

    def __init__(self, parent=None) -> None:
        super().__init__("N-gram pool", "step", "n-grams", parent)
        self.legend.setOffset((6, 6))  # top left: the pool only grows
        window, text = (QColor(POOL_COLOURS[part]) for part in ("window", "text"))
        window.setAlpha(110)
        text.setAlpha(110)
        # The whole pool under the part from the text: the band above the text's is the window's.
        self.total = self.plot.plot(
            [],
            [],
            pen=pg.mkPen(POOL_COLOURS["window"], width=1.5),
            fillLevel=0,
            fillBrush=window,
            name="from the window",
        )
        self.text = self.plot.plot(
            [], [], pen=pg.mkPen(POOL_COLOURS["text"], width=1.5), fillLevel=0, fillBrush=text, name="from the text"
        )
        self.total.setZValue(-2)
        self.text.setZValue(-1)
        self.plot.enableAutoRange(axis="y", enable=False)
        self.plot.setYRange(0.0, 10.0 * RISING_HEADROOM)

    def show_series(self, series: dict) -> None:
        d = series["drafter"]
        stats = d["stats"] or {}
        title = "N-gram pool"
        if all(key in stats for key in ("window", "ngram", "max_candidates")):
            title += f" · W {stats['window']} · N {stats['ngram']} · G {stats['max_candidates']}"
        self.set_title(title)
        if "pool_size" not in d:
            self.clear_data()
            return
        x, total = _finite(d["step"], d["pool_size"])
        set_curve(self.total, x, total)
        xt, text = _finite(d["step"], d["pool_text"])
        set_curve(self.text, xt, text)
        top = max(float(total.max()) if len(total) else 0.0, 10.0)
        self.fit("y", 0.0, top * RISING_HEADROOM)

    def clear_data(self) -> None:
        self.total.setData([], [])
        self.text.setData([], [])


class PoolHitsPanel(Panel):
    """Lookahead: steps where a candidate from the pool had a token accepted, against the steps
    that ran the window (both running counts: the gap between them is the misses)."""

    def __init__(self, parent=None) -> None:
        super().__init__("Pool hits", "step", "steps", parent)
        self.legend.setOffset((6, 6))  # top left: both counts rise to the right
        self.steps = self.plot.plot(
            [], [], pen=pg.mkPen(self.muted(200), width=1.5, style=Qt.DashLine), name="window steps"
        )
        self.hits = self.plot.plot([], [], pen=pg.mkPen(ACCEPTED, width=2), name="pool hits")
        self.plot.enableAutoRange(axis="y", enable=False)
        self.plot.setYRange(0.0, 10.0 * RISING_HEADROOM)

    def show_series(self, series: dict) -> None:
        d = series["drafter"]
        if "pool_hits" not in d:
            self.set_title("Pool hits")
            self.clear_data()
            return
        x, hits = _finite(d["step"], d["pool_hits"])
        xs, steps = _finite(d["step"], d["pool_steps"])
        set_curve(self.hits, x, hits)
        set_curve(self.steps, xs, steps)
        last_hits, last_steps = _latest(hits), _latest(steps)
        self.set_title(
            "Pool hits" if last_hits is None or not last_steps else f"Pool hits: {last_hits} of {last_steps} steps"
        )
        top = max(float(steps.max()) if len(steps) else 0.0, float(hits.max()) if len(hits) else 0.0, 10.0)
        self.fit("y", 0.0, top * RISING_HEADROOM)

    def clear_data(self) -> None:
        self.hits.setData([], [])
        self.steps.setData([], [])


class ChainPanel(Panel):
    """Chained drafters: which member drafted each step, one row per member (and "none" for a
    step nobody drafted), in the member's colour; the title gives each member's steps."""

    COLOURS = ("#009E73", "#0072B2", "#CC79A7", "#D55E00")  # Okabe-Ito; the first member green, as free drafts

    def __init__(self, parent=None) -> None:
        super().__init__("Drafted by", "step", "", parent)
        self.legend.hide()
        self.points = pg.ScatterPlotItem(size=6, pen=pg.mkPen(None))
        self.plot.addItem(self.points)
        self.plot.enableAutoRange(axis="y", enable=False)
        self.members: tuple = ()
        self._set_rows(("first", "second"))

    def _set_rows(self, members: tuple) -> None:
        self.members = members
        ticks = [(0, "none"), *((i + 1, str(name)) for i, name in enumerate(members))]
        axis = self.plot.getAxis("left")
        axis.setTicks([ticks, []])
        # Wide enough for the longest name: the axis grows only after a paint that dropped one.
        metrics = QFontMetrics(axis.style["tickFont"] or self.font())
        axis.setWidth(max(metrics.horizontalAdvance(label) for _, label in ticks) + 16)
        self.plot.setYRange(-0.5, len(members) + 0.5, padding=0)

    def show_series(self, series: dict) -> None:
        d = series["drafter"]
        stats = d["stats"] or {}
        members = tuple(stats.get("members") or ())
        if members and members != self.members:
            self._set_rows(members)
        steps = stats.get("steps") or ()
        self.set_title("Drafted by" + (": " + ", ".join(f"{n} {s:,}" for n, s in zip(members, steps)) if steps else ""))
        if "drafted_by" not in d:
            self.clear_data()
            return
        x, y = _finite(d["step"], d["drafted_by"])
        brushes = [pg.mkBrush(self.COLOURS[(int(v) - 1) % len(self.COLOURS)] if v > 0 else "#999999") for v in y]
        self.points.setData(x, y, brush=brushes)

    def clear_data(self) -> None:
        self.points.setData([], [])


class ExitLayerPanel(Panel):
    """Early exit: the layer the draft left the target at, step by step (auto mode explores, then settles)."""

    def __init__(self, parent=None) -> None:
        super().__init__("Exit layer", "step", "layer", parent)
        self.legend.hide()
        self.curve = self.plot.plot([], [], pen=pg.mkPen(RUN_COLOURS["speculative"], width=2), stepMode="left")
        self.plot.enableAutoRange(axis="y", enable=False)
        self.plot.setYRange(0.0, 4.0, padding=0.05)
        self.n_layers = None

    def show_series(self, series: dict) -> None:
        d = series["drafter"]
        stats = d["stats"] or {}
        layer, n = stats.get("exit_layer"), stats.get("n_layers")
        title = "Exit layer"
        if layer is not None:
            title += f": {layer}" + (f" of {n}" if n else "")
            mode = stats.get("layers")
            title += " (auto)" if mode == "auto" else " (fixed)" if mode is not None else ""
        self.set_title(title)
        if "exit_layer" not in d:
            self.clear_data()
            return
        set_curve(self.curve, *_finite(d["step"], d["exit_layer"]))
        top = n or _latest(d["exit_layer"]) or 4
        if top != self.n_layers:
            self.n_layers = top
            self.plot.setYRange(0.0, float(top), padding=0.05)

    def clear_data(self) -> None:
        self.curve.setData([], [])


class ExitAcceptancePanel(Panel):
    """Early exit: measured acceptance per candidate exit layer, the one in use in the run's blue."""

    MAX_LABELS = 8  # more bars than this and the numbers above them would run into each other

    def __init__(self, parent=None) -> None:
        super().__init__(
            "Acceptance per exit layer",
            "exit layer",
            "accepted / tested",
            parent,
            axis_items={"left": CappedAxis("left")},
        )
        self.legend.hide()
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.7, brushes=[], pen=pg.mkPen(None))
        self.plot.addItem(self.bars)
        self.values: list[pg.TextItem] = []
        self.layers: list[int] = []  # the candidates drawn, in x order; tests read them
        self.plot.getAxis("left").setTickSpacing(major=0.5, minor=0.1)
        self.plot.getViewBox().setMouseEnabled(y=False)
        self.plot.enableAutoRange(enable=False)
        self.plot.setYRange(0.0, 1.25, padding=0.0)  # room above a full bar for its number
        self.plot.setXRange(-0.5, 3.5, padding=0.02)

    def show_series(self, series: dict) -> None:
        stats = series["drafter"]["stats"] or {}
        candidates = [c for c in stats.get("candidates") or () if isinstance(c, dict) and "layer" in c]
        in_use = stats.get("exit_layer")
        self.layers = [int(c["layer"]) for c in candidates]
        rates = [c.get("acceptance") for c in candidates]
        heights = [float(r) if r is not None else 0.0 for r in rates]
        other = self.muted(120)
        brushes = [pg.mkBrush(RUN_COLOURS["speculative"] if layer == in_use else other) for layer in self.layers]
        x = np.arange(len(candidates), dtype=float)
        self.bars.setOpts(x=x, height=heights, brushes=brushes)
        self.plot.getAxis("bottom").setTicks([[(float(i), str(layer)) for i, layer in enumerate(self.layers)]])
        self.plot.setLabel(
            "bottom",
            "exit layer" if in_use is None else f"exit layer (in use: {in_use})",
            color=self.fg.name(),
            size="9pt",
        )
        for item in self.values:
            self.plot.removeItem(item)
        self.values = []
        if len(candidates) <= self.MAX_LABELS:
            untried = "untried" if len(candidates) <= 5 else "–"  # measured nothing yet
            for i, (rate, height) in enumerate(zip(rates, heights)):
                text = pg.TextItem(untried if rate is None else f"{rate:.2f}", color=self.fg, anchor=(0.5, 1))
                text.setPos(float(i), height + 0.02)
                self.plot.addItem(text)
                self.values.append(text)
        self.plot.setXRange(-0.5, max(len(candidates), 4) - 0.5, padding=0.02)

    def clear_data(self) -> None:
        self.show_series({"drafter": {"stats": None}})


class StatsPanel(Panel):
    """A drafter the charts were not written for: each statistic its spec charts
    (`stat(chart=True)`), one curve per statistic over the steps, named by the stat's label."""

    COLOURS = ("#0072B2", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#E69F00")  # Okabe-Ito, blue first

    def __init__(self, kind: str, parent=None) -> None:
        self.columns = drafter_columns_of(kind)
        units = {c.stat.unit for c in self.columns}
        spec = stats_owner(kind)
        super().__init__(
            spec.label if spec is not None else kind,
            "step",
            units.pop() or "value" if len(units) == 1 else "value",
            parent,
        )
        self.legend.setOffset((6, 6))  # top left: running counts rise to the right
        self.curves = {}
        for i, column in enumerate(self.columns):
            pen = pg.mkPen(self.COLOURS[i % len(self.COLOURS)], width=2)
            self.curves[column.name] = self.plot.plot([], [], pen=pen, name=column.stat.label)
        self.plot.enableAutoRange(axis="y", enable=False)
        self.plot.setYRange(0.0, 10.0 * RISING_HEADROOM)

    def show_series(self, series: dict) -> None:
        d = series["drafter"]
        low, top = 0.0, 10.0
        for name, curve in self.curves.items():
            x, y = _finite(d["step"], d[name]) if name in d else EMPTY
            set_curve(curve, x, y)
            if len(y):
                low, top = min(low, float(y.min())), max(top, float(y.max()))
        self.fit("y", low, top * RISING_HEADROOM)

    def clear_data(self) -> None:
        for curve in self.curves.values():
            curve.setData([], [])


class DrafterPanel(QWidget):
    """The loaded drafter's own numbers: two plots side by side whose content switches by kind.

    lookahead   the n-gram pool (W, N, G in its title) | pool hits against the window's steps
    early exit  the exit layer over steps              | measured acceptance per candidate exit
    another     its charted statistics over the steps (StatsPanel), as its registry spec says
    A drafter that charts nothing has nothing here (its numbers are in the other panels)
    and the panel is hidden. The plots are made the first time a kind needs them.
    """

    KINDS = {
        "lookahead": (PoolPanel, PoolHitsPanel),
        "early-exit": (ExitLayerPanel, ExitAcceptancePanel),
        "chain": (ChainPanel,),
    }

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.kind: str | None = None
        self._pairs: dict[str, tuple[Panel, Panel]] = {}
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(4)
        self.setVisible(False)

    @property
    def active(self) -> bool:
        """Whether the loaded drafter has anything to show here."""
        return self.kind is not None

    @property
    def plots(self) -> tuple[Panel, ...]:
        """The plots shown for the current kind (none when inactive)."""
        return self._pairs[self.kind] if self.kind is not None else ()

    def set_kind(self, kind: str | None) -> None:
        """The drafter whose numbers to show (DrafterView.panel), or None."""
        kind = kind if kind in self.KINDS or drafter_columns_of(kind) else None
        if kind == self.kind:
            return
        for pair_kind, pair in self._pairs.items():
            for plot in pair:
                plot.setVisible(pair_kind == kind)
        if kind is not None and kind not in self._pairs:
            makers = self.KINDS.get(kind) or (lambda parent: StatsPanel(kind, parent),)
            pair = tuple(make(self) for make in makers)
            for plot in pair:
                self._layout.addWidget(plot, 1)
                plot.setVisible(True)  # a child made after its parent was shown starts hidden
            self._pairs[kind] = pair
        self.kind = kind

    def show_series(self, series: dict) -> None:
        for plot in self.plots:
            plot.show_series(series)

    def clear_data(self) -> None:
        for pair in self._pairs.values():
            for plot in pair:
                plot.clear_data()
