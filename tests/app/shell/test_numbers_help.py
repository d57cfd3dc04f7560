"""Help > What the numbers mean: the words for every figure, and the user's own last run worked through
the article's formula."""

from __future__ import annotations

import re

import pytest
from PySide6.QtWidgets import QMainWindow, QWidget

from app.shell.actions import create_actions
from app.shell.numbers_help import NO_DRAFTS, NO_RUN, NumbersHelpDialog
from engine.core.decode import decode_steps
from engine.core.draft_length import DraftLength
from engine.core.events import RunStats, collect
from engine.core.sampling import SamplingConfig
from engine.figures import ACCEPTANCE_LENGTH, BREAK_EVEN, DECODE_SPEEDUP, DRAFT_ACCEPTANCE, PER_TOKEN_ACCEPTANCE
from tests.factories.fake import MarkovBackend, MarkovDrafter, random_transition


def real_run(drafter: bool = True) -> RunStats:
    """A real decode on the fake Markov model, with a draft model that often disagrees."""
    backend = MarkovBackend(random_transition(8, seed=11))
    draft = MarkovDrafter(random_transition(8, seed=12)) if drafter else None
    steps = decode_steps(
        backend,
        [0, 1, 2],
        SamplingConfig(max_tokens=40),
        drafter=draft,
        draft_length=DraftLength(4) if drafter else None,
    )
    return collect(list(steps)).stats


def number(text: str, label: str) -> float:
    return float(re.search(label + r"\s*(\d+\.\d+)", text).group(1))


def test_the_page_works_the_formula_through_with_the_runs_own_numbers(qtbot):
    stats = real_run()
    assert 0 < stats.accepted < stats.tested <= stats.drafted  # a run with rejections: a says something
    dialog = NumbersHelpDialog(stats)
    qtbot.addWidget(dialog)
    text = dialog.text()

    assert (
        f"{stats.tokens} tokens in {stats.steps} steps; {stats.drafted} drafted, {stats.tested} tested, "
        f"{stats.accepted} accepted"
    ) in text
    assert f"{stats.draft_acceptance_rate:.0%} of drafted tokens accepted" in text
    assert f"{stats.tokens} / {stats.steps} = {stats.mean_acceptance_length:.2f} tokens per step" in text
    a = stats.accepted / stats.tested
    assert f"a = {stats.accepted} / {stats.tested} = {a:.3f}" in text
    k = round(stats.drafted / stats.steps)
    c = stats.verify_cost_ratio + k * stats.draft_cost_ratio - 1
    # the article's formula, written out here, against what the page computed
    assert number(text, r"\) = ") == pytest.approx((1 - a ** (k + 1)) / (1 - a), abs=0.006)
    assert number(text, "Predicted speedup = [\\d.]+ / [\\d.]+ = ") == pytest.approx(
        (1 - a ** (k + 1)) / ((1 - a) * (1 + c)), abs=0.006
    )
    assert f"The engine's own prediction, {stats.predicted_speedup:.2f}x" in text
    for figure in (DRAFT_ACCEPTANCE, ACCEPTANCE_LENGTH, PER_TOKEN_ACCEPTANCE, BREAK_EVEN, DECODE_SPEEDUP):
        assert figure.tip in text  # each figure explained in the glossary's words
    assert "Break-even: with these costs" in text


def test_without_a_run_the_page_says_to_send_a_message_and_a_plain_run_has_nothing_to_plug_in(qtbot):
    dialog = NumbersHelpDialog(None)
    qtbot.addWidget(dialog)
    assert NO_RUN in dialog.text() and "Predicted speedup =" not in dialog.text()
    dialog.set_stats(real_run(drafter=False))
    assert NO_DRAFTS in dialog.text()
    stats = real_run()
    dialog.set_stats(stats)
    assert NO_RUN not in dialog.text() and f"{stats.tokens} tokens in {stats.steps} steps" in dialog.text()


class _Window(QMainWindow):
    """A window that has had a run (what MainWindow gives through last_run_stats)."""

    def __init__(self, stats: RunStats | None) -> None:
        super().__init__()
        self.setCentralWidget(QWidget())
        self.stats = stats
        self.actions = create_actions(self, [])

    def last_run_stats(self) -> RunStats | None:
        return self.stats


def test_help_menu_opens_the_page_with_the_windows_last_run(qtbot):
    stats = real_run()
    window = _Window(stats)
    qtbot.addWidget(window)
    help_menu = next(m for m in window.menuBar().actions() if m.text() == "&Help").menu()
    assert help_menu.actions()[0] is window.actions.numbers_help
    assert window.actions.numbers_help.text() == "What the &numbers mean"

    window.actions.numbers_help.trigger()
    dialog = window.findChild(NumbersHelpDialog)
    assert dialog is not None and dialog.isVisible()
    assert f"{stats.tokens} tokens in {stats.steps} steps" in dialog.text()

    window.stats = None  # a new chat, nothing run in it: the page says so the next time it opens
    window.actions.numbers_help.trigger()
    assert window.findChildren(NumbersHelpDialog) == [dialog] and NO_RUN in dialog.text()


def test_the_main_windows_help_menu_opens_the_page(qtbot, make_window):
    window = make_window(load=False)  # nothing run yet
    window.actions.numbers_help.trigger()
    dialog = window.findChild(NumbersHelpDialog)
    assert dialog is not None and dialog.isVisible()
    assert NO_RUN in dialog.text() and PER_TOKEN_ACCEPTANCE.tip in dialog.text()
