"""`AutotunePanel`: the benchmark dialog's "Find the best settings" result.

A ranked table, fastest first (plain decoding is a row of its own, at 1.00×),
the proposal in words, and "Use these settings", which hands the fastest
configuration to whoever applies it (the window's `apply_pair`).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.bench.view import counted
from engine import AutotuneResult
from engine.figures import ACCEPTANCE_LENGTH, DECODE_SPEEDUP, DRAFT_ACCEPTANCE, PER_TOKEN_ACCEPTANCE

# (header, tooltip): the glossary's names (engine/figures.py), as the benchmark's table has them.
COLUMNS = (
    ("#", ""),
    ("drafter", ""),
    ("k or\nnode budget", "The draft length k, or a tree drafter's node budget."),
    ("decoding\nspeedup", DECODE_SPEEDUP.tip + " Over the prompts: the geometric mean, as the benchmark's."),
    ("tok/s", "Decode tokens per second, prefill left out: the median over the prompts."),
    ("draft\nacceptance", DRAFT_ACCEPTANCE.tip),
    ("mean acceptance\nlength", ACCEPTANCE_LENGTH.tip),
    ("per-token\nacceptance a", PER_TOKEN_ACCEPTANCE.tip),
    ("identical", "Prompts whose reply is plain decoding's, token for token."),
)


class AutotunePanel(QWidget):
    sig_apply = Signal(object)
    """"Use these settings" was clicked: the best EngineConfig."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.result: AutotuneResult | None = None
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.apply_button = QPushButton("Use these settings", enabled=False)
        self.apply_button.clicked.connect(lambda: self.result and self.sig_apply.emit(self.result.best_config))
        top = QHBoxLayout()
        top.addWidget(self.summary, 1)
        top.addWidget(self.apply_button)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([header for header, _ in COLUMNS])
        for column, (_, tip) in enumerate(COLUMNS):
            self.table.horizontalHeaderItem(column).setToolTip(tip)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)

    def show_result(self, result: AutotuneResult, can_apply: bool = True) -> None:
        self.result = result
        best = result.best
        if result.beats_vanilla:
            self.summary.setText(
                f"<b>Fastest: {best.candidate.label}</b>, {DECODE_SPEEDUP.name} "
                f"{best.speedup:.2f}× (geometric mean over {counted(result.prompts, 'prompt')}, replies of up "
                f"to {result.max_tokens} tokens)."
            )
        else:
            self.summary.setText(
                "<b>Nothing beat plain decoding</b> on these prompts: the fastest is decoding without a drafter."
            )
        self.apply_button.setEnabled(can_apply)
        self.table.setRowCount(len(result.ranked))
        for row, r in enumerate(result.ranked):
            plain = r.candidate.drafter == "none"
            cells = (
                str(row + 1),
                "none (plain decoding)" if plain else r.candidate.drafter,
                str(r.candidate.k),
                f"{r.speedup:.2f}×",
                f"{r.tokens_per_s:.1f}",
                "" if plain else f"{r.draft_acceptance:.0%}",
                f"{r.tokens_per_forward:.2f}",
                "" if plain else f"{r.acceptance:.2f}",
                f"{r.identical}/{r.prompts}",
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column >= 2:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if row == 0:
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                self.table.setItem(row, column, item)
