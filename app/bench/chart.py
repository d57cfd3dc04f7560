"""The benchmark's bar chart: one group of bars per prompt (grouped by kind, kinds apart), decode
tokens per second of vanilla and speculative decoding side by side, then the peers that ran; each
prompt's decoding speedup is written above its group, each kind's name above its prompts.

Nothing overlaps at any width: the prompts' names stand upright under their groups (every other one
is left out where the groups are narrower than a line of text), the legend sits above the plot (not
over the bars or the kinds' names), and the y range leaves room in pixels for the two lines of
labels over the tallest bar. Colours follow the live charts (Okabe-Ito): vanilla orange, speculative blue.
"""

from __future__ import annotations

import html
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QFontMetricsF

from app.charts.panel import RUN_COLOURS, Panel
from engine import SPECULATIVE, VANILLA, BenchReport
from engine.figures import DECODE_SPEEDUP

PEER_COLOURS = ("#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")  # green, purple, sky, vermillion, yellow
KIND_GAP = 0.8  # extra room between the last prompt of a kind and the first of the next
MAX_TICK_CHARS = 16


class PromptAxis(pg.AxisItem):
    """The bottom axis: a tick under each prompt and its name written upright, ending at the tick."""

    def __init__(self) -> None:
        super().__init__("bottom")
        self.names: list[tuple[float, str]] = []  # (x in the plot's units, name)
        self.drawn: list[tuple[str, QRectF]] = []  # the names drawn at the last paint, in scene coordinates

    def set_names(self, names: list[tuple[float, str]]) -> None:
        self.names = names
        self.setTicks([[(x, "") for x, _ in names]])  # tick marks only: the names are drawn below
        metrics = QFontMetricsF(self.style.get("tickFont") or self.font())
        longest = max((metrics.horizontalAdvance(name) for _, name in names), default=0.0)
        label = self.label.boundingRect().height() if self.label.isVisible() else 0.0
        self.setHeight(math.ceil(longest + label + 12))
        self.picture = None
        self.update()

    def drawPicture(self, p, axisSpec, tickSpecs, textSpecs) -> None:  # noqa: N802 - pyqtgraph API
        super().drawPicture(p, axisSpec, tickSpecs, [])
        self.drawn = []
        view = self.linkedView()
        if view is None or not self.names:
            return
        font = self.style.get("tickFont") or self.font()
        metrics = QFontMetricsF(font)
        line = metrics.height()
        xs = [self.mapFromScene(view.mapViewToScene(QPointF(x, 0))).x() for x, _ in self.names]
        spacing = min((b - a for a, b in zip(xs, xs[1:])), default=line * 2)
        every = max(1, math.ceil((line + 1) / spacing)) if spacing > 0 else len(xs)
        top = self.style["tickLength"] + 3 if self.style["tickLength"] > 0 else 3
        p.setFont(font)
        p.setPen(self.textPen())
        for i, ((_, name), x) in enumerate(zip(self.names, xs)):
            if i % every or not 0 <= x <= self.width():
                continue
            width = metrics.horizontalAdvance(name)
            # Upright, reading from the bottom up, its end at the tick.
            p.save()
            p.translate(x + line / 2 - metrics.descent(), top + width)
            p.rotate(-90)
            p.drawText(QPointF(0, 0), name)
            p.restore()
            self.drawn.append((name, self.mapRectToScene(QRectF(x - line / 2, top, line, width))))


