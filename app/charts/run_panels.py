"""The run panels: what every run shows (throughput, acceptance, draft lengths, time split, depth).

One pyqtgraph plot each, fed from `app.charts.data.chart_series`; the base is panel.py.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from app.charts.panel import (
    ACCEPTED,
    BREAK_EVEN,
    EMPTY,
    HEADROOM,
    HISTOGRAM_HEADROOM,
    RUN_COLOURS,
    RUN_ORDER,
    TIME_COLOURS,
    CappedAxis,
    Panel,
    label_sides,
    set_bars,
    set_curve,
    set_label_anchor,
)
from engine import figures


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
        # as a filled area under the line: a symbol per step would make a long run's frames slow.
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
