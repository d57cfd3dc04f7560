"""The theory panel: the article's formula, the measured operating point and the break-even acceptance.

For draft length k and per-token acceptance a, a step emits on average
E(a, k) = (1 - a^(k+1)) / (1 - a) tokens; with the cost model's measured draft
and verify times that becomes a predicted speedup over plain decoding. Where the
speedup curve crosses 1 is the break-even acceptance; when verification costs
grow like k + 1 plain steps (compute-bound, the article's failure mode 2) the
curve never crosses 1 and the panel says so instead of drawing a line.

The batch axis: a "B =" box over the title's right end sets how many sequences share each
verify forward (batch_theory.py). At B = 1 the panel is the article's formula as above; at a
larger B the speedup curve and the break-even a are the batch's, from the same cost model's
T(rows) (LiveCharts hands the panel its cost model), and a legend row says at which B
speculation stops paying at this run's acceptance: the article's failure mode 2.
"""

from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QSpinBox

from app.charts.batch_theory import LARGEST_BATCH, batch_speedup, batch_speedups, break_even_acceptance_at
from app.charts.batch_theory import break_even_batch as find_break_even_batch
from app.charts.panel import BREAK_EVEN, RUN_COLOURS, SPEEDUP, Panel, longest_fitting, set_label_anchor, shows

# The legend (up to five rows, top left) needs more room than other panels' two.
THEORY_HEADROOM = 2.2
TIP = (
    "The article's formula for draft length k: a step gives E = (1 - a^(k+1)) / (1 - a) tokens on average "
    "(blue), and the predicted speedup divides that by the step's cost against a plain step (green). The dots: "
    "this run's mean acceptance length on the steps that drafted, and its measured decoding speedup. Where "
    "green crosses 1 is the break-even a."
)
# Which legend rows a short plot keeps first: the formula's curves, then the run, then the rest.
# The note (no break-even, no cost model) is not in here: it outranks them all.
LEGEND_NEED = {
    "E[tokens per step]": 5,
    "predicted speedup": 4,
    "this run": 3,
    "this run's speedup": 2,
    "plain decoding (1×)": 1,
}
BATCH_TIP = (
    "Batch size B: how many sequences decode together, sharing each verify forward. The predicted "
    "speedup at B is E * T(B) / (B * draft time + T(B * (k + 1))), with T the cost model's measured "
    "verify time over that many rows (past the rows it measured, extended along its last slope). "
    "At B = 1 it is the article's formula. As B grows the batch fills the forward, each drafted row "
    "costs what a real token does, and the speedup falls: below 1 at the break-even B."
)
MAX_PANEL_BATCH = 64
SEARCH_S = 1.0  # the break-even label's place is looked for again at most this often while points move
LABEL_POSITIONS = (0.94, 0.84, 0.74, 0.64, 0.54, 0.44, 0.34, 0.24, 0.14, 0.06)  # along the break-even line, best first


