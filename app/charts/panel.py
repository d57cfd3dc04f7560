"""What every live chart panel shares: the `Panel` plot widget, its colours and its helpers.

Every panel makes its plot items once and only calls `setData`/`setOpts` on
redraw; none of them computes anything beyond picking its part of the series.
Colours follow the Okabe-Ito palette (safe for colour-blind readers): one colour
per run everywhere, one per kind of time, and the theory plot's own. The panels
themselves: run_panels.py (what every run shows), drafter_panels.py (what only
some drafters have).
"""

from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPalette
from PySide6.QtWidgets import QGraphicsItem

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


def finite_points(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points where y is a number (a step without a drafter snapshot is NaN)."""
    keep = np.isfinite(y)
    return x[keep], y[keep]


def latest(values: np.ndarray) -> int | None:
    finite = values[np.isfinite(values)] if len(values) else values
    return int(finite[-1]) if len(finite) else None