class BenchChart(Panel):
    """Tokens per second per prompt: SpecDeck vanilla and speculative, and each peer that ran."""

    def __init__(self, parent=None) -> None:
        self.axis = PromptAxis()
        # Short axis titles: a long one ran past a short plot. The names under the bars say "prompt".
        super().__init__("Decoding speed per prompt", "", "tokens/s", parent, axis_items={"bottom": self.axis})
        self.axis.showLabel(False)
        self.setToolTip(
            "Decode tokens per second (prefill left out, the median of the repeats) of each prompt, "
            "plain and speculative. "
            f"The number above each prompt is its {DECODE_SPEEDUP.name}: {DECODE_SPEEDUP.tip}"
        )
        self.plot.setClipToView(False)
        self.plot.setDownsampling(auto=False)
        self.plot.showGrid(x=False, y=True, alpha=0.15)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        # The legend goes above the plot, in the top axis's row: inside it, it covered bars and names.
        self.scene().removeItem(self.legend)
        self.legend = pg.LegendItem(offset=None, labelTextColor=self.fg, labelTextSize="8pt")
        self.plot.legend = self.legend  # where the plot lists the named bars
        self.plot.layout.removeItem(self.plot.getAxis("top"))  # hidden, never shown: its cell takes the legend
        self.plot.layout.addItem(self.legend, 1, 1, alignment=Qt.AlignmentFlag.AlignRight)
        self.bars: dict[str, pg.BarGraphItem] = {}  # series name -> its bars
        self.speedups: list[pg.TextItem] = []  # above each prompt's group
        self.kinds: list[pg.TextItem] = []  # above each kind's prompts
        self.top = 1.0  # the tallest bar
        self.plot.getViewBox().sigResized.connect(self.place_labels)  # the labels' room is counted in pixels
        self.setMinimumSize(480, 340)  # title, legend, upright names, and a plot with room for its labels

    @property
    def labels(self) -> list[pg.TextItem]:
        return [*self.speedups, *self.kinds]

    def clear_data(self) -> None:
        for item in [*self.bars.values(), *self.labels]:
            self.plot.removeItem(item)
        self.bars, self.speedups, self.kinds = {}, [], []
        self.legend.clear()

    def show_report(self, report: BenchReport) -> None:
        self.clear_data()
        prompts = report.prompts
        centres, x, kind_spans = [], 0.0, []
        for i, prompt in enumerate(prompts):
            if i and prompt.kind != prompts[i - 1].kind:
                x += KIND_GAP
            if not kind_spans or kind_spans[-1][0] != prompt.kind:
                kind_spans.append([prompt.kind, x, x, []])
            kind_spans[-1][2] = x
            kind_spans[-1][3].append(i)
            centres.append(x)
            x += 1.0
        series = [
            ("SpecDeck vanilla", RUN_COLOURS[VANILLA], [p.vanilla_tps for p in prompts]),
            ("SpecDeck speculative", RUN_COLOURS[SPECULATIVE], [p.speculative_tps for p in prompts]),
        ]
        for peer, colour in zip(report.peers, PEER_COLOURS * 3):
            if peer.ok:
                speeds = {row.prompt_id: row.tokens_per_s for row in peer.prompts}
                series.append((peer.name, colour, [speeds.get(p.id, 0.0) for p in prompts]))
        width = 0.8 / len(series)
        centres_array = np.array(centres)
        for j, (name, colour, heights) in enumerate(series):
            offsets = centres_array - 0.4 + width * (j + 0.5)
            bars = pg.BarGraphItem(
                x=offsets,
                height=np.array(heights, dtype=float),
                width=width * 0.92,
                brush=pg.mkBrush(colour),
                pen=pg.mkPen(None),
                name=name,
            )
            self.plot.addItem(bars)
            self.bars[name] = bars
        tallest = [max(heights[i] for _, _, heights in series) for i in range(len(prompts))]
        self.top = max(tallest, default=1.0) or 1.0
        for prompt, centre, height in zip(prompts, centres, tallest):
            self.speedups.append(self._label(f"{prompt.speedup:.2f}×", centre, height))
        for kind, start, end, members in kind_spans:
            self.kinds.append(self._label(kind, (start + end) / 2, max(tallest[i] for i in members), bold=True))
        self.axis.set_names([(c, _short(p.id)) for c, p in zip(centres, prompts)])
        self.legend.setColumnCount(min(len(series), 4))
        self.plot.setXRange(-0.6, max(x - 0.4, 0.6), padding=0)
        self.place_labels()

    def place_labels(self) -> None:
        """The y range, and the labels' heights, from the plot's height in pixels: a speedup just over
        its bars, a kind's name over its tallest prompt's speedup, both under the top of the plot."""
        if not getattr(self, "kinds", None):  # nothing shown yet (pyqtgraph resizes it inside __init__)
            return
        line = max((item.boundingRect().height() for item in self.labels), default=0.0)
        room = 2 * line + 4  # two labels over the tallest bar
        pixels = max(self.plot.getViewBox().height(), 3 * room)
        top = self.top * pixels / (pixels - room)
        self.plot.setYRange(0, top, padding=0)
        for item in self.speedups:
            item.setPos(item.pos().x(), item.bar_top)
        for item in self.kinds:
            item.setPos(item.pos().x(), item.bar_top + (line + 1) * top / pixels)

    def _label(self, text: str, x: float, bar_top: float, bold: bool = False) -> pg.TextItem:
        colour = self.fg.name()
        weight = "bold" if bold else "normal"
        item = pg.TextItem(
            html=f'<span style="color:{colour}; font-size:8pt; font-weight:{weight}">{html.escape(text)}</span>',
            anchor=(0.5, 1.0),
        )
        item.textItem.document().setDocumentMargin(1)  # its rectangle is its text: neighbours can sit closer
        item.bar_top = bar_top  # the height it stands on (place_labels lifts a kind's name a line more)
        item.setPos(x, bar_top)
        self.plot.addItem(item)
        return item


def _short(text: str) -> str:
    return text if len(text) <= MAX_TICK_CHARS else text[: MAX_TICK_CHARS - 1] + "…"
