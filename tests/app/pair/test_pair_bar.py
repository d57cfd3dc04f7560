"""The pair bar above the chat (app/pair/pair_bar.py): target, drafter, draft model and k, loaded on change,
in a real window on the embedded model."""

from __future__ import annotations

import itertools

import pytest
from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import QLabel, QToolBar, QToolButton

from app.shell import settings as keys
from engine import EngineConfig, Preflight
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG
CHECK_TIMEOUT_MS = 60_000


def choose(combo, data) -> None:
    """Pick the item of `data` in a combo box, as a click on it does."""
    index = combo.findData(data)
    assert index >= 0, data
    combo.setCurrentIndex(index)


def test_changing_the_drafter_or_k_in_the_bar_loads_the_new_pair(qtbot, make_window):
    window = make_window()
    bar, controller = window.pair_bar, window.controller
    qtbot.waitUntil(bar.fields_enabled)  # once the first load's job has ended
    assert bar.drafter.currentData() == "ngram" and bar.k.value() == "4"
    enabled_while_loading = []
    controller.sig_load_started.connect(lambda _config: enabled_while_loading.append(bar.fields_enabled()))

    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        choose(bar.drafter, "suffix")

    assert controller.loaded.config == FAST_CONFIG.with_drafter("suffix") == keys.engine_config()
    qtbot.waitUntil(bar.fields_enabled)  # once the load's job has ended
    assert bar.message() == "" and enabled_while_loading == [False]

    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        bar.k.lineEdit().selectAll()
        qtbot.keyClicks(bar.k.lineEdit(), "6")
        qtbot.keyClick(bar.k.lineEdit(), Qt.Key.Key_Return)

    assert controller.loaded.config.k == 6 and controller.loaded.config.drafter == "suffix"
    qtbot.waitUntil(bar.fields_enabled)


def test_an_impossible_pair_shows_the_reason_and_loads_nothing(qtbot, make_window):
    window = make_window()
    bar, controller = window.pair_bar, window.controller
    qtbot.waitUntil(bar.fields_enabled)  # once the first load's job has ended
    loads = []
    controller.sig_load_started.connect(loads.append)

    with qtbot.waitSignal(bar.sig_checked, timeout=CHECK_TIMEOUT_MS) as checked:
        choose(bar.drafter, "eagle3")  # no EAGLE-3 head ships for the embedded model

    assert checked.args == [False]
    assert bar.message().startswith("Not loaded: No EAGLE-3 head ships for") and bar.reason.isVisible()
    assert "Train one" in bar.reason.toolTip()  # the check's advice, in full
    assert loads == [] and controller.loaded.config == FAST_CONFIG
    bar.more.click()  # the dialog, on the refused choice: its findings say all of why
    assert window.pair_dialog.engine_config().drafter == "eagle3"
    window.pair_dialog.reject()

    # The draft model's box shows only for a drafter that loads one; none chosen is the check's reason too.
    assert not bar.draft.isVisible()
    with qtbot.waitSignal(bar.sig_checked, timeout=CHECK_TIMEOUT_MS) as checked:
        choose(bar.drafter, "model")
    assert checked.args == [False] and bar.draft.isVisible()
    assert bar.message() == "Not loaded: No draft model chosen" and loads == []

    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        choose(bar.draft, "default")  # the embedded model drafts for itself

    assert controller.loaded.config == FAST_CONFIG.with_drafter("model", draft="default")
    assert bar.message() == ""


def test_the_bar_follows_a_pair_loaded_by_the_dialog_and_waits_while_a_reply_runs(qtbot, make_window):
    window = make_window()
    bar, controller = window.pair_bar, window.controller
    bar.more.click()
    dialog = window.pair_dialog
    assert dialog is not None and dialog.isVisible()
    dialog.set_config(FAST_CONFIG.with_drafter("lookahead"))
    with qtbot.waitSignal(dialog.sig_check_finished, timeout=CHECK_TIMEOUT_MS):
        dialog.check()

    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        dialog.accept()
    qtbot.waitUntil(bar.fields_enabled)

    assert controller.loaded.config.drafter == "lookahead"
    assert bar.drafter.currentData() == "lookahead" and bar.config() == controller.loaded.config
    assert bar.message() == ""

    enabled_while_replying = []
    controller.sig_run_started.connect(lambda _kind: enabled_while_replying.append(bar.fields_enabled()))
    send_and_wait(qtbot, window, "Say hello.")
    assert enabled_while_replying == [False]
    qtbot.waitUntil(bar.fields_enabled)  # once the reply's job has ended


