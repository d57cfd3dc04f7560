"""Help > What the numbers mean: every figure the window shows, in plain words, with the user's own
last run plugged into the article's formula.

The words are engine/figures.py's (the names and tooltips every surface uses); the worked
example is `figures.formula_example`. The dialog is given the run to explain (`set_stats`); with
none it says to send a message first.
"""

from __future__ import annotations

from html import escape

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTextBrowser, QVBoxLayout, QWidget

from engine import RunStats
from engine.figures import (
    ACCEPTANCE_LENGTH,
    BREAK_EVEN,
    DECODE_SPEEDUP,
    DRAFT_ACCEPTANCE,
    PER_TOKEN_ACCEPTANCE,
    PREDICTED_SPEEDUP,
    STEP,
    TIME_TO_FIRST_TOKEN,
    Figure,
    formula_example,
)

TITLE = "What the numbers mean"
NO_RUN = "Send a message first: this page then works through the formula with your own reply's numbers."
NO_DRAFTS = (
    "Your last reply drafted nothing (plain decoding, or automatic k chose not to draft), so there is "
    "no acceptance to plug in: send a message with a drafter that drafts."
)

_INTRO = (
    "Speculative decoding makes a small, fast <i>drafter</i> guess the next few tokens, then lets the "
    "big <i>target</i> model check all the guesses in one pass. The reply is exactly what the target "
    "alone would write; it only comes sooner when enough guesses are right."
)
_COUNTS = (
    "<b>Drafted</b>: tokens the drafter proposed. <b>Accepted</b>: drafted tokens the target agreed "
    "with and kept. <b>Tested</b>: drafted tokens the target really judged. Drafts are checked in "
    "order, and after the first rejection the rest are thrown away unseen, so a draft is tested only "
    "when every draft before it was accepted: accepted &le; tested &le; drafted. Each step adds its "
    "accepted drafts and then exactly one token of its own, so tokens = steps + accepted."
)
_FORMULA = (
    "If every tested draft is accepted with the same chance a, a step that drafts k tokens gives on "
    "average<p style='margin-left:2em'><b>E[tokens per step] = (1 &minus; a<sup>k+1</sup>) / (1 &minus; a)"
    "</b></p>tokens: 1 when a = 0, k + 1 when a = 1. A step costs more than a plain forward: drafting k "
    "tokens and verifying k + 1. Call that extra cost c, in plain target forwards. Then"
    "<p style='margin-left:2em'><b>predicted speedup = (1 &minus; a<sup>k+1</sup>) / ((1 &minus; a)(1 + c))"
    "</b></p>"
)


def _figure(figure: Figure, extra: str = "") -> str:
    return f"<p><b>{escape(figure.name[0].upper() + figure.name[1:])}</b>: {escape(figure.tip)}{extra}</p>"


