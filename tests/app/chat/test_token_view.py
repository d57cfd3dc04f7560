"""The token view: colours by provenance, tooltips with p, q and min(1, p/q), readable code blocks."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase, QTextCharFormat, QTextCursor

from app.chat.provenance import SOURCE_COLOURS
from app.chat.token_view import TokenView
from engine.core.events import Source, TokenInfo
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG

A, R, B, P = Source.ACCEPTED, Source.RESAMPLED, Source.BONUS, Source.PLAIN
NO_BRUSH = Qt.BrushStyle.NoBrush
NO_UNDERLINE = QTextCharFormat.UnderlineStyle.NoUnderline


def info(text: str, source: Source, p: float = 0.6, q: float | None = None) -> TokenInfo:
    return TokenInfo(0, text, source, p, q)


@pytest.fixture
def view(qtbot):
    widget = TokenView()
    qtbot.addWidget(widget)
    widget.resize(600, 400)
    widget.show()
    return widget


def reply(view: TokenView, tokens: list[TokenInfo]) -> None:
    view.begin_message("assistant", "Assistant")
    view.append_tokens(tokens)
    view.end_message()


def char_format_at(view: TokenView, position: int):
    cursor = QTextCursor(view.document())
    cursor.setPosition(position + 1)
    return cursor.charFormat()


def test_each_character_carries_its_tokens_source_and_tint(view):
    tokens = [info("The", P), (info(" cat", A, q=0.9)), info(" sat", R), info(" down", B)]
    reply(view, tokens)

    expected = [(c, t.source.value) for t in tokens for c in t.text]
    assert view.character_sources() == expected
    for (start, _end), token in zip(view._entries[-1].spans, tokens):
        background = char_format_at(view, start).background()
        colour = SOURCE_COLOURS[token.source]
        assert (background.color() == colour) if colour is not None else background.style() == NO_BRUSH


def test_turning_colours_off_keeps_text_and_provenance_but_drops_tints(view):
    reply(view, [info("Hel", A, q=1.0), info("lo", R)])
    text_before = view.toPlainText()

    view.set_colours_enabled(False)

    assert view.toPlainText() == text_before
    assert [s for _, s in view.character_sources()] == ["accepted"] * 3 + ["resampled"] * 2
    assert all(char_format_at(view, p).background().style() == NO_BRUSH for p in range(*view._entries[-1].spans[0]))


def test_tooltip_gives_p_q_and_acceptance_where_defined(view):
    reply(view, [info("plain", P, p=0.25), info(" drafted", A, p=0.3, q=0.6), info(" ngram", A, p=0.7, q=None)])
    spans = view._entries[-1].spans

    def tooltip(index: int) -> str:
        cursor = QTextCursor(view.document())
        cursor.setPosition(spans[index][0] + 1)
        return view.tooltip_at(view.cursorRect(cursor).center())

    assert "p(x) = 0.2500" in tooltip(0) and "q(x)" not in tooltip(0) and "min(1" not in tooltip(0)
    assert "p(x) = 0.3000" in tooltip(1) and "q(x) = 0.6000" in tooltip(1) and "min(1, p/q) = 0.5000" in tooltip(1)
    assert "without probabilities" in tooltip(2) and "min(1" not in tooltip(2)


def test_tokens_of_one_source_share_a_format_and_each_keeps_its_own_tooltip(view):
    reply(view, [info("First", P, p=0.9)])
    reply(view, [info("Second", P, p=0.11), info(" reply", P, p=0.22), info(" here", A, p=0.33, q=0.5)])
    spans = view._entries[-1].spans

    def tooltip_at_position(position: int) -> str:
        cursor = QTextCursor(view.document())
        cursor.setPosition(position + 1)
        return view.tooltip_at(view.cursorRect(cursor).center())

    # Neighbours from one source are one run of text to Qt, and still two tokens to the user.
    assert char_format_at(view, spans[0][0] + 1) == char_format_at(view, spans[1][0] + 1)
    assert "'Second'" in tooltip_at_position(spans[0][0]) and "p(x) = 0.1100" in tooltip_at_position(spans[0][1] - 1)
    assert "' reply'" in tooltip_at_position(spans[1][0] + 1) and "p(x) = 0.2200" in tooltip_at_position(
        spans[1][0] + 1
    )
    assert "q(x) = 0.5000" in tooltip_at_position(spans[2][0] + 1)
    assert "p(x) = 0.9000" in tooltip_at_position(view._entries[0].spans[0][0] + 1)  # the first reply's own


def test_fenced_code_is_monospaced_on_a_shaded_block_even_when_fences_arrive_in_pieces(view):
    pieces = ["Here:\n", "``", "`py", "thon\n", "x = 1", "\n``", "`\n", "Done."]
    reply(view, [info(p, P) for p in pieces])
    document = view.document()
    fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()

    blocks = {}
    block = document.begin()
    while block.isValid():
        blocks[block.text()] = block
        block = block.next()
    for code_line in ("```python", "x = 1", "```"):
        assert blocks[code_line].blockFormat().background().style() != NO_BRUSH, code_line
        assert char_format_at(view, blocks[code_line].position()).font().family() == fixed
    for prose in ("Here:", "Done."):
        assert blocks[prose].blockFormat().background().style() == NO_BRUSH
        assert char_format_at(view, blocks[prose].position()).font().family() != fixed


def test_mark_token_underlines_exactly_that_token(view):
    reply(view, [info("a", P), info("b", P), info("c", P)])

    view.mark_token(0, 1, "first difference")

    marked = [char_format_at(view, p).underlineStyle() != NO_UNDERLINE for p in range(*view._entries[0].spans[0])]
    assert marked == [False]
    start, end = view._entries[0].spans[1]
    assert char_format_at(view, start).toolTip() == "first difference"


def test_hovering_a_token_shows_its_tooltip(qtbot, view):
    from PySide6.QtCore import QEvent, QPoint
    from PySide6.QtGui import QHelpEvent
    from PySide6.QtWidgets import QApplication, QToolTip

    reply(view, [info("Hello", A, p=0.4, q=0.8)])
    cursor = QTextCursor(view.document())
    cursor.setPosition(view._entries[0].spans[0][0] + 2)
    point = view.cursorRect(cursor).center()

    QApplication.sendEvent(view.viewport(), QHelpEvent(QEvent.Type.ToolTip, point, view.viewport().mapToGlobal(point)))

    qtbot.waitUntil(QToolTip.isVisible)
    assert "min(1, p/q) = 0.5000" in QToolTip.text()
    empty = QPoint(view.viewport().width() - 5, view.viewport().height() - 5)  # below the text
    QApplication.sendEvent(view.viewport(), QHelpEvent(QEvent.Type.ToolTip, empty, view.viewport().mapToGlobal(empty)))
    qtbot.waitUntil(lambda: not QToolTip.isVisible())


def test_tooltips_follow_token_boundaries_exactly(view):
    reply(view, [info("ab", A, p=0.1, q=0.2), info("cd", R, p=0.9)])
    first, second = view._entries[0].spans

    def tooltip_over(position: int) -> str:  # the middle of the character at `position`
        cursor = QTextCursor(view.document())
        cursor.setPosition(position)
        left = view.cursorRect(cursor)
        cursor.setPosition(position + 1)
        right = view.cursorRect(cursor)
        return view.tooltip_at((left.center() + right.center()) / 2)

    assert "accepted" in tooltip_over(first[1] - 1)  # 'b', the last letter of the first token
    assert "resampled" in tooltip_over(second[0])  # 'c', the first letter of the next one


def test_turning_colours_off_mid_reply_keeps_streaming_into_the_same_reply(view):
    view.begin_message("assistant", "Assistant")
    view.append_tokens([info("```py\n", P), info("x = 1", A, q=1.0)])
    view.mark_token(0, 1, "marked")

    view.set_colours_enabled(False)
    view.append_tokens([info("\ny = 2", A, q=1.0)])
    view.end_message("done")

    fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
    last = view._entries[0].spans[-1]
    assert char_format_at(view, last[1] - 1).font().family() == fixed  # still inside the code block
    assert char_format_at(view, view._entries[0].spans[1][0]).toolTip() == "marked"  # the mark survived
    assert view.toPlainText().endswith("y = 2\u2029done") or view.toPlainText().endswith("y = 2\ndone")
