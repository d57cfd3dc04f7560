"""A benchmark report on screen: the table and the checks in words (chart.py draws the chart).

Every figure is named as engine/figures.py names it, with its tooltip on the column's header.
"""

from __future__ import annotations

import html
import textwrap

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

from engine import BenchReport
from engine.figures import ACCEPTANCE_LENGTH, DECODE_SPEEDUP, DRAFT_ACCEPTANCE, PER_TOKEN_ACCEPTANCE, PREDICTED_SPEEDUP

SPEED_TIP = "Decode tokens per second, prefill left out: the median of the repeats."
# (header, tooltip): the leading figures first, as everywhere (draft acceptance, then mean acceptance length).
COLUMNS = (
    ("prompt", ""),
    ("kind", ""),
    ("tokens", "Tokens of the speculative reply (median of the repeats)."),
    ("vanilla\ntok/s", SPEED_TIP),
    ("speculative\ntok/s", SPEED_TIP),
    ("decoding\nspeedup", DECODE_SPEEDUP.tip + " Per kind and for all prompts: the geometric mean."),
    ("draft\nacceptance", DRAFT_ACCEPTANCE.tip),
    ("mean acceptance\nlength", ACCEPTANCE_LENGTH.tip),
    ("per-token\nacceptance a", PER_TOKEN_ACCEPTANCE.tip),
    ("predicted\nspeedup", PREDICTED_SPEEDUP.tip),
    ("identical", "Whether the speculative reply is the vanilla reply, token for token."),
)


class BenchTable(QTableWidget):
    """One row per prompt, then one per kind and one for all prompts; peers as extra speed columns."""

    BASE = tuple(header for header, _ in COLUMNS)

    def __init__(self, parent=None) -> None:
        super().__init__(0, len(self.BASE), parent)
        self._set_headers(list(self.BASE))
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
        self._set_headers(headers)
        rows = []
        for p in report.prompts:
            same = "yes" if p.identical else ("no (rounding)" if (p.divergence or {}).get("explained") else "no")
            speeds = {peer.name: {r.prompt_id: r.tokens_per_s for r in peer.prompts} for peer in peers}
            rows.append(
                (
                    [
                        p.id,
                        p.kind,
                        str(p.tokens),
                        f"{p.vanilla_tps:.1f}",
                        f"{p.speculative_tps:.1f}",
                        f"{p.speedup:.2f}×",
                        f"{p.draft_acceptance:.0%}",
                        f"{p.tokens_per_forward:.2f}",
                        f"{p.acceptance:.2f}",
                        f"{p.predicted_speedup:.2f}×",
                        same,
                    ]
                    + [f"{speeds[peer.name].get(p.id, 0.0):.1f}" for peer in peers],
                    False,
                )
            )
        for g in (*report.kinds, report.overall):
            name = "all prompts" if g is report.overall else f"all {g.name}"
            rows.append(
                (
                    [
                        name,
                        g.name if g is not report.overall else "",
                        "",
                        f"{g.vanilla_tps:.1f}",
                        f"{g.speculative_tps:.1f}",
                        f"{g.speedup:.2f}×",
                        f"{g.draft_acceptance:.0%}",
                        f"{g.tokens_per_forward:.2f}",
                        f"{g.acceptance:.2f}",
                        f"{g.predicted_speedup:.2f}×",
                        f"{g.identical}/{g.prompts}",
                    ]
                    + [f"{peer.tokens_per_s:.1f}" if g is report.overall else "" for peer in peers],
                    True,
                )
            )
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

    def _set_headers(self, headers: list[str]) -> None:
        self.setHorizontalHeaderLabels(headers)
        tips = dict(COLUMNS)
        for column, header in enumerate(headers):
            self.horizontalHeaderItem(column).setToolTip(tips.get(header) or SPEED_TIP)


def counted(n: int, noun: str) -> str:
    """'1 prompt', '24 prompts': the dialog's and the auto-tune panel's counts."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def checks_html(report: BenchReport) -> str:
    """The bandwidth floor, the efficiency and the memory check, and failed peers, as rich text."""

    def verdict(ok) -> str:
        if ok is None:
            return "unknown"
        return '<b style="color:#009E73">met</b>' if ok else '<b style="color:#D55E00">not met</b>'

    lines = []
    f = report.floor
    if f is not None:  # what the floor is, and where plain decoding stands: no goal, no verdict (ours, not the user's)
        lines.append(
            f"<b>Bandwidth floor:</b> the fastest a token can be if every weight is read once per token: "
            f"{f.weight_bytes / 2**20:.1f} MiB of weights at {f.bandwidth_bytes_per_s / 1e9:.1f} GB/s = "
            f"{f.floor_s * 1e3:.2f} ms/token. Plain decoding took {f.vanilla_s * 1e3:.2f} ms/token, "
            f"{f.ratio:.2f}× the floor."
        )
    o = report.overall
    # What share of the formula's promise this machine delivered: an explanation, not a grade.
    lines.append(
        f"<b>Efficiency:</b> {DECODE_SPEEDUP.name} {o.speedup:.2f}× of a predicted {o.predicted_speedup:.2f}× "
        f"= {o.efficiency:.2f}, the share of the article's predicted speedup this machine delivered "
        f"(below 1: costs the formula leaves out, such as sampling and the acceptance rule)."
    )
    m = report.memory
    if m.vanilla_peak_bytes and m.speculative_peak_bytes:
        lines.append(
            f"<b>Memory:</b> peak {m.speculative_peak_bytes / 2**20:.0f} MiB speculative, "
            f"{m.vanilla_peak_bytes / 2**20:.0f} MiB vanilla, limit {m.limit_bytes / 2**20:.0f} MiB: "
            f"{verdict(m.ok)}"
        )
    for peer in report.peers:
        if not peer.ok:
            lines.append(f"<b>{html.escape(peer.name)} failed:</b> {html.escape(peer.error or '')}")
    return "<br>".join(lines)