def worked_example(stats: RunStats | None) -> str:
    """The section on the user's last run (HTML): its counts, then the formula with its numbers."""
    if stats is None or not stats.steps:
        return f"<p>{escape(NO_RUN)}</p>"
    example = formula_example(stats)
    if example is None:
        return f"<p>{escape(NO_DRAFTS)}</p>"
    s, e = stats, example
    k1 = e.k + 1
    lines = [
        f"Your last reply: {s.tokens} tokens in {s.steps} steps; {s.drafted} drafted, {s.tested} tested, "
        f"{s.accepted} accepted.",
        f"{escape(DRAFT_ACCEPTANCE.name[0].upper() + DRAFT_ACCEPTANCE.name[1:])}: {s.accepted} / {s.drafted}, "
        f"{s.draft_acceptance_rate:.0%} of drafted tokens accepted.",
        f"{escape(ACCEPTANCE_LENGTH.name[0].upper() + ACCEPTANCE_LENGTH.name[1:])}: {s.tokens} / {s.steps} = "
        f"{s.mean_acceptance_length:.2f} tokens per step.",
        f"Per-token acceptance a = {s.accepted} / {s.tested} = {e.a:.3f}; it drafted k = {e.k} tokens per step "
        f"on average.",
        f"E[tokens per step] = (1 &minus; {e.a:.3f}<sup>{k1}</sup>) / (1 &minus; {e.a:.3f}) = {e.expected:.2f}. "
        f"(The reply really gained {s.mean_acceptance_length:.2f}: the formula assumes the same a at every "
        f"draft position and k drafts at every step.)",
        f"The measured cost: verifying {k1} tokens took {s.verify_cost_ratio:.2f} plain forwards and drafting "
        f"one token {s.draft_cost_ratio:.2f}, so 1 + c = {s.verify_cost_ratio:.2f} + {e.k} &times; "
        f"{s.draft_cost_ratio:.2f} = {1 + e.c:.2f}.",
        f"Predicted speedup = {e.expected:.2f} / {1 + e.c:.2f} = <b>{e.speedup:.2f}x</b>. (The engine's own "
        f"prediction, {s.predicted_speedup:.2f}x, weighs each step's own draft length and the drafting time "
        "as timed.)",
        (
            f"Break-even: with these costs drafting {e.k} tokens pays once a is above {e.break_even:.2f}; this "
            f"run's a was {e.a:.2f}, so it was {'above' if e.a > e.break_even else 'below'} it."
            if e.break_even is not None
            else f"Break-even: with these costs no acceptance makes drafting {e.k} tokens pay (even a = 1 gives "
            f"{k1} tokens for a step that costs {1 + e.c:.2f} forwards)."
        ),
    ]
    return "".join(f"<p>{line}</p>" for line in lines)


def numbers_help_html(stats: RunStats | None) -> str:
    """The whole page: the words, then the user's run worked through."""
    return "".join(
        [
            f"<p>{_INTRO}</p>",
            _figure(STEP),
            f"<p>{_COUNTS}</p>",
            _figure(DRAFT_ACCEPTANCE, " Shown as &ldquo;88% of drafted tokens accepted&rdquo;."),
            _figure(ACCEPTANCE_LENGTH),
            _figure(
                PER_TOKEN_ACCEPTANCE,
                " It is higher than the draft acceptance: the drafts thrown away unseen "
                "after a rejection count as drafted but not as tested.",
            ),
            "<h3>The article's formula</h3>",
            f"<p>{_FORMULA}</p>",
            _figure(PREDICTED_SPEEDUP),
            _figure(BREAK_EVEN),
            "<h3>Measured against vanilla decoding</h3>",
            _figure(DECODE_SPEEDUP),
            _figure(TIME_TO_FIRST_TOKEN),
            "<h3>Your last run</h3>",
            worked_example(stats),
        ]
    )


class NumbersHelpDialog(QDialog):
    """The page in a window of its own, left open beside the chat; `set_stats` changes its example."""

    def __init__(self, stats: RunStats | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(TITLE)
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.browser, 1)
        layout.addWidget(buttons)
        self.resize(640, 720)
        self.set_stats(stats)

    def set_stats(self, stats: RunStats | None) -> None:
        """Work the formula through with this run (None: no run yet, the page says to send a message)."""
        self.stats = stats
        self.browser.setHtml(numbers_help_html(stats))

    def text(self) -> str:
        """What the page says, as plain text."""
        return self.browser.toPlainText()


def open_numbers_help(window: QWidget) -> NumbersHelpDialog:
    """Show the window's one "What the numbers mean" dialog, with the window's last run as its example:
    `window.last_run_stats()` where the window has that method (None otherwise)."""
    dialog = window.findChild(NumbersHelpDialog)
    if dialog is None:
        dialog = NumbersHelpDialog(parent=window)
    last_run = getattr(window, "last_run_stats", None)
    dialog.set_stats(last_run() if callable(last_run) else None)
    dialog.show()
    dialog.raise_()
    dialog.activateWindow()
    return dialog
