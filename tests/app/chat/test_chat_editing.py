"""Chat conventions: a system prompt, regenerate, edit and resend, copy, replies drawn as Markdown."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QTextTable

from app.chat.conversations import ConversationStore
from app.chat.view import ChatView
from engine.core.events import Source, TokenInfo
from tests.app.conftest import REPLY_TIMEOUT_MS, STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG

MARKDOWN_REPLY = "# Plan\n\nSome **bold** words and `code`.\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"


def reply_tokens(text: str) -> tuple[TokenInfo, ...]:
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    return tuple(
        TokenInfo(i, piece, Source.ACCEPTED if i % 2 else Source.PLAIN, 0.5, 0.6) for i, piece in enumerate(pieces)
    )


def show_reply(view: ChatView, text: str) -> None:
    view.add_user_message("Make a plan")
    view.begin_reply()
    view.append_tokens(reply_tokens(text))
    view.end_reply("stop", None)


def saved(data_dir, window):
    return ConversationStore(data_dir).load(window.chats.conversation.id)


def test_finished_replies_are_drawn_as_markdown_and_the_toggle_brings_the_colours_back(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_markdown(True)
    show_reply(view, MARKDOWN_REPLY)

    shown = view.transcript.toPlainText()
    assert "Plan" in shown and "# Plan" not in shown and "**" not in shown and "|---|" not in shown
    tables = [f for f in view.transcript.document().rootFrame().childFrames() if isinstance(f, QTextTable)]
    assert len(tables) == 1 and (tables[0].rows(), tables[0].columns()) == (2, 2)
    # The rendered text keeps its tokens' provenance (tests/app/chat/test_colours_kept.py: and tints).
    assert {"plain", "accepted"} <= {source for _, source in view.transcript.character_sources(-1)}

    view.set_markdown(False)

    assert "# Plan" in view.transcript.toPlainText()
    assert {source for _, source in view.transcript.character_sources(-1)} == {"plain", "accepted"}


def test_a_reply_stays_in_colour_while_it_streams(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_markdown(True)
    view.add_user_message("Make a plan")
    view.begin_reply()
    view.append_tokens(reply_tokens("# Plan\n\n- one"))

    assert "# Plan" in view.transcript.toPlainText()
    assert {source for _, source in view.transcript.character_sources(-1)} == {"plain", "accepted"}


def test_copy_gives_the_markdown_the_model_wrote(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_markdown(True)
    show_reply(view, MARKDOWN_REPLY)

    view.copy_message(1)

    assert QGuiApplication.clipboard().text() == MARKDOWN_REPLY


def test_the_context_menu_offers_what_each_message_allows(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_ready(True)
    show_reply(view, "Hello")

    assert [a.text() for a in view.message_menu(0).actions()] == ["Copy", "Edit and resend…"]
    assert [a.text() for a in view.message_menu(1).actions()] == ["Copy as Markdown", "Regenerate"]


def test_the_system_prompt_is_sent_first_and_new_chats_start_with_the_default(make_window, qtbot, data_dir):
    window = make_window()
    sent = []
    client = window.controller.client  # a plain object: no Qt wrapper in the cycle this lambda makes
    generate = client.generate
    client.generate = lambda messages, *args, **kwargs: (sent.append(messages), generate(messages, *args, **kwargs))[1]

    window.set_system_prompt("Answer in one short sentence.", as_default=True)
    send_and_wait(qtbot, window, "What is the sky's colour?")

    assert sent[0][0] == {"role": "system", "content": "Answer in one short sentence."}
    assert saved(data_dir, window).system_prompt == "Answer in one short sentence."
    assert "Answer in one short sentence." in window.chat_view.system_prompt.text()
    window.new_chat()
    assert "Answer in one short sentence." in window.chat_view.system_prompt.text()
    window.set_system_prompt("")  # this chat only: the default stays
    assert window.chat_view.system_prompt.text() == "No system prompt"
    window.new_chat()
    assert "Answer in one short sentence." in window.chat_view.system_prompt.text()


def test_regenerate_replaces_the_last_reply(make_window, qtbot, data_dir):
    window = make_window()
    first = send_and_wait(qtbot, window, "Name a colour.")

    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        window.actions.regenerate.trigger()

    again = finished.args[1]
    assert again.text == first.text  # greedy: the same reply, written anew
    assert [m.role for m in window.chats.conversation.messages] == ["user", "assistant"]
    assert [m.role for m in saved(data_dir, window).messages] == ["user", "assistant"]
    assert window.chat_view.transcript.message_count() == 2


def test_edit_and_resend_replaces_the_message_and_what_followed(make_window, qtbot, data_dir):
    window = make_window()
    send_and_wait(qtbot, window, "Name a fruit.")
    send_and_wait(qtbot, window, "Name another one.")

    window.chat_view.start_edit(2)
    assert window.chat_view.composer.toPlainText() == "Name another one."
    assert window.chat_view.editing.isVisible()
    window.chat_view.composer.setPlainText("Name a vegetable.")
    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS):
        qtbot.keyClick(window.chat_view.composer, Qt.Key.Key_Return)

    contents = [m.content for m in saved(data_dir, window).messages]
    assert len(contents) == 4 and contents[2] == "Name a vegetable."
    assert "Name another one." not in window.chat_view.transcript.toPlainText()
    assert window.chat_view.composer.toPlainText() == "" and not window.chat_view.editing.isVisible()
