"""The drafter panels: numbers only some drafters have (lookahead's pool, a chain's members,
early exit's layer, any drafter's charted statistics), shown in one `DrafterPanel`.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFontMetrics
from PySide6.QtWidgets import QHBoxLayout, QWidget

from app.charts.data import drafter_columns_of
from app.charts.panel import (
    ACCEPTED,
    EMPTY,
    POOL_COLOURS,
    RISING_HEADROOM,
    RUN_COLOURS,
    CappedAxis,
    Panel,
    finite_points,
    latest,
    set_curve,
)
from engine import stats_owner

# -- the drafter panel: numbers only some drafters have --------------------------------------


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
        x, total = finite_points(d["step"], d["pool_size"])
        set_curve(self.total, x, total)
        xt, text = finite_points(d["step"], d["pool_text"])
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
        x, hits = finite_points(d["step"], d["pool_hits"])
        xs, steps = finite_points(d["step"], d["pool_steps"])
        set_curve(self.hits, x, hits)
        set_curve(self.steps, xs, steps)
        last_hits, last_steps = latest(hits), latest(steps)
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
        x, y = finite_points(d["step"], d["drafted_by"])
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
        set_curve(self.curve, *finite_points(d["step"], d["exit_layer"]))
        top = n or latest(d["exit_layer"]) or 4
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
            x, y = finite_points(d["step"], d[name]) if name in d else EMPTY
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
