"""`LoadView`: a load sweep on screen (engine/bench/load_results.py's LoadSweep), and its exports.

Two charts side by side (load_chart.py), then in words: what the break-even B is, for a reader
who never saw the article; which of the article's failure modes these numbers show (the sweep's
own sentence); and, with a draft model, how many sequences its cache costs. With several context
lengths a selector picks the one drawn (the break-even may move with it). Exports: the view as it
looks (PNG), one row per measured point (CSV) and the sweep itself (JSON, as `--json` writes it).
"""

from __future__ import annotations

import csv
import html
import json
import os

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.bench.load_chart import SpeedupChart, ThroughputChart
from engine import VANILLA

CAPTION = (
    "<b>How to read this.</b> B is how many requests the engine decodes together. The speedup is "
    "speculative decoding's total tokens per second over plain decoding's at the same B: above the "
    "dotted 1× line drafting pays. Where the model's weights are read once however many tokens are "
    "checked (a GPU, most CPUs with few requests), checking drafted tokens at B = 1 is nearly free; as "
    "B grows the batch keeps the processor busy and every drafted token costs about what a real one "
    "does, and on a processor that is busy already at one token that is true from B = 1. The "
    "<b>break-even B</b> "
    "(dashed red line) is the first batch size where speculation no longer pays: serve more requests "
    "at once than that and drafting should be off (automatic k turns it off by itself)."
)
CSV_COLUMNS = (
    "context",
    "batch",
    "mode",
    "aggregate_tps",
    "request_tps",
    "ttft_s",
    "mean_k",
    "acceptance",
    "mean_batch",
    "tokens",
    "speedup",
    "predicted_speedup",
)
GIB = 2**30


class LoadView(QWidget):
    """The charts and sentences of one LoadSweep; empty until `show_sweep`."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.sweep = None  # the LoadSweep shown
        self.speedup = SpeedupChart(self)
        self.throughput = ThroughputChart(self)
        self.context_box = QComboBox()
        self.context_box.currentIndexChanged.connect(lambda _: self._draw())
        self.context_label = QLabel("Context length:")
        self.context_label.setBuddy(self.context_box)
        contexts = QHBoxLayout()
        contexts.addWidget(self.context_label)
        contexts.addWidget(self.context_box)
        contexts.addStretch(1)
        charts = QHBoxLayout()
        charts.setSpacing(6)
        charts.addWidget(self.speedup, 1)
        charts.addWidget(self.throughput, 1)
        self.caption = _words(CAPTION)
        self.failure = _words("")
        self.memory = _words("")
        self.pair = _words("")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(contexts)
        layout.addLayout(charts, 1)
        for label in (self.failure, self.memory, self.caption, self.pair):
            layout.addWidget(label)
        self.show_sweep(None)

    @property
    def context(self) -> int | None:
        """The context length drawn (None: nothing shown)."""
        data = self.context_box.currentData()
        return None if data is None else int(data)

    def show_sweep(self, sweep) -> None:
        """Draw `sweep` (a LoadSweep), or clear the view (None)."""
        self.sweep = sweep
        contexts = sweep.contexts if sweep is not None else ()
        self.context_box.blockSignals(True)
        self.context_box.clear()
        for context in contexts:
            self.context_box.addItem(f"{context:,} tokens", context)
        self.context_box.blockSignals(False)
        several = len(contexts) > 1
        self.context_box.setVisible(several)
        self.context_label.setVisible(several)
        self.caption.setVisible(sweep is not None)
        self._draw()

    def _draw(self) -> None:
        sweep, context = self.sweep, self.context
        if sweep is None or context is None:
            for chart in (self.speedup, self.throughput):
                chart.clear_data()
            for label in (self.failure, self.memory, self.pair):
                label.clear()
                label.hide()
            return
        self.speedup.show(sweep, context)
        self.throughput.show(sweep, context)
        self.failure.setText(
            f"<b>What these numbers show:</b> {html.escape(sweep.failure_mode)}" if sweep.failure_mode else ""
        )
        self.failure.setVisible(bool(sweep.failure_mode))
        line = memory_sentence(sweep.memory)
        self.memory.setText(f"<b>Memory:</b> {line}" if line else "")
        self.memory.setVisible(bool(line))
        self.pair.setText(html.escape(f"Measured on {sweep.target} · {sweep.drafter} · {sweep.backend}"))
        self.pair.show()

    # -- exports -------------------------------------------------------------------

    def export_png(self, path: str | os.PathLike) -> None:
        """The charts and the sentences under them, as they look now."""
        if not self.grab().save(os.fspath(path), "PNG"):
            raise OSError(f"Could not write the image {os.fspath(path)}: check the folder exists and is writable.")

    def export_csv(self, path: str | os.PathLike) -> None:
        """One row per measured point (every context length), with its speedup and the predicted one."""
        sweep = self.sweep
        predicted = dict(sweep.predicted)
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(CSV_COLUMNS)
            for p in sorted(sweep.points, key=lambda p: (p.context, p.batch, p.mode != VANILLA, p.mode)):
                speedup = None if p.mode == VANILLA else sweep.speedup(p.batch, p.mode, p.context)
                row = (
                    p.context,
                    p.batch,
                    p.mode,
                    f"{p.aggregate_tps:.3f}",
                    f"{p.request_tps:.3f}",
                    f"{p.ttft_s:.4f}",
                    f"{p.mean_k:.3f}",
                    "" if p.acceptance is None else f"{p.acceptance:.4f}",
                    f"{p.mean_batch:.3f}",
                    p.tokens,
                    "" if speedup is None else f"{speedup:.4f}",
                    "" if p.mode == VANILLA or p.batch not in predicted else f"{predicted[p.batch]:.4f}",
                )
                writer.writerow(row)

    def export_json(self, path: str | os.PathLike) -> None:
        """The sweep whole, as `LoadSweep.to_dict` gives it (`LoadSweep.from_dict` reads it back)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.sweep.to_dict(), f, indent=2)


def memory_sentence(memory) -> str:
    """Failure mode 3 in one sentence, or "" without a draft model (nothing of its own to hold)."""
    if memory is None or not (memory.draft_bytes or memory.draft_kv_bytes_per_sequence):
        return ""
    budget = memory.budget_bytes / GIB
    size = f"{budget:.0f} GiB" if budget >= 10 or budget == int(budget) else f"{budget:.1f} GiB"
    with_draft = memory.max_batch_with_draft
    noun = "sequence" if with_draft == 1 else "sequences"
    return (
        f"With the draft model's cache, {with_draft} {noun} of {memory.context:,} tokens fit in {size}; "
        f"without it, {memory.max_batch_plain}."
    )


def _words(text: str) -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.RichText)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label
