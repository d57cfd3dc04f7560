"""The chat pane: the transcript with coloured tokens, the legend, and the composer.

The view knows nothing about the engine or the store: it shows what it is given
(by ChatSession) and asks for things through signals (`sig_send_requested`,
`sig_stop_requested`), so it can be driven by a test without a model.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from engine.events import TokenInfo
from app.conversations import Conversation
from app.provenance import Legend
from app.token_view import TokenView

USER_TITLE, ASSISTANT_TITLE = "You", "Assistant"
_FINISH_NOTES = {
    "cancelled": "stopped",
    "length": "stopped at the token limit",
    "context": "stopped: the context window is full (start a new chat)",
    "error": "failed (see the message above)",
}


def reply_note(finish_reason: str | None, stats: dict | None) -> str:
    """The grey line under a reply: how it ended and how fast it went."""
    parts = []
    if finish_reason in _FINISH_NOTES:
        parts.append(_FINISH_NOTES[finish_reason])
    elif finish_reason is None:
        parts.append("interrupted (the app closed while this reply was being written)")
    if stats and stats.get("tokens"):
        parts.append(f"{stats['tokens']} tokens at {stats.get('tokens_per_s', 0):.1f} tok/s")
        if stats.get("time_to_first_token_s"):
            parts.append(f"first token after {stats['time_to_first_token_s']:.2f} s")
        if stats.get("drafted"):
            parts.append(f"{stats.get('accepted', 0)}/{stats['drafted']} drafts accepted")
    return " · ".join(parts)


class Composer(QPlainTextEdit):
    """The message box: Enter or Ctrl+Enter sends, Shift+Enter starts a new line, Esc stops."""

    sig_submit = Signal()
    """The user asked to send what is typed."""

    sig_escape = Signal()
    """The user pressed Esc."""

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt API
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.sig_submit.emit()
                return
        if event.key() == Qt.Key.Key_Escape:
            self.sig_escape.emit()
            return
        super().keyPressEvent(event)


class ChatView(QWidget):
    """Transcript above, composer below."""

    sig_send_requested = Signal(str)
    """The user sent a message (the text, stripped)."""

    sig_stop_requested = Signal()
    """The user asked to stop the reply being written."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.transcript = TokenView()
        self.transcript.setPlaceholderText("Ask the model something. Replies appear here as they are decoded.")
        self.legend = Legend()
        self.composer = Composer()
        self.composer.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line, Esc to stop)")
        self.composer.setTabChangesFocus(True)
        lines = self.composer.fontMetrics().lineSpacing()
        self.composer.setFixedHeight(lines * 4 + 12)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)

        row = QHBoxLayout()
        row.addWidget(self.composer, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.legend)
        layout.addLayout(row)

        self._busy = False
        self._ready = False
        self.composer.sig_submit.connect(self._submit)
        self.composer.sig_escape.connect(self.sig_stop_requested)
        self.send_button.clicked.connect(self._on_button)
        self.legend.toggle.toggled.connect(self.transcript.set_colours_enabled)
        self._update_controls()

    # -- what the window tells the view ------------------------------------------------

    def show_conversation(self, conversation: Conversation | None, streaming: bool = False) -> None:
        """Draw a whole conversation; with `streaming`, its last reply is left open for more tokens."""
        self.transcript.clear_messages()
        messages = conversation.messages if conversation else []
        for number, message in enumerate(messages):
            if message.role == "user":
                self.transcript.add_message("user", USER_TITLE, text=message.content)
            elif streaming and number == len(messages) - 1:
                self.begin_reply()
                self.append_tokens(tuple(message.tokens or ()))
            else:
                note = reply_note(message.finish_reason, message.stats)
                self.transcript.add_message("assistant", ASSISTANT_TITLE, tokens=list(message.tokens or []), note=note)

    def message_sent(self, text: str) -> None:
        """The message was saved and sent: clear the composer, unless the user has typed on meanwhile."""
        if self.composer.toPlainText().strip() == text:
            self.composer.clear()

    def add_user_message(self, text: str) -> None:
        self.transcript.add_message("user", USER_TITLE, text=text)

    def begin_reply(self) -> None:
        self.transcript.begin_message("assistant", ASSISTANT_TITLE)

    def append_tokens(self, tokens: tuple[TokenInfo, ...]) -> None:
        self.transcript.append_tokens(tokens)

    def end_reply(self, finish_reason: str, stats: dict | None) -> None:
        self.transcript.end_message(reply_note(finish_reason, stats))

    def set_busy(self, busy: bool) -> None:
        """While a reply is written the button stops it instead of sending."""
        self._busy = busy
        self._update_controls()

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """Whether a model is loaded; `reason` replaces the placeholder while it is not."""
        self._ready = ready
        self.composer.setPlaceholderText(
            reason if not ready and reason else "Message (Enter to send, Shift+Enter for a new line, Esc to stop)"
        )
        # Qt repaints an empty box only when its placeholder appears or goes, not when the
        # text changes: without this the box kept saying "Loading the model…" once loaded.
        self.composer.viewport().update()
        self._update_controls()

    def set_colours_enabled(self, enabled: bool) -> None:
        self.legend.toggle.setChecked(enabled)  # the check box drives the transcript

    # -- internals -----------------------------------------------------------------------

    def _submit(self) -> None:
        text = self.composer.toPlainText().strip()
        if not text or not self._ready:
            return
        # Sending while a reply streams is allowed: the window stops it and starts the new one.
        # The text stays in the composer until it is saved (message_sent): a failed save loses nothing.
        self.sig_send_requested.emit(text)

    def _on_button(self) -> None:
        if self._busy:
            self.sig_stop_requested.emit()
        else:
            self._submit()

    def _update_controls(self) -> None:
        self.send_button.setText("Stop" if self._busy else "Send")
        self.send_button.setToolTip("Stop the reply (Esc)" if self._busy else "Send the message (Enter)")
        self.send_button.setEnabled(self._busy or self._ready)
