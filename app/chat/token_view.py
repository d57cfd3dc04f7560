"""A read-only transcript that shows each generated token coloured by where it came from.

Tokens are inserted as they stream in, each with the character format of its
source: a background tint (accepted draft token, resampled after a rejection,
bonus, plain target token) and the source as a format property, so tests and the
comparison view can read the provenance back from the document. Its tooltip, p(x),
q(x) and min(1, p/q), is made when the mouse rests on it, from the token found by
its position: tokens of one source share one format, which Qt lays out and paints
as one run (a format per token, tooltip inside, made each batch of a streaming
reply cost a third more to insert and paint).

While a reply streams it is half a document most of the time, so Markdown is
not rendered as a whole; only fenced code blocks are, because they are what
becomes unreadable in a proportional font: a line that starts with three
backticks opens or closes a block, drawn in a monospace font on a shaded block.
With `set_markdown(True)` a finished reply is drawn as Markdown (headings,
lists, tables, inline code: Qt's own Markdown reader) and each token's tint is
laid over the rendered text where its characters landed (markdown_tints); a
token that was only syntax ("**", "# ") is not drawn, so it has no tint.

The view follows the newest text unless the user has scrolled up (follow.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocumentFragment,
    QTextFormat,
    QTextLine,
)
from PySide6.QtWidgets import QTextBrowser, QToolTip, QWidget

from app.chat.follow import FollowLatest
from app.chat.markdown_tints import token_spans
from app.chat.provenance import SOURCE_COLOURS, token_tooltip
from engine import Source, TokenInfo

SOURCE_PROPERTY = QTextFormat.Property.UserProperty + 1  # Source.value of the token a character belongs to
CODE_SHADE = QColor(127, 127, 127, 38)  # works on light and dark palettes alike
FENCE = "```"


@dataclass
class _Entry:
    """One message as the view shows it: plain text (user) or tokens (replies)."""

    role: str
    title: str
    text: str = ""
    tokens: list[TokenInfo] | None = None
    note: str = ""
    spans: list[tuple[int, int]] = field(default_factory=list)  # document positions of each token
    marks: dict[int, str] = field(default_factory=dict)  # token index -> tooltip of its underline
    open: bool = True  # still streaming: end_message() not called yet
    start: int = 0  # document position where the message (its title) begins
    body: int = 0  # document position where its text begins

    @property
    def content(self) -> str:
        return "".join(t.text for t in self.tokens) if self.tokens is not None else self.text


class TokenView(QTextBrowser):
    """Messages, with replies drawn token by token."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setUndoRedoEnabled(False)
        self.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.TextSelectableByKeyboard
        )
        self.viewport().installEventFilter(self)
        self.follow = FollowLatest(self)  # at the newest text unless the user scrolled up
        self._entries: list[_Entry] = []
        self._colours = True
        self._markdown = False  # finished replies drawn as Markdown instead of token by token
        self._code_font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self._in_code = False  # inside a fenced block of the message being written
        self._line = ""  # text of the current line so far, to spot a fence

    # -- what is shown ---------------------------------------------------------------

    def clear_messages(self) -> None:
        self._entries.clear()
        self.clear()

    def add_message(
        self, role: str, title: str, text: str = "", tokens: list[TokenInfo] | None = None, note: str = ""
    ) -> None:
        """Append a whole message: a user's text, or a reply's tokens (replayed from storage)."""
        self.begin_message(role, title, streaming=tokens is not None)
        if tokens is not None:
            self.append_tokens(tokens)
        else:
            self._entries[-1].text = text
            self._write(text, self._plain_format())
        self.end_message(note)

    def begin_message(self, role: str, title: str, streaming: bool = True) -> None:
        """Start a message under a bold title ("" for none, e.g. in a pane that has its own)."""
        entry = _Entry(role, title, tokens=[] if streaming else None, start=self._end_cursor().position())
        self._entries.append(entry)
        self._write_header(title, first=len(self._entries) == 1)
        entry.body = self._end_cursor().position()

    def append_tokens(self, tokens: list[TokenInfo] | tuple[TokenInfo, ...]) -> None:
        entry = self._entries[-1]
        # One edit block: the document lays the paragraph out once for the batch, not per token.
        # One cursor, which stays at the end as it writes, and one format per source: this runs
        # on the GUI thread while the engine decodes on the same cores.
        cursor = self._end_cursor()
        formats: dict[Source, QTextCharFormat] = {}
        cursor.beginEditBlock()
        try:
            for info in tokens:
                char_format = formats.get(info.source)
                if char_format is None:
                    char_format = formats[info.source] = self._token_format(info)
                start = cursor.position()
                self._write(info.text, char_format, cursor)
                entry.tokens.append(info)
                entry.spans.append((start, cursor.position()))
        finally:
            cursor.endEditBlock()

    def end_message(self, note: str = "") -> None:
        """Close the message; `note` (e.g. "stopped") is shown after it in small grey type."""
        entry = self._entries[-1]
        entry.note = note
        entry.open = False
        self._in_code, self._line = False, ""
        if self._markdown and entry.role == "assistant" and entry.tokens:
            self._render_markdown(entry)
        if note:
            cursor = self._end_cursor()
            cursor.insertBlock(QTextBlockFormat(), self._plain_format())
            notice = self._plain_format()
            notice.setForeground(self.palette().placeholderText())
            notice.setFontItalic(True)
            cursor.insertText(note, notice)

    def set_colours_enabled(self, enabled: bool) -> None:
        if enabled != self._colours:
            self._colours = enabled
            self._rerender()

    def colours_enabled(self) -> bool:
        return self._colours

    def set_markdown(self, enabled: bool) -> None:
        """Draw finished replies as Markdown (True) or token by token in their colours (False)."""
        if enabled != self._markdown:
            self._markdown = enabled
            self._rerender()

    def markdown_enabled(self) -> bool:
        return self._markdown

    def message_count(self) -> int:
        return len(self._entries)

    def message_at(self, position: int) -> int | None:
        """The index of the message that holds document `position` (None before the first)."""
        found = None
        for index, entry in enumerate(self._entries):
            if entry.start > position:
                break
            found = index
        return found

    def message(self, index: int) -> tuple[str, str, bool]:
        """(role, text as written, still streaming) of a message."""
        entry = self._entries[index]
        return entry.role, entry.content, entry.open

    def mark_token(self, message: int, index: int, tooltip: str) -> None:
        """Underline one token (e.g. where two runs first differ) with a red wave."""
        entry = self._entries[message]
        spans = entry.spans
        if not 0 <= index < len(spans):
            return
        entry.marks[index] = tooltip
        cursor = QTextCursor(self.document())
        cursor.setPosition(spans[index][0])
        cursor.setPosition(max(spans[index][1], spans[index][0] + 1), QTextCursor.MoveMode.KeepAnchor)
        mark = QTextCharFormat()
        mark.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
        mark.setUnderlineColor(QColor("#d62728"))
        mark.setToolTip(tooltip)
        cursor.mergeCharFormat(mark)

    # -- reading back (tests, tooltips) ----------------------------------------------

    def character_sources(self, message: int = -1) -> list[tuple[str, str | None]]:
        """(character, Source value or None) for each character of a message's tokens."""
        entry = self._entries[message]
        if not entry.spans:
            return []
        cursor = QTextCursor(self.document())
        out = []
        for position in range(entry.spans[0][0], entry.spans[-1][1]):
            cursor.setPosition(position + 1)  # a cursor's charFormat is that of the character before it
            char = self.document().characterAt(position)
            if char in ("\u2029", "\n"):
                continue
            out.append((char, cursor.charFormat().property(SOURCE_PROPERTY)))
        return out

    def tooltip_at(self, point: QPoint) -> str:
        """The tooltip of the character under a point in document coordinates ("" if none)."""
        hit = self.document().documentLayout().hitTest(point, Qt.HitTestAccuracy.ExactHit)
        if hit < 0:
            return ""
        # hitTest gives the nearest gap between characters; ask the line which character
        # the point is *on*, so the right half of a token's last letter is still that token.
        block = self.document().findBlock(hit)
        layout = block.layout()
        line = layout.lineForTextPosition(hit - block.position())
        if not line.isValid():
            return ""
        x = point.x() - layout.position().x()
        offset = line.xToCursor(x, QTextLine.CursorPosition.CursorOnCharacter)
        if offset >= block.length() - 1:  # past the end of the line's text
            return ""
        position = block.position() + offset
        cursor = QTextCursor(self.document())
        cursor.setPosition(position + 1)  # charFormat() is the character before the cursor
        marked = cursor.charFormat().toolTip()  # an underline's (mark_token) says more than the token's
        if marked:
            return marked
        token = self._token_at(position)
        return token_tooltip(token) if token is not None else ""

    def _token_at(self, position: int) -> TokenInfo | None:
        """The token whose characters include document `position`, None outside every token."""
        for entry in reversed(self._entries):
            spans = entry.spans
            if not spans or position < spans[0][0]:
                continue
            index = bisect.bisect_right(spans, (position, float("inf"))) - 1
            if index >= 0 and spans[index][0] <= position < spans[index][1]:
                return entry.tokens[index]
            return None
        return None

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt API
        # Show the tooltip of exactly the character under the mouse; QTextBrowser alone
        # only knows anchors' tooltips.
        if watched is self.viewport() and event.type() == QEvent.Type.ToolTip:
            point = event.pos() + QPoint(self.horizontalScrollBar().value(), self.verticalScrollBar().value())
            text = self.tooltip_at(point)
            if text:
                QToolTip.showText(event.globalPos(), text, self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().eventFilter(watched, event)

    # -- writing ---------------------------------------------------------------------

    def _rerender(self) -> None:
        following, place = self.follow.following, self.verticalScrollBar().value()
        entries, self._entries = self._entries, []
        self.clear()
        for number, entry in enumerate(entries):
            if entry.open:  # a reply still streaming: more tokens will follow
                self.begin_message(entry.role, entry.title, streaming=entry.tokens is not None)
                self.append_tokens(entry.tokens or [])
            else:
                self.add_message(entry.role, entry.title, entry.text, entry.tokens, entry.note)
            for index, tooltip in entry.marks.items():
                self.mark_token(number, index, tooltip)
        if not following:  # a user reading further up stays there
            self.follow.hold(place)

    def _render_markdown(self, entry: _Entry) -> None:
        """Replace a finished reply's tokens by its text rendered as Markdown, each token still tinted."""
        cursor = QTextCursor(self.document())
        cursor.beginEditBlock()  # one change to the layout: the scroll position is not thrown about
        try:
            cursor.setPosition(entry.body)
            cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
            cursor.setBlockFormat(QTextBlockFormat())
            cursor.setCharFormat(self._plain_format())
            cursor.insertFragment(QTextDocumentFragment.fromMarkdown(entry.content))
            self._style_code(entry.body)
            rendered = self.document().toRawText()[entry.body :]  # raw text: one character per position
            entry.spans = token_spans([t.text for t in entry.tokens], rendered, offset=entry.body)
            self._tint_rendered(entry)
        finally:
            cursor.endEditBlock()

    def _tint_rendered(self, entry: _Entry) -> None:
        """Give each token's rendered characters its source (and tint), over the Markdown's own
        formats: a **bold** token stays bold. Neighbours from one source are merged as one run."""
        cursor = QTextCursor(self.document())
        runs: list[tuple[int, int, TokenInfo]] = []
        for (start, end), info in zip(entry.spans, entry.tokens):
            if start == end:
                continue  # only syntax ("**", "# "): nothing of it is drawn
            if runs and runs[-1][1] == start and runs[-1][2].source is info.source:
                runs[-1] = (runs[-1][0], end, runs[-1][2])
            else:
                runs.append((start, end, info))
        formats: dict[Source, QTextCharFormat] = {}
        for start, end, info in runs:
            tint = formats.get(info.source)
            if tint is None:
                tint = formats[info.source] = self._token_format(info)
            cursor.setPosition(start)
            cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(tint)

    def _style_code(self, start: int) -> None:
        """Code as in a streaming reply: fenced blocks shaded, code (inline too) in the monospace font."""
        mono = QTextCharFormat()
        mono.setFontFamilies([self._code_font.family()])
        mono.setFontFixedPitch(True)
        block = self.document().findBlock(start)
        while block.isValid():
            cursor = QTextCursor(block)
            if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
                cursor.mergeBlockFormat(self._block_format(True))
            fenced = block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)
            code = [
                (f.position(), f.length())
                for f in (i.fragment() for i in block)
                if fenced or f.charFormat().fontFixedPitch()
            ]
            for position, length in code:  # collected first: formatting splits and merges fragments
                cursor.setPosition(position)
                cursor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
                cursor.mergeCharFormat(mono)
            block = block.next()

    def _write_header(self, title: str, first: bool) -> None:
        self._in_code, self._line = False, ""
        cursor = self._end_cursor()
        if not title:
            if not first:
                cursor.insertBlock(QTextBlockFormat(), self._plain_format())
            return
        block = QTextBlockFormat()
        block.setTopMargin(0 if first else 14)
        block.setBottomMargin(2)
        header = QTextCharFormat()
        header.setFontWeight(QFont.Weight.Bold)
        header.setForeground(self.palette().link())
        if first:
            cursor.setBlockFormat(block)
        else:
            cursor.insertBlock(block)
        cursor.insertText(title, header)
        cursor.insertBlock(QTextBlockFormat(), self._plain_format())

    def _write(self, text: str, char_format: QTextCharFormat, cursor: QTextCursor | None = None) -> None:
        """Insert text at the end (`cursor`: one already there, left after the text), spotting code
        fences at line starts."""
        cursor = self._end_cursor() if cursor is None else cursor
        lines = text.replace("\r\n", "\n").split("\n")
        for number, piece in enumerate(lines):
            if number > 0:  # a newline ends the current line
                if self._line.lstrip().startswith(FENCE):
                    self._in_code = not self._in_code
                self._line = ""
                cursor.insertBlock(self._block_format(self._in_code), char_format)
            if not piece:
                continue
            was_fence = self._line.lstrip().startswith(FENCE)
            self._line += piece
            code = self._in_code or self._line.lstrip().startswith(FENCE)
            cursor.insertText(piece, self._with_code_font(char_format) if code else char_format)
            if code and not was_fence and not self._in_code:
                self._restyle_block_as_code(cursor)

    def _restyle_block_as_code(self, cursor: QTextCursor) -> None:
        """The current line just turned out to be a fence: draw what is already there as code."""
        line = QTextCursor(cursor.block())
        line.setBlockFormat(self._block_format(True))
        line.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
        font = QTextCharFormat()
        font.setFont(self._code_font, QTextCharFormat.FontPropertiesInheritanceBehavior.FontPropertiesSpecifiedOnly)
        line.mergeCharFormat(font)  # merging keeps each token's tint and tooltip

    def _block_format(self, code: bool) -> QTextBlockFormat:
        block = QTextBlockFormat()
        if code:
            block.setBackground(CODE_SHADE)
            block.setLeftMargin(8)
            block.setRightMargin(8)
        return block

    def _plain_format(self) -> QTextCharFormat:
        # No explicit colour: the text follows the palette (light or dark theme).
        return QTextCharFormat()

    def _with_code_font(self, char_format: QTextCharFormat) -> QTextCharFormat:
        code = QTextCharFormat(char_format)
        code.setFont(self._code_font, QTextCharFormat.FontPropertiesInheritanceBehavior.FontPropertiesSpecifiedOnly)
        return code

    def _token_format(self, info: TokenInfo) -> QTextCharFormat:
        char_format = self._plain_format()
        char_format.setProperty(SOURCE_PROPERTY, info.source.value)
        colour = SOURCE_COLOURS.get(info.source)
        if self._colours and colour is not None:
            char_format.setBackground(colour)
        return char_format

    def _end_cursor(self) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor
