"""The train dialog's live charts: the loss, and how often each head agrees with the target.

Medusa's series are its heads ("head 1", "head 2", ...); an EAGLE head reports
one number per depth of its own drafting ("depth 1", "depth 2"), as
engine.training does.

Fed one `TrainProgress` per step from the GUI thread; drawn by a timer (at most
10 times a second, and only when a step arrived), as the live charts are.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QWidget

from app.charts.panel import Panel, set_curve

# Okabe-Ito, in the order heads are numbered (safe for colour-blind readers).
HEAD_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
LOSS_COLOUR = "#0072B2"
REDRAW_MS = 100
WINDOW = 20  # steps in the running means: one batch is a noisy measurement
UNITS = {"medusa": "head", "eagle": "depth", "eagle3": "depth"}  # what one accuracy series is, per kind of heads
LOSS_LABELS = {"kl": "weighted KL to the target (nats)", "features": "weighted loss (features and greedy token)"}
AXIS_STYLE = {"font-size": "9pt"}


def running_mean(values: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """Mean of the last `window` values at each point (fewer at the start), along axis 0."""
    if not len(values):
        return values
    sums = np.cumsum(values, axis=0)
    before = np.zeros_like(sums)
    before[window:] = sums[:-window]
    counts = np.minimum(np.arange(1, len(values) + 1), window).reshape((-1,) + (1,) * (values.ndim - 1))
    return (sums - before) / counts


class TrainingCharts(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.loss_panel = Panel("Loss", "step", LOSS_LABELS["features"], self)  # the default objective
        faint = pg.mkColor(LOSS_COLOUR)
        faint.setAlpha(90)
        self.loss_curve = self.loss_panel.plot.plot([], [], pen=pg.mkPen(faint, width=1), name="each step")
        self.loss_mean = self.loss_panel.plot.plot(
            [], [], pen=pg.mkPen(LOSS_COLOUR, width=2.5), antialias=True, name=f"mean of {WINDOW} steps"
        )
        self.accuracy_panel = Panel(
            "Top-1 agreement with the target", "step", f"share of positions (mean of {WINDOW} steps)", self
        )
        self.accuracy_panel.plot.setYRange(0.0, 0.25, padding=0.03)
        self.accuracy_panel.plot.enableAutoRange(axis="y", enable=False)
        self.accuracy_curves: list[pg.PlotDataItem] = []
        self.unit = UNITS["medusa"]
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.loss_panel)
        layout.addWidget(self.accuracy_panel)
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.accuracy: list[tuple[float, ...]] = []
        self._timer = QTimer(self, singleShot=True, interval=REDRAW_MS, timeout=self.redraw)

    def set_kind(self, kind: str, objective: str | None = None) -> None:
        """Label the accuracy series for `kind` ("medusa": head k, "eagle" and "eagle3": depth k) and the loss
        for the training `objective` ("kl" or "features"), when given."""
        if objective in LOSS_LABELS:
            colour = self.loss_panel.fg.name()
            self.loss_panel.plot.setLabel("left", LOSS_LABELS[objective], color=colour, **AXIS_STYLE)
        unit = UNITS.get(kind, "head")
        if unit == self.unit:
            return
        self.unit = unit
        for curve in self.accuracy_curves:  # made again, with the new names, at the next redraw
            self.accuracy_panel.plot.removeItem(curve)
        self.accuracy_curves = []
        self._schedule()

    def series_names(self) -> list[str]:
        """The accuracy series' names, as the legend shows them."""
        return [curve.name() for curve in self.accuracy_curves]

    def reset(self) -> None:
        self.steps, self.losses, self.accuracy = [], [], []
        self.redraw()

    def load_history(self, losses: list[float], accuracy: list) -> None:
        """Steps already trained (a resumed run), drawn before the new ones."""
        self.steps = list(range(1, len(losses) + 1))
        self.losses = [float(x) for x in losses]
        self.accuracy = [tuple(a) for a in accuracy]
        self._schedule()

    def add(self, step: int, loss: float, accuracy: tuple[float, ...]) -> None:
        if self.steps and step <= self.steps[-1]:  # a run started over: forget the old curve
            self.steps, self.losses, self.accuracy = [], [], []
        self.steps.append(step)
        self.losses.append(loss)
        self.accuracy.append(tuple(accuracy))
        self._schedule()

    def redraw(self) -> None:
        self._timer.stop()
        x = np.asarray(self.steps, dtype=float)
        losses = np.asarray(self.losses, dtype=float)
        set_curve(self.loss_curve, x, losses)
        set_curve(self.loss_mean, x, running_mean(losses))
        heads = len(self.accuracy[-1]) if self.accuracy else 0
        self._ensure_curves(heads)
        rows = np.asarray([a[:heads] for a in self.accuracy], dtype=float).reshape(len(self.accuracy), heads)
        table = running_mean(rows)  # (steps, heads)
        for k, curve in enumerate(self.accuracy_curves):
            if k < heads:
                set_curve(curve, x, table[:, k])
            else:
                curve.setData([], [])
        # Early heads agree on a few percent of positions: zoom in until they do better.
        top = float(table.max()) if table.size else 0.0
        self.accuracy_panel.plot.setYRange(0.0, min(1.0, max(0.25, 1.3 * top)), padding=0.03)

    def _ensure_curves(self, heads: int) -> None:
        while len(self.accuracy_curves) < heads:
            k = len(self.accuracy_curves)
            colour = HEAD_COLOURS[k % len(HEAD_COLOURS)]
            curve = self.accuracy_panel.plot.plot(
                [], [], pen=pg.mkPen(colour, width=2), name=f"{self.unit} {k + 1}", antialias=True
            )
            self.accuracy_curves.append(curve)

    def _schedule(self) -> None:
        if not self._timer.isActive():
            self._timer.start()
