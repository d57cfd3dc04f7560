"""A benchmark report on screen: a grouped bar chart, a table, and the three checks in words.

The chart has one group of bars per prompt (grouped by kind, kinds apart),
tokens per second of vanilla and speculative decoding side by side, then the
peers that ran; the speedup is written above each group. Colours follow the
live charts (Okabe-Ito): vanilla orange and speculative blue everywhere.
"""

from __future__ import annotations

import html
import textwrap

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

from engine import EFFICIENCY_LIMIT, SPECULATIVE, VANILLA, BenchReport
from app.charts.panels import RUN_COLOURS, Panel

PEER_COLOURS = ("#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")  # green, purple, sky, vermillion, yellow
KIND_GAP = 0.8  # extra room between the last prompt of a kind and the first of the next
MAX_TICK_CHARS = 22


class BenchChart(Panel):
    """Tokens per second per prompt: SpecDeck vanilla and speculative, and each peer that ran."""

    def __init__(self, parent=None) -> None:
        super().__init__("Decoding speed per prompt", "prompt", "tokens/s (median of repeats)", parent)
        self.plot.setClipToView(False)
        self.plot.setDownsampling(auto=False)
        self.plot.showGrid(x=False, y=True, alpha=0.15)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.bars: dict[str, pg.BarGraphItem] = {}  # series name -> its bars
        self.labels: list[pg.TextItem] = []
        self.setMinimumSize(480, 260)

    def clear_data(self) -> None:
        for item in [*self.bars.values(), *self.labels]:
            self.plot.removeItem(item)
        self.bars, self.labels = {}, []
        self.legend.clear()

    def show_report(self, report: BenchReport) -> None:
        self.clear_data()
        prompts = report.prompts
        centres, x, kind_spans = [], 0.0, []
        for i, prompt in enumerate(prompts):
            if i and prompt.kind != prompts[i - 1].kind:
                x += KIND_GAP
            if not kind_spans or kind_spans[-1][0] != prompt.kind:
                kind_spans.append([prompt.kind, x, x])
            kind_spans[-1][2] = x
            centres.append(x)
            x += 1.0
        series = [("SpecDeck vanilla", RUN_COLOURS[VANILLA], [p.vanilla_tps for p in prompts]),
                  ("SpecDeck speculative", RUN_COLOURS[SPECULATIVE], [p.speculative_tps for p in prompts])]
        for peer, colour in zip(report.peers, PEER_COLOURS * 3):
            if peer.ok:
                speeds = {row.prompt_id: row.tokens_per_s for row in peer.prompts}
                series.append((peer.name, colour, [speeds.get(p.id, 0.0) for p in prompts]))
        width = 0.8 / len(series)
        centres_array = np.array(centres)
        for j, (name, colour, heights) in enumerate(series):
            offsets = centres_array - 0.4 + width * (j + 0.5)
            bars = pg.BarGraphItem(x=offsets, height=np.array(heights, dtype=float), width=width * 0.92,
                                   brush=pg.mkBrush(colour), pen=pg.mkPen(None), name=name)  # fmt: skip
            self.plot.addItem(bars)
            self.bars[name] = bars
        top = max((max(h) for _, _, h in series if h), default=1.0) or 1.0
        for i, (prompt, centre) in enumerate(zip(prompts, centres)):
            tallest = max(heights[i] for _, _, heights in series)
            self._label(f"{prompt.speedup:.2f}×", centre, tallest, (0.5, 1.0))
        for kind, start, end in kind_spans:
            self._label(kind, (start + end) / 2, top * 1.16, (0.5, 1.0), bold=True)
        # Long ids would run into each other: every other label goes one line lower.
        ticks = [(c, ("\n" if i % 2 else "") + _short(p.id)) for i, (c, p) in enumerate(zip(centres, prompts))]
        self.plot.getAxis("bottom").setTicks([ticks])
        self.legend.setColumnCount(min(len(series), 4))  # one row above the bars, not a box over them
        self.plot.setXRange(-0.6, x - 0.4, padding=0)
        self.plot.setYRange(0, top * 1.5, padding=0)  # headroom for the labels and the legend

    def _label(self, text: str, x: float, y: float, anchor, bold: bool = False) -> None:
        colour = self.fg.name()
        weight = "bold" if bold else "normal"
        item = pg.TextItem(html=f'<span style="color:{colour}; font-size:8pt; font-weight:{weight}">'
                                f"{html.escape(text)}</span>", anchor=anchor)  # fmt: skip
        item.setPos(x, y)
        self.plot.addItem(item)
        self.labels.append(item)


