"""Issue 36, item 6: another pair loads, and the charts and the side by side no longer show the runs of the
pair before it under the new pair's headline; the same pair loaded again (an engine restart) keeps them."""

from __future__ import annotations

from app.chat.compare_view import EMPTY_VERDICT
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, STRICT_QT_LOG

pytestmark = STRICT_QT_LOG


def shows_a_run(window) -> bool:
    return bool(window.charts.series()["stats"])


def test_a_new_pair_starts_clean_and_the_same_pair_reloaded_keeps_its_runs(qtbot, make_window):
    window = make_window()
    controller = window.controller
    with qtbot.waitSignal(controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS):
        window.run_comparison("Copy exactly: the cat sat on the mat.")
    verdict = window.compare_view.verdict.text()
    assert shows_a_run(window) and verdict != EMPTY_VERDICT

    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        window.load_engine(controller.loaded.config)  # as after the engine process restarted
    assert shows_a_run(window) and window.compare_view.verdict.text() == verdict

    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        window.apply_pair(FAST_CONFIG.with_drafter("suffix"), window.sampling)

    assert not shows_a_run(window)
    assert window.compare_view.verdict.text() == EMPTY_VERDICT
    assert all(pane.steps == 0 for pane in window.compare_view.panes.values())
    qtbot.waitUntil(lambda: window.charts.summary.text().find("No run yet") >= 0)
