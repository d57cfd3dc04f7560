"""The chat follows new messages as they stream, unless the user scrolled up to read."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from app.chat.view import ChatView
from engine.core.events import Source, TokenInfo
from tests.app.conftest import STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG


def words(text: str, source: Source = Source.ACCEPTED) -> tuple[TokenInfo, ...]:
    return tuple(TokenInfo(i, f" {word}", source, 0.5, 0.6) for i, word in enumerate(text.split()))


def fill(view: ChatView, exchanges: int = 12) -> None:
    """Earlier messages, well past the bottom of the pane."""
    for number in range(exchanges):
        view.add_user_message(f"Question {number}?")
        view.begin_reply()
        view.append_tokens(words(f"Answer {number} goes on for a line or two " * 3))
        view.end_reply("stop", {"tokens": 30, "tokens_per_s": 20.0})


def newest_text_in_sight(view: ChatView) -> bool:
    transcript = view.transcript
    cursor = QTextCursor(transcript.document())
    cursor.movePosition(QTextCursor.MoveOperation.End)
    return transcript.viewport().rect().contains(transcript.cursorRect(cursor).center())


@pytest.fixture
def chat(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(520, 420)
    view.show()
    qtbot.waitExposed(view)
    fill(view)
    bar = view.transcript.verticalScrollBar()
    assert bar.maximum() > 0  # the transcript is taller than the pane
    return view


def test_a_new_message_and_its_streaming_reply_stay_in_sight(chat):
    bar = chat.transcript.verticalScrollBar()

    chat.add_user_message("And one more question, please?")
    assert bar.value() == bar.maximum() and newest_text_in_sight(chat)
    chat.begin_reply()
    for batch in range(6):
        chat.append_tokens(words(f"streaming batch {batch} " * 4))
        assert bar.value() == bar.maximum() and newest_text_in_sight(chat), f"lost sight at batch {batch}"
    chat.end_reply("stop", {"tokens": 40, "tokens_per_s": 20.0})

    assert bar.value() == bar.maximum() and newest_text_in_sight(chat)
    assert not chat.transcript.follow.button.isVisible()  # nothing to jump to


def test_after_scrolling_up_the_place_stays_and_jump_to_latest_brings_the_end_back(chat, qtbot):
    bar = chat.transcript.verticalScrollBar()
    jump = chat.transcript.follow.button
    assert not jump.isVisible()
    bar.setValue(bar.maximum() // 3)  # the user scrolls up to reread something
    place = bar.value()

    chat.add_user_message("Another question?")
    chat.begin_reply()
    chat.append_tokens(words("a reply the user is not watching yet " * 3))

    assert bar.value() == place and not newest_text_in_sight(chat)
    assert jump.isVisible() and "latest" in jump.text().lower()
    assert chat.transcript.viewport().geometry().contains(jump.geometry().center())  # over the chat

    qtbot.mouseClick(jump, Qt.MouseButton.LeftButton)

    assert bar.value() == bar.maximum() and newest_text_in_sight(chat) and not jump.isVisible()
    chat.append_tokens(words("and it follows again from here " * 3))  # following resumed
    chat.end_reply("stop", None)
    assert bar.value() == bar.maximum() and newest_text_in_sight(chat)


def test_scrolling_back_down_by_hand_follows_again(chat):
    bar = chat.transcript.verticalScrollBar()
    bar.setValue(0)
    chat.add_user_message("Question while away?")
    assert chat.transcript.follow.button.isVisible()

    bar.setValue(bar.maximum())  # the user scrolls to the end themselves
    chat.begin_reply()
    chat.append_tokens(words("now they see it stream " * 5))

    assert bar.value() == bar.maximum() and not chat.transcript.follow.button.isVisible()


def test_turning_colours_off_while_reading_higher_up_keeps_the_place(chat):
    bar = chat.transcript.verticalScrollBar()
    bar.setValue(bar.maximum() // 2)
    place = bar.value()

    chat.set_colours_enabled(False)  # the whole transcript is drawn again

    assert bar.value() == place


def test_the_real_models_reply_streams_in_sight_below_a_long_chat(qtbot, make_window):
    window = make_window()
    window.resize(900, 600)
    fill(window.chat_view, exchanges=10)  # a long chat already on screen
    bar = window.chat_view.transcript.verticalScrollBar()
    seen = []
    window.controller.sig_steps.connect(  # after the window drew the batch (it connected first)
        lambda _steps: seen.append((bar.value() == bar.maximum(), newest_text_in_sight(window.chat_view)))
    )

    send_and_wait(qtbot, window, "Say hello.")

    assert seen and all(at_end and in_sight for at_end, in_sight in seen)
    assert bar.value() == bar.maximum() and newest_text_in_sight(window.chat_view)
    assert "Say hello." in window.chat_view.transcript.toPlainText()