def _short(text: str) -> str:
    return text if len(text) <= MAX_TICK_CHARS else text[: MAX_TICK_CHARS - 1] + "…"


class BenchTable(QTableWidget):
    """One row per prompt, then one per kind and one for all prompts; peers as extra speed columns."""

    BASE = ("prompt", "kind", "tokens", "vanilla\ntok/s", "speculative\ntok/s", "speedup", "acceptance\n(a)",
            "drafts\naccepted", "tokens /\nforward", "predicted\nspeedup", "identical")  # fmt: skip

    def __init__(self, parent=None) -> None:
        super().__init__(0, len(self.BASE), parent)
        self.setHorizontalHeaderLabels(list(self.BASE))
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.verticalHeader().hide()
        self.setAlternatingRowColors(True)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)

    def show_report(self, report: BenchReport) -> None:
        peers = [p for p in report.peers if p.ok]
        headers = [*self.BASE, *["\n".join(textwrap.wrap(f"{p.name} tok/s", 18)) for p in peers]]
        self.clear()
        self.setColumnCount(len(headers))
        self.setHorizontalHeaderLabels(headers)
        rows = []
        for p in report.prompts:
            same = "yes" if p.identical else ("no (rounding)" if (p.divergence or {}).get("explained") else "no")
            speeds = {peer.name: {r.prompt_id: r.tokens_per_s for r in peer.prompts} for peer in peers}
            rows.append(([p.id, p.kind, str(p.tokens), f"{p.vanilla_tps:.1f}", f"{p.speculative_tps:.1f}",
                          f"{p.speedup:.2f}×", f"{p.acceptance:.2f}", f"{p.draft_acceptance:.2f}",
                          f"{p.tokens_per_forward:.2f}",
                          f"{p.predicted_speedup:.2f}×", same]
                         + [f"{speeds[peer.name].get(p.id, 0.0):.1f}" for peer in peers], False))  # fmt: skip
        for g in (*report.kinds, report.overall):
            name = "all prompts" if g is report.overall else f"all {g.name}"
            rows.append(([name, g.name if g is not report.overall else "", "", f"{g.vanilla_tps:.1f}",
                          f"{g.speculative_tps:.1f}", f"{g.speedup:.2f}×", f"{g.acceptance:.2f}",
                          f"{g.draft_acceptance:.2f}", f"{g.tokens_per_forward:.2f}", f"{g.predicted_speedup:.2f}×", f"{g.identical}/{g.prompts}"]
                         + [f"{peer.tokens_per_s:.1f}" if g is report.overall else "" for peer in peers], True))  # fmt: skip
        self.setRowCount(len(rows))
        for r, (cells, bold) in enumerate(rows):
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c >= 2:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if bold:
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                self.setItem(r, c, item)


def checks_html(report: BenchReport) -> str:
    """The bandwidth floor, the efficiency and the memory check, and failed peers, as rich text."""

    def verdict(ok) -> str:
        if ok is None:
            return "unknown"
        return '<b style="color:#009E73">met</b>' if ok else '<b style="color:#D55E00">not met</b>'

    lines = []
    f = report.floor
    if f is not None:
        lines.append(f"<b>Bandwidth floor:</b> {f.weight_bytes / 2**20:.1f} MiB of weights per token at "
                     f"{f.bandwidth_bytes_per_s / 1e9:.1f} GB/s = {f.floor_s * 1e3:.2f} ms/token; vanilla takes "
                     f"{f.vanilla_s * 1e3:.2f} ms = {f.ratio:.2f}× the floor (goal ≤ {f.limit:.2f}×): {verdict(f.ok)}")  # fmt: skip
    o = report.overall
    lines.append(f"<b>Efficiency:</b> measured speedup {o.speedup:.2f}× of a predicted {o.predicted_speedup:.2f}× "
                 f"= {o.efficiency:.2f} (goal ≥ {EFFICIENCY_LIMIT}): {verdict(report.efficiency_ok)}")  # fmt: skip
    m = report.memory
    if m.vanilla_peak_bytes and m.speculative_peak_bytes:
        lines.append(f"<b>Memory:</b> peak {m.speculative_peak_bytes / 2**20:.0f} MiB speculative, "
                     f"{m.vanilla_peak_bytes / 2**20:.0f} MiB vanilla, limit {m.limit_bytes / 2**20:.0f} MiB: "
                     f"{verdict(m.ok)}")  # fmt: skip
    for peer in report.peers:
        if not peer.ok:
            lines.append(f"<b>{html.escape(peer.name)} failed:</b> {html.escape(peer.error or '')}")
    return "<br>".join(lines)