class TheoryPanel(Panel):
    def __init__(self, parent=None) -> None:
        super().__init__(
            "Theory", "per-token acceptance a", ("tokens per step  /  speedup ×", "tokens/step or ×"), parent, tip=TIP
        )
        self.legend.setOffset((6, 6))  # top left: every curve rises to the right
        # No box: in a short plot the five rows' box took most of the height and faded the
        # curves and the break-even label under it; the rows themselves are kept clear of them.
        self.legend.setBrush(pg.mkBrush(None))
        blue = RUN_COLOURS["speculative"]
        # Unnamed items: the legend is rebuilt by hand, so its entries follow what is drawn.
        self.expected = self.plot.plot([], [], pen=pg.mkPen(blue, width=2), antialias=True)
        self.speedup = self.plot.plot([], [], pen=pg.mkPen(SPEEDUP, width=2), antialias=True)
        self.plain = pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen(self.muted(160), width=1.5, style=Qt.DotLine))
        self.plain_sample = pg.PlotDataItem(pen=self.plain.pen)  # its legend entry
        # Its label sits low on the line: the top left is the legend's, and right
        # of the break-even point every curve is above 1.
        self.break_even = pg.InfiniteLine(
            angle=90,
            pen=pg.mkPen(BREAK_EVEN, width=1.5, style=Qt.DashLine),
            label="",
            labelOpts={"position": 0.06, "color": BREAK_EVEN, "anchors": [(0, 1), (0, 1)]},
        )
        self.plot.addItem(self.plain)
        self.plot.addItem(self.break_even)
        self.measured = pg.ScatterPlotItem(size=11, pen=pg.mkPen(self.fg, width=1.5), brush=blue)
        self.measured_speedup = pg.ScatterPlotItem(size=11, symbol="d", pen=pg.mkPen(self.fg, width=1.5), brush=SPEEDUP)
        self.plot.addItem(self.measured)
        self.plot.addItem(self.measured_speedup)
        # The note goes in the legend: no free corner of the plot is safe for text
        # (with no break-even, the speedup curve runs along the bottom).
        self.note_sample = pg.PlotDataItem(pen=None)  # a legend line with text and no sample
        self.plot.setXRange(-0.02, 1.04, padding=0.0)  # room for the "1.0" tick label at the right edge
        self.plot.enableAutoRange(enable=False)
        self.plot.getViewBox().setLimits(xMin=-0.05, xMax=1.05, yMin=-0.2)
        self._k = None
        self._legend_entries = None
        self._shown_theory: dict | None = (
            None  # the series' theory part last shown (a resize lays its legend out again)
        )
        self._data_top = 1.0
        self.plot.getViewBox().sigResized.connect(self._refit)
        self.note = ""  # what the legend says when there is no break-even line; tests read it
        self._placed = None  # what the break-even label was last placed for (it only moves when that changes)
        self._searched_at = float("-inf")  # time.monotonic() of the label's last search
        # The batch axis: B, the cost model it reads T(rows) from, and the last series (drawn again when B moves).
        self.batch = 1
        self.costs = None
        self._series: dict | None = None
        self._batch_curves: tuple | None = None  # (key, theory at B): B's curves cost 200 formula calls
        self.batch_sample = pg.PlotDataItem(pen=None)  # the break-even B's legend row: text, no sample
        self.batch_box = QSpinBox(self)  # over the title row's right end (_place_batch_box)
        self.batch_box.setRange(1, MAX_PANEL_BATCH)
        self.batch_box.setPrefix("B = ")
        self.batch_box.setFont(self._font(8))
        self.batch_box.setToolTip(BATCH_TIP)
        self.batch_box.setAccessibleName("batch size B")
        self.batch_box.setEnabled(False)  # until there is a cost model to read T(rows) from
        self.batch_box.valueChanged.connect(self.set_batch)
        self.plot.getViewBox().sigResized.connect(self._place_batch_box)
        self._fit_words()

    # -- the batch axis ----------------------------------------------------------------------

    def set_costs(self, costs) -> None:
        """The cost model the batch axis reads T(rows) from (LiveCharts' own, handed over at each redraw)."""
        self.costs = costs
        self.batch_box.setEnabled(costs is not None)

    def set_batch(self, batch: int) -> None:
        """Draw the theory for B sequences decoded together (1: the article's formula)."""
        batch = min(max(int(batch), 1), MAX_PANEL_BATCH)
        if self.batch_box.value() != batch:
            self.batch_box.setValue(batch)  # comes back here
            return
        self.batch = batch
        if self._series is not None:
            self.show_series(self._series)

    def break_even_batch(self, t: dict | None = None) -> int | None:
        """Where speculation stops paying at this run's acceptance and the panel's k (None: unknown,
        or it still pays at LARGEST_BATCH)."""
        t = self._shown_theory if t is None else t
        if t is None or self.costs is None or not t.get("measured"):
            return None
        return find_break_even_batch(self.costs.snapshot(), t["measured"][0], t["k"])

    def _at_batch(self, t: dict) -> dict:
        """The theory part of the series at the panel's B (itself at B = 1 or with no cost model)."""
        if self.batch == 1 or self.costs is None or t["speedup"] is None:
            return t
        costs = self.costs.snapshot()
        key = (costs, t["k"], self.batch, len(t["a"]))
        if self._batch_curves is None or self._batch_curves[0] != key:
            k, batch = t["k"], self.batch
            curves = {
                "speedup": batch_speedups(costs, t["a"], k, batch),
                "break_even": break_even_acceptance_at(costs, k, batch),
                "max_speedup": batch_speedup(costs, 1.0, k, batch),
            }
            self._batch_curves = (key, curves)
        # This run's measured speedup was measured alone (B = 1): not a point of B's curve.
        return {**t, **self._batch_curves[1], "measured_speedup": None}

    def _batch_row(self, t: dict) -> str:
        """The legend's break-even B row, at B > 1 and with a run's acceptance to read it at."""
        if self.batch == 1 or self.costs is None or not t.get("measured"):
            return ""
        a, found = t["measured"][0], self.break_even_batch(t)
        if found is None:
            return f"pays up to B = {LARGEST_BATCH} at a = {a:.2f}"
        return f"break-even B = {found} at a = {a:.2f}"

    def _place_batch_box(self, *_) -> None:
        """The B box in the title row's left end, over the y axis (a corner nothing else uses)."""
        box = getattr(self, "batch_box", None)
        if box is None:
            return
        hint = box.sizeHint()
        title = self.mapFromScene(self.plot.titleLabel.sceneBoundingRect()).boundingRect()
        height = min(hint.height(), max(title.height() - 2, 16))
        box.setGeometry(2, title.center().y() - height // 2, hint.width(), height)

    def _box_overlap(self) -> float:
        """How far the B box reaches over the plot's left edge, in pixels (the title is centred over the plot)."""
        view = self.mapFromScene(self.plot.getViewBox().sceneBoundingRect()).boundingRect()
        left = view.left() if view.width() > 0 else 40
        return max(0.0, 2 + self.batch_box.sizeHint().width() + 6 - left)

    def _fit_words(self, *_) -> None:
        """Panel's, with the title kept clear of the B box (centred, so as clear on both sides)."""
        super()._fit_words()
        box = getattr(self, "batch_box", None)
        if box is None:  # inside Panel.__init__
            return
        width = self.plot.getViewBox().width()
        room = (width if width > 0 else self.width() - 60) - 8 - 2 * self._box_overlap()
        font = self._font(10, bold=True)
        fits = QFontMetrics(font).horizontalAdvance(self._titles[-1]) <= room if self._titles else True
        box.setVisible(fits)
        if fits:
            title = longest_fitting(self._titles, font, room)
            if title != self.plot.titleLabel.text:
                self.plot.setTitle(title, color=self.fg.name(), size="10pt", bold=True)
                self.plot.titleLabel.setMinimumWidth(0)
        self._place_batch_box()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(event)
        self._place_batch_box()

    # -- drawing -----------------------------------------------------------------------------

    def show_series(self, series: dict) -> None:
        self._series = series
        t = self._at_batch(series["theory"])
        k = t["k"]
        self.set_title((f"Theory for k = {k}", f"Theory, k = {k}"))
        # The curves change only with k and the cost model: most redraws move the measured points alone.
        if not shows(self.expected, t["a"], t["tokens_per_step"]):
            self.expected.setData(t["a"], t["tokens_per_step"], skipFiniteCheck=True)
        if t["speedup"] is None:
            self.speedup.setData([], [])
        elif not shows(self.speedup, t["a"], t["speedup"]):
            self.speedup.setData(t["a"], t["speedup"], skipFiniteCheck=True)
        break_even = t["break_even"]
        self.break_even.setVisible(break_even is not None)
        if break_even is not None:
            self.break_even.setValue(break_even)
        measured, points = t["measured"], t["measured_speedup"]
        self.measured.setData(*([measured[0]], [measured[1]]) if measured else ([], []))
        self.measured_speedup.setData(*([points[0]], [points[1]]) if points else ([], []))
        self.note = self._note(t)
        self._shown_theory = t
        self._show_legend(t)

        # Headroom keeps the top-left legend above the curves, which start near 1.
        self._data_top = max(
            k + 1.0, t["max_speedup"] or 0.0, measured[1] if measured else 0.0, points[1] if points else 0.0
        )
        top = self._top()
        if self._k != k or self.plot.getViewBox().viewRange()[1][1] < top:
            self.plot.setYRange(0.0, top, padding=0.02)
            self._k = k
        self._place_break_even_label()

    def _top(self) -> float:
        """The y range's top: the data's, raised until the legend (top left, in pixels) clears
        every curve and point below it; THEORY_HEADROOM times the data's before layout."""
        box = self.plot.getViewBox()
        (x0, x1), _ = box.viewRange()
        width, height = box.width(), box.height()
        rows = self._legend_rows()
        if width <= 0 or height <= 0 or not rows:
            return THEORY_HEADROOM * self._data_top
        left_px, top_px = box.sceneBoundingRect().left(), box.sceneBoundingRect().top()
        right_px = max(r.right() for r in rows) - left_px
        bottom_px = max(r.bottom() for r in rows) - top_px
        right = x0 + (right_px + 6) / width * (x1 - x0)  # the legend's right edge, in a
        under = [1.0]  # the plain-decoding line
        for item in (self.expected, self.speedup, self.measured, self.measured_speedup):
            x, y = item.getData()
            if x is not None and len(x):
                below = np.asarray(y)[np.asarray(x) <= right]
                under.extend(below[np.isfinite(below)])
        share = (bottom_px + 6) / height  # of the plot's height the legend's rows take, with a margin
        needed = max(under) / (1.0 - share) if share < 0.8 else 5.0 * max(under)
        return min(max(1.08 * self._data_top, needed), 3.0 * THEORY_HEADROOM * self._data_top)

    def _refit(self, *_) -> None:
        """On a resize: the legend's share of the plot changed, and how many of its rows fit."""
        if self._shown_theory is not None:
            self.note = self._note(self._shown_theory)
            self._show_legend(self._shown_theory)
        if self._k is not None:
            self.plot.setYRange(0.0, self._top(), padding=0.02)
        self._place_break_even_label()

    def _place_break_even_label(self, *_) -> None:
        """The longest wording, beside the line at the highest point where it covers no curve,
        point, plain-decoding line or legend and stays inside the plot (a label past the
        plot's edge is cut off: a narrow dock, a break-even near 1); failing that, where it
        covers the fewest."""
        if not self.break_even.isVisible():
            return
        value = self.break_even.value()
        if value < 0.005:
            texts = ["every a pays"]  # verification this cheap pays even when nothing is accepted
        else:
            texts = [f"break-even a = {value:.2f}", f"break-even {value:.2f}", f"{value:.2f}"]
        label = self.break_even.label
        box = self.plot.getViewBox()
        (x0, x1), _ = box.viewRange()
        if box.width() <= 0 or x1 <= x0:  # not laid out yet: the full text, on the roomier side
            label.setFormat(texts[0])
            set_label_anchor(self.break_even, (0, 1) if value <= 0.5 else (1, 1))
            return
        view = box.sceneBoundingRect()
        legend = self._legend_rows()
        points = self._drawn_points()
        # The search moves the label up to 60 times (a third of a redraw): it is done
        # again when the view or the legend changes, or when the line (the cost model is measured
        # again at every step) or what the label avoids (the measured points move at every redraw)
        # has moved and the label, where it was, now covers something; a label still clear stays.
        key = (view.getRect(), tuple(row.getRect() for row in legend))
        moved = (round(value, 3), np.round(points / 4).tobytes())
        placed = self._placed
        # While a reply streams, the measured points move at every redraw: the label follows them
        # at most every SEARCH_S (the search was a third of a redraw), and at once when the view,
        # the legend or the line moved.
        recent = time.monotonic() - self._searched_at < SEARCH_S
        if (
            placed is None
            or placed[0] != key
            or (placed[1] != moved and not recent and not self._clear(texts, placed[2], view, legend, points))
        ):
            self._placed = (key, moved, self._search(texts, value, view, legend, points))
            self._searched_at = time.monotonic()
        self._put_label(texts, self._placed[2])

    def _put_label(self, texts: list[str], placement: tuple[int, float, tuple[int, int]]) -> None:
        rank, position, side = placement
        self.break_even.label.setFormat(texts[min(rank, len(texts) - 1)])
        self.break_even.label.setPosition(position)
        set_label_anchor(self.break_even, side)

    def _clear(
        self,
        texts: list[str],
        placement: tuple[int, float, tuple[int, int]],
        view: QRectF,
        legend: list[QRectF],
        points: np.ndarray,
    ) -> bool:
        """Whether the label, placed so, covers no point, no legend row, and stays inside the view."""
        if placement[0] > 0:
            return False  # a shorter wording: the full one may fit somewhere now, look again
        self._put_label(texts, placement)
        rect = self.break_even.label.sceneBoundingRect()
        inside = (
            (points[:, 0] >= rect.left())
            & (points[:, 0] <= rect.right())
            & (points[:, 1] >= rect.top())
            & (points[:, 1] <= rect.bottom())
        )
        return view.contains(rect) and not inside.any() and not any(rect.intersects(row) for row in legend)

    def _search(
        self, texts: list[str], value: float, view: QRectF, legend: list[QRectF], points: np.ndarray
    ) -> tuple[int, float, tuple[int, int]]:
        """The first (wording, position, side) whose label covers nothing, else the one covering least.

        The label moves linearly along the line with its position, so each wording and side is
        placed twice and the rest of its places are interpolated: moving it through all 60
        candidates one by one cost more than the rest of a redraw."""
        sides = [(0, 1), (1, 1)] if value <= 0.5 else [(1, 1), (0, 1)]
        best = None
        for rank, text in enumerate(texts):
            self.break_even.label.setFormat(text)
            rects = {side: self._label_rects(side) for side in sides}
            for index, position in enumerate(LABEL_POSITIONS):
                for side in sides:
                    rect = rects[side][index]
                    hits = int(
                        np.count_nonzero(
                            (points[:, 0] >= rect.left())
                            & (points[:, 0] <= rect.right())
                            & (points[:, 1] >= rect.top())
                            & (points[:, 1] <= rect.bottom())
                        )
                    )
                    # Cut off is worse than over the legend, which is worse than over a curve.
                    hits += 1000 * any(rect.intersects(row) for row in legend) + 100_000 * (not view.contains(rect))
                    if hits == 0:
                        return rank, position, side
                    if best is None or (hits, rank) < best[:2]:
                        best = (hits, rank, position, side)
        return best[1:]

    def _label_rects(self, side: tuple[int, int]) -> list[QRectF]:
        """The break-even label's scene rectangle at each of LABEL_POSITIONS, with its text as set."""
        label = self.break_even.label
        set_label_anchor(self.break_even, side)
        measured = []
        for position in (LABEL_POSITIONS[0], LABEL_POSITIONS[-1]):
            label.setPosition(position)
            measured.append(label.sceneBoundingRect())
        first, last = measured
        shift = last.topLeft() - first.topLeft()
        span = LABEL_POSITIONS[-1] - LABEL_POSITIONS[0]
        return [first.translated(shift * ((position - LABEL_POSITIONS[0]) / span)) for position in LABEL_POSITIONS]

    def _rows_that_fit(self) -> int:
        """How many legend rows fit in 70% of the view's height (all of them before layout)."""
        height = self.plot.getViewBox().height()
        if height <= 0:
            return len(LEGEND_NEED) + 1
        row = QFontMetrics(self._font(8)).height() + 2  # the legend's row, less its negative spacing
        return max(2, int(0.7 * height // row))

    def _legend_rows(self) -> list[QRectF]:
        """Where the legend's samples and words are drawn (scene coordinates): in a short
        plot its translucent box takes most of the height, and the label may sit on the box."""
        if not self.legend.isVisible():
            return []
        rows = []
        for sample, label in self.legend.items:
            words = label.item.mapRectToScene(label.item.boundingRect())
            rows += [sample.mapRectToScene(sample.boundingRect()), words]
        return rows

    def _drawn_points(self) -> np.ndarray:
        """What the label must not cover, as scene points (n, 2): the curves (densely), the line
        at 1 and the measured points (with their symbols' size). Mapped to the scene as arrays
        (the view box maps linearly): one Qt call per point cost a third of a redraw."""
        box = self.plot.getViewBox()
        (x0, x1), _ = box.viewRange()
        xs, ys = [np.linspace(x0, x1, 150)], [np.ones(150)]
        for item in (self.expected, self.speedup):
            x, y = item.getData()
            if x is not None and len(x) > 1:
                dense = np.linspace(x[0], x[-1], 300)
                xs.append(dense)
                ys.append(np.interp(dense, x, y))
        x, y = np.concatenate(xs), np.concatenate(ys)
        keep = np.isfinite(y)
        scene = _to_scene(box, x[keep], y[keep])
        offsets = np.array([(dx, dy) for dx in (-6, 0, 6) for dy in (-6, 0, 6)], dtype=float)
        for item in (self.measured, self.measured_speedup):
            x, y = item.getData()
            if x is not None and len(x):
                centres = _to_scene(box, np.asarray(x, dtype=float), np.asarray(y, dtype=float))
                scene = np.concatenate([scene, (centres[:, None, :] + offsets[None, :, :]).reshape(-1, 2)])
        return scene

    def clear_data(self) -> None:
        self.measured.setData([], [])
        self.measured_speedup.setData([], [])

    def _note(self, t: dict) -> str:
        """The legend's last row, the longest wording that fits beside its blank sample."""
        if t["speedup"] is None:
            texts = ("speedup: no cost model yet", "no cost model yet", "no cost model")
        elif t["break_even"] is None and self.batch > 1:
            texts = (
                f"no break-even at B = {self.batch}: no a pays",
                f"no break-even at B = {self.batch}",
                "no break-even",
            )
        elif t["break_even"] is None:
            texts = (f"no break-even at k = {t['k']}: no a pays", f"no break-even at k = {t['k']}", "no break-even")
        else:
            return ""
        room = self.plot.getViewBox().width() - 40  # the legend's offset and its sample's width
        return longest_fitting(texts, self._font(8), room) if room > 0 else texts[0]

    def _show_legend(self, t: dict) -> None:
        measured, points = t["measured"], t["measured_speedup"]
        # Short entries: a wide legend would cover the curves' right ends. The numbers
        # are in LiveCharts' summary line.
        fg = self.fg.name()
        entries = [(self.expected, "E[tokens per step]", fg)]
        if t["speedup"] is not None:
            entries.append((self.speedup, "predicted speedup", fg))
        entries.append((self.plain_sample, "plain decoding (1×)", fg))
        if measured:
            entries.append((self.measured, "this run", fg))
        if points:
            entries.append((self.measured_speedup, "this run's speedup", fg))
        batch_row = self._batch_row(t)
        if batch_row:
            entries.append((self.batch_sample, batch_row, BREAK_EVEN))
        if self.note:
            colour = BREAK_EVEN if t["speedup"] is not None else self.muted(220).name()
            entries.append((self.note_sample, self.note, colour))
        # A short plot (a small window) takes fewer rows, the least needed dropped first (the
        # tooltip explains them all): rows past the view's height would sit on the axis title.
        rows = self._rows_that_fit()
        while len(entries) > rows:
            entries.remove(min(entries, key=lambda e: 4.5 if e[0] is self.batch_sample else LEGEND_NEED.get(e[1], 10)))
        if entries == self._legend_entries:
            return
        self._legend_entries = entries
        self.legend.clear()
        for item, text, colour in entries:
            self.legend.addItem(item, text)
            self.legend.getLabel(item).setText(text, color=colour, size="8pt")


def _to_scene(box, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """View coordinates to scene coordinates, (n, 2), by the view box's affine map."""
    origin = box.mapViewToScene(QPointF(0.0, 0.0))
    unit_x = box.mapViewToScene(QPointF(1.0, 0.0)) - origin
    unit_y = box.mapViewToScene(QPointF(0.0, 1.0)) - origin
    return np.stack(
        [origin.x() + x * unit_x.x() + y * unit_y.x(), origin.y() + x * unit_x.y() + y * unit_y.y()], axis=1
    )