LONG_TARGET = "/models/Qwen2.5-Coder-32B-Instruct-abliterated-GGUF/Qwen2.5-Coder-32B-Instruct-abliterated.Q4_K_M.gguf"
LONG_DRAFT = "/models/Qwen2.5-Coder-0.5B-Instruct-GGUF/Qwen2.5-Coder-0.5B-Instruct.Q8_0.gguf"


@pytest.mark.parametrize("size", [(1440, 900), (1280, 720)])
def test_the_whole_bar_is_readable_in_the_window(qtbot, make_window, size):
    """Its widest state: long model names, a draft model, and a reason beside them."""
    window = make_window(load=False)
    window.resize(*size)
    bar = window.pair_bar
    bar.set_config(EngineConfig(target=LONG_TARGET, k=4).with_drafter("model", draft=LONG_DRAFT))
    with qtbot.waitSignal(bar.sig_checked, timeout=CHECK_TIMEOUT_MS) as checked:
        choose(bar.drafter, "suffix+model")  # the models are not on this machine: the check says so
    assert checked.args == [False]
    # Laid out again for the reason's room (a layout request waits for the event loop).
    qtbot.waitUntil(lambda: window.width() == size[0] and bar.reason.width() >= bar.reason.minimumWidth() > 0)

    for toolbar in window.findChildren(QToolBar):  # nothing pushed into a toolbar's » menu
        assert not toolbar.findChild(QToolButton, "qt_toolbar_ext_button").isVisible(), toolbar.objectName()
    shown = [
        w
        for w in (
            bar.target_label,
            bar.target,
            bar.drafter_label,
            bar.drafter,
            bar.draft_label,
            bar.draft,
            bar.k_label,
            bar.k,
            bar.more,
            bar.reason,
        )
        if w.isVisible()
    ]
    assert len(shown) == 10
    on_window = QRect(bar.mapTo(window, bar.rect().topLeft()), bar.size())
    assert window.rect().contains(on_window)
    for widget in shown:
        assert bar.rect().contains(widget.geometry()), widget
        assert widget.width() >= widget.minimumSizeHint().width(), widget
    for first, second in itertools.combinations(shown, 2):
        assert not first.geometry().intersects(second.geometry()), (first, second)
    for label in (bar.target_label, bar.drafter_label, bar.draft_label, bar.k_label, bar.more):
        assert label.width() >= label.sizeHint().width(), label.text()
    for combo, path in ((bar.target, LONG_TARGET), (bar.draft, LONG_DRAFT)):
        text = combo.shown_text()
        assert "…" in text and text.startswith("Qwen2") and combo.toolTip() == path
        assert combo.fontMetrics().horizontalAdvance(text) <= combo.text_width()
    assert isinstance(bar.reason, QLabel) and bar.reason.text().startswith("Not loaded")
    assert bar.reason.width() >= bar.reason.minimumWidth() > 0


def test_on_a_server_the_fields_wait_for_the_dialog_and_more_still_opens_it(qtbot):
    from app.pair.pair_bar import PairBar

    bar = PairBar(check=lambda config: Preflight(()))
    qtbot.addWidget(bar)
    bar.show()
    more = []
    bar.sig_more_requested.connect(lambda: more.append(True))

    bar.set_remote(True)
    assert not bar.fields_enabled() and bar.more.isEnabled() and "Model pair" in bar.target.toolTip()
    bar.more.click()
    bar.set_remote(False)
    assert bar.fields_enabled() and more == [True]


def test_a_wheel_turned_over_the_bar_changes_nothing_until_a_field_is_clicked(qtbot):
    from PySide6.QtCore import QPoint, QPointF
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    from app.pair.pair_bar import PairBar

    bar = PairBar(check=lambda config: Preflight(()))
    qtbot.addWidget(bar)
    bar.show()
    before = bar.drafter.currentIndex()

    def wheel() -> None:
        centre = QPointF(bar.drafter.rect().center())
        event = QWheelEvent(
            centre,
            QPointF(bar.drafter.mapToGlobal(centre.toPoint())),
            QPoint(0, 0),
            QPoint(0, -120),
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
            Qt.ScrollPhase.NoScrollPhase,
            False,
        )
        QApplication.sendEvent(bar.drafter, event)

    wheel()
    assert bar.drafter.currentIndex() == before and bar.config().drafter == "ngram"
    bar.drafter.setFocus()
    qtbot.waitUntil(bar.drafter.hasFocus)
    wheel()
    assert bar.drafter.currentIndex() == before + 1
