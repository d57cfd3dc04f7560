"""A finished reply keeps its token colours, drawn as Markdown or not (the app's signature)."""

from __future__ import annotations

from PySide6.QtGui import QFont, QTextCursor

from app.chat.provenance import SOURCE_COLOURS
from app.chat.view import ChatView
from engine.core.events import Source, TokenInfo
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG

A, R, B, P = Source.ACCEPTED, Source.RESAMPLED, Source.BONUS, Source.PLAIN


def tokens(*pieces: tuple[str, Source]) -> tuple[TokenInfo, ...]:
    return tuple(TokenInfo(i, text, source, 0.5, 0.6) for i, (text, source) in enumerate(pieces))


def finish_reply(view: ChatView, reply: tuple[TokenInfo, ...]) -> None:
    view.add_user_message("Hi")
    view.begin_reply()
    view.append_tokens(reply)
    view.end_reply("stop", None)


def shown_format(view: ChatView, text: str):
    """The character format the user sees in the middle of the last place `text` is shown."""
    document = view.transcript.document()
    found = document.find(text, document.characterCount(), document.FindFlag.FindBackward)
    assert not found.isNull(), f"{text!r} is not shown"
    cursor = QTextCursor(document)
    cursor.setPosition((found.selectionStart() + found.selectionEnd() + 1) // 2)
    return cursor.charFormat()


def assert_tinted(view: ChatView, text: str, source: Source) -> None:
    background = shown_format(view, text).background()
    assert background.color() == SOURCE_COLOURS[source], f"{text!r} is not tinted as {source.value}"


def test_with_default_settings_a_finished_reply_keeps_its_colours(make_window):
    window = make_window(load=False)  # settings as a newcomer has them
    view = window.chat_view

    finish_reply(view, tokens(("Hello", P), (" there", A), (", my", R), (" friend", B), (".", P)))

    assert "Hello there, my friend." in view.transcript.toPlainText()
    assert_tinted(view, " there", A)
    assert_tinted(view, ", my", R)
    assert_tinted(view, " friend", B)
    assert shown_format(view, "Hello").background().style() == shown_format(view, "Hi").background().style()


def test_with_markdown_on_a_bold_token_is_drawn_bold_and_tinted(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_markdown(True)

    finish_reply(
        view,
        tokens(
            ("# Ti", P),
            ("tle\n\n", A),
            ("Some ", P),
            ("**", A),
            ("bold", A),
            ("**", A),
            (" words and", R),
            (" `co", B),
            ("de`", B),
            (".\n\n- it", P),
            ("em", A),
        ),
    )

    shown = view.transcript.toPlainText()
    assert "**" not in shown and "`" not in shown and "# " not in shown and "- item" not in shown  # Markdown
    bold = shown_format(view, "bold")
    assert bold.fontWeight() == QFont.Weight.Bold and bold.background().color() == SOURCE_COLOURS[A]
    assert shown_format(view, "Title").fontWeight() == QFont.Weight.Bold  # a heading
    assert_tinted(view, "tle", A)
    assert_tinted(view, " words and", R)
    assert_tinted(view, "code", B)
    assert_tinted(view, "em", A)
    assert shown_format(view, "Some").background().style() == shown_format(view, "Hi").background().style()


def test_a_rendered_token_still_shows_its_tooltip(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(500, 300)
    view.show()
    view.set_markdown(True)
    finish_reply(view, tokens(("Some ", P), ("**", A), ("bold", A), ("**", A), (" text", R)))

    document = view.transcript.document()
    found = document.find("bold")
    cursor = QTextCursor(document)
    cursor.setPosition(found.selectionStart() + 1)
    tooltip = view.transcript.tooltip_at(view.transcript.cursorRect(cursor).center())

    assert "accepted draft token 'bold'" in tooltip


def test_turning_colours_off_leaves_markdown_without_tints_and_on_brings_them_back(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_markdown(True)
    finish_reply(view, tokens(("Some ", P), ("**bold**", A), (" text", R)))

    view.set_colours_enabled(False)
    assert shown_format(view, "bold").background().style() == shown_format(view, "Hi").background().style()
    assert shown_format(view, "bold").fontWeight() == QFont.Weight.Bold

    view.set_colours_enabled(True)
    assert_tinted(view, "bold", A)
    assert_tinted(view, " text", R)


def test_colour_tokens_is_offered_once_in_the_window_and_its_shortcut_still_works(make_window, qtbot):
    from PySide6.QtWidgets import QCheckBox, QToolBar

    window = make_window(load=False)
    on_toolbars = [a.text().replace("&", "") for bar in window.findChildren(QToolBar) for a in bar.actions()]
    boxes = [b for b in window.findChildren(QCheckBox) if b.text() == "Colour tokens" and b.isVisible()]
    assert "Colour tokens" not in on_toolbars and len(boxes) == 1  # beside the legend, under the chat

    window.actions.colour_tokens.trigger()  # View > Colour tokens, Ctrl+Shift+C
    assert not boxes[0].isChecked() and not window.chat_view.transcript.colours_enabled()
