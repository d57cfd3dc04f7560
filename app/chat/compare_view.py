"""Side by side: one prompt decoded plainly and speculatively, and the verdict.

Both runs decode greedily (whatever the chat samples with: identical outputs are the
point), with the same models, seed and length, one after the other (`Engine.compare`),
each from empty caches (so each pays its own prefill), and both stream into their own
pane. The verdict gives each run's time to first token, prefill and decoding time, the
decoding speedup (prefill left out, as speculation does not change it), and whether the
outputs are identical; where they are not, it names the first differing token and says
whether the engine explains the difference by rounding (see engine/core/divergence.py).
The chart above the verdict draws the same times (app/chat/compare_chart.py).
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSplitter, QVBoxLayout, QWidget

from app.chat.compare_chart import CompareChart, run_times
from app.chat.token_view import TokenView
from app.chat.view import Composer
from app.shell.settings import describe_sampling
from engine import Comparison, GenerationResult, RunStats, SamplingConfig, StepEvent
from engine.figures import DECODE_SPEEDUP, TIME_TO_FIRST_TOKEN

LABELS = ("vanilla", "speculative")
TITLES = {"vanilla": "Vanilla decoding (target only)", "speculative": "Speculative decoding"}
EMPTY_VERDICT = "Run a prompt to compare plain and speculative decoding on the loaded models."


def _speed(stats: RunStats) -> str:
    """'64 tokens · time to first token 0.12 s (prefill 0.11 s) · decoding 2.72 s, 23.5 tok/s'."""
    return f"{stats.tokens} tokens · {run_times(stats)}, {stats.tokens_per_s:.1f} tok/s"


def _token_text(result: GenerationResult, index: int) -> str:
    infos = result.token_infos
    return repr(infos[index].text) if index < len(infos) else "(end of output)"


def verdict_html(comparison: Comparison, greedy: bool) -> str:
    """The verdict as rich text (every model-made string escaped)."""
    vanilla, speculative = comparison.vanilla, comparison.speculative
    lines = [
        f"<b>Vanilla:</b> {html.escape(_speed(vanilla.stats))}",
        f"<b>Speculative:</b> {html.escape(_speed(speculative.stats))}",
        f"<b>{DECODE_SPEEDUP.name.capitalize()}:</b> {comparison.speedup:.2f}×"
        + (
            " (slower than plain decoding on this prompt: the charts show where the time went)"
            if 0 < comparison.speedup < 1
            else ""
        )
        + ". The decoding phase only: each run read the prompt itself (its prefill, grey in the chart), "
        "which speculation does not change.",
    ]
    if "cancelled" in (vanilla.finish_reason, speculative.finish_reason):
        lines.append("<b>Stopped</b> before both runs finished: the numbers cover what was decoded.")
    elif not greedy:
        lines.append("Sampled run: both outputs follow the target's distribution, but need not match token for token.")
    elif comparison.identical:
        lines.append(
            '<b style="color:#2ca02c">Outputs identical</b> (greedy): '
            "speculative decoding changed nothing but the speed."
        )
    elif comparison.divergence is None:  # a remote server's runs: text, without token ids to compare
        lines.append(
            "<b>Outputs differ</b>: the server sends text, not tokens, so the first difference "
            "cannot be named or explained."
        )
    else:
        d = comparison.divergence
        where = (
            f"Outputs differ from token {d.index}: vanilla {html.escape(_token_text(vanilla, d.index))}, "
            f"speculative {html.escape(_token_text(speculative, d.index))}."
        )
        if d.explained:
            lines.append(f'<b style="color:#e377c2">{where}</b> Explained by rounding: {html.escape(d.reason)}.')
        else:
            lines.append(
                f'<b style="color:#d62728">{where}</b> <b>Not explained by rounding</b>: '
                f"{html.escape(d.reason)}. This is a bug in the engine; please report it."
            )
    return "<br>".join(lines)


class _Pane(QWidget):
    """One run: a title, its tokens, and its running numbers."""

    def __init__(self, title: str) -> None:
        super().__init__()
        self.title = QLabel(f"<b>{title}</b>")
        self.view = TokenView()
        self.stats = QLabel(" ")
        self.stats.setWordWrap(True)  # two panes side by side: a long line must not widen the window
        self.stats.setToolTip(f"<b>{TIME_TO_FIRST_TOKEN.name.capitalize()}</b>: {TIME_TO_FIRST_TOKEN.tip}")
        self.steps = 0
        self.stats.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.stats)

    def reset(self) -> None:
        self.view.clear_messages()
        self.view.begin_message("assistant", "")  # the pane's title says whose output it is
        self.stats.setText("waiting…")
        self.steps = 0

    def clear(self) -> None:
        self.view.clear_messages()
        self.stats.setText(" ")
        self.steps = 0

    def add_step(self, event: StepEvent) -> None:
        self.view.append_tokens(event.tokens)
        self.stats.setText(_speed(event.stats))
        self.steps += 1


class CompareView(QWidget):
    """Prompt on top, the two runs side by side, the verdict below."""

    sig_run_requested = Signal(str)
    """The user asked to run both decodings on this prompt."""

    sig_stop_requested = Signal()
    """The user asked to stop the comparison."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.prompt = Composer()
        self.prompt.setPlaceholderText("One prompt for both runs (Enter to run, Esc to stop)")
        self.prompt.setFixedHeight(self.prompt.fontMetrics().lineSpacing() * 3 + 12)
        self.run_button = QPushButton("Run both")
        self.settings_label = QLabel()
        self.settings_label.setWordWrap(True)
        self.panes = {label: _Pane(TITLES[label]) for label in LABELS}
        self.verdict = QLabel(EMPTY_VERDICT)
        self.verdict.setWordWrap(True)
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.verdict.setFrameShape(QFrame.Shape.StyledPanel)
        self.verdict.setMargin(8)
        self.verdict.setToolTip(
            f"<b>{DECODE_SPEEDUP.name.capitalize()}</b>: {DECODE_SPEEDUP.tip}<br>"
            f"<b>{TIME_TO_FIRST_TOKEN.name.capitalize()}</b>: {TIME_TO_FIRST_TOKEN.tip}"
        )
        self.chart = CompareChart(self)

        top = QHBoxLayout()
        top.addWidget(self.prompt, 1)
        side = QVBoxLayout()
        side.addWidget(self.run_button)
        side.addStretch(1)
        top.addLayout(side)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setChildrenCollapsible(False)
        for label in LABELS:
            splitter.addWidget(self.panes[label])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(top)
        layout.addWidget(self.settings_label)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.chart)
        layout.addWidget(self.verdict)

        self._busy = self._ready = False
        self._sampling = SamplingConfig().as_greedy()
        self.prompt.sig_submit.connect(self._submit)
        self.prompt.sig_escape.connect(self.sig_stop_requested)
        self.run_button.clicked.connect(lambda: self.sig_stop_requested.emit() if self._busy else self._submit())
        self._update_controls()

    # -- what the window tells the view ------------------------------------------------

    def begin(self) -> None:
        for pane in self.panes.values():
            pane.reset()
        self.chart.clear_runs()
        self.verdict.setText("Decoding: vanilla first, then speculative, on the same models and settings…")

    def add_step(self, label: str, event: StepEvent) -> None:
        self.panes[label].add_step(event)

    def clear_results(self) -> None:
        """Empty both outputs, their numbers and the verdict: a new pair starts clean, with
        no run of the previous pair shown under its name. The prompt stays."""
        for pane in self.panes.values():
            pane.clear()
        self.chart.clear_runs()
        self.verdict.setText(EMPTY_VERDICT)

    def show_comparison(self, comparison: Comparison, greedy: bool | None = None) -> None:
        """The verdict; also draws both results if they did not stream in (e.g. loaded from a file).
        `greedy`: whether the runs were greedy; by default what `set_sampling` said (they are:
        EngineController.compare decodes both runs greedily)."""
        greedy = self._sampling.greedy if greedy is None else greedy
        for label, result in (("vanilla", comparison.vanilla), ("speculative", comparison.speculative)):
            pane = self.panes[label]
            if pane.steps != len(result.events):  # not streamed here: a result handed over whole
                pane.reset()
                for event in result.events:
                    pane.add_step(event)
            pane.stats.setText(_speed(result.stats))
        d = comparison.divergence
        if greedy and d is not None:
            tip = f"First difference between the runs (token {d.index}): {d.reason}"
            for label in LABELS:
                self.panes[label].view.mark_token(0, d.index, tip)
        self.chart.show_runs({"vanilla": comparison.vanilla.stats, "speculative": comparison.speculative.stats})
        self.verdict.setText(verdict_html(comparison, greedy))

    def show_failure(self, message: str) -> None:
        self.verdict.setText(f"<b>The comparison did not finish.</b> {html.escape(message)}")

    def set_settings_summary(self, text: str) -> None:
        self.settings_label.setText(text)

    def set_sampling(self, chat_sampling: SamplingConfig) -> None:
        """The chat's sampling: both runs use its seed, length and stop strings, greedily."""
        self._sampling = chat_sampling.as_greedy()
        self.set_settings_summary(
            f"Both runs: {describe_sampling(self._sampling)} (the side by side is always "
            "greedy, so the outputs must match); same models and seed."
        )

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self._update_controls()

    def set_ready(self, ready: bool) -> None:
        self._ready = ready
        self._update_controls()

    def _submit(self) -> None:
        text = self.prompt.toPlainText().strip()
        if text and self._ready:
            self.sig_run_requested.emit(text)

    def _update_controls(self) -> None:
        self.run_button.setText("Stop" if self._busy else "Run both")
        self.run_button.setEnabled(self._busy or self._ready)
