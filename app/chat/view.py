"""The chat pane: the transcript with coloured tokens, the legend, and the composer.

The view knows nothing about the engine or the store: it shows what it is given
(by ChatSession) and asks for things through signals (`sig_send_requested`,
`sig_stop_requested`, `sig_regenerate_requested`, `sig_edit_submitted`,
`sig_system_prompt_edited`), so it can be driven by a test without a model.

A message's context menu copies it (as the Markdown the model wrote), edits and
resends a user's message (the composer takes its text, and Send replaces it and
everything after it) or regenerates the last reply.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint, Qt, Signal
from PySide6.QtGui import QGuiApplication, QKeyEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from app.chat.conversations import Conversation
from app.chat.provenance import Legend
from app.chat.token_view import TokenView
from engine import RunStats, TokenInfo
from engine.figures import ACCEPTANCE_LENGTH, DRAFT_ACCEPTANCE, TIME_TO_FIRST_TOKEN, summary, tips

USER_TITLE, ASSISTANT_TITLE = "You", "Assistant"
_FINISH_NOTES = {
    "cancelled": "stopped",
    "length": "stopped at the token limit",
    "context": "stopped: the context window is full (start a new chat)",
    "error": "failed (see the message above)",
    "interrupted": "interrupted: the engine process stopped (see the message above)",
}


# The footer's tooltip: what its figures are (engine/figures.py), and where to read more.
FOOTER_TIP = tips(DRAFT_ACCEPTANCE, ACCEPTANCE_LENGTH, TIME_TO_FIRST_TOKEN) + (
    "\n\nHelp > What the numbers mean explains them with this run's numbers."
)


def reply_note(finish_reason: str | None, stats: dict | None) -> str:
    """The grey line under a reply: how it ended, the run's leading figures, and how fast it went."""
    parts = []
    if finish_reason in _FINISH_NOTES:
        parts.append(_FINISH_NOTES[finish_reason])
    elif finish_reason is None:
        parts.append("interrupted (the app closed while this reply was being written)")
    if stats and stats.get("tokens"):
        if stats.get("drafted"):  # a vanilla reply has no draft figures to lead with
            run = RunStats(**{key: int(stats.get(key, 0)) for key in ("steps", "tokens", "drafted", "accepted")})
            parts.append(summary(run))
        parts.append(f"{stats['tokens']} tokens at {stats.get('tokens_per_s', 0):.1f} tok/s")
        if stats.get("time_to_first_token_s"):
            parts.append(f"{TIME_TO_FIRST_TOKEN.name} {stats['time_to_first_token_s']:.2f} s")
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

    sig_regenerate_requested = Signal()
    """The user asked for the last reply to be written again."""

    sig_edit_submitted = Signal(int, str)
    """The user sent an edited message: its index in the conversation, the new text."""

    sig_system_prompt_edited = Signal(str, bool)
    """The user changed the system prompt: the text, and whether new chats should start with it too."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.system_prompt = QLabel()
        self.system_prompt.setTextFormat(Qt.TextFormat.PlainText)
        self.system_prompt.setWordWrap(True)
        self.system_prompt.setToolTip("Sent to the model before the first message of this chat")
        self.system_prompt_button = QPushButton("System prompt…")
        self.system_prompt_button.setFlat(True)
        self.system_prompt_button.setToolTip("Change this chat's system prompt, or the one new chats start with")
        self.system_prompt_button.clicked.connect(self.edit_system_prompt)
        self.editing = QLabel()  # "Editing a message..." above the composer while one is edited
        self.editing.hide()
        self.transcript = TokenView()
        self.transcript.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.transcript.customContextMenuRequested.connect(self._show_menu)
        self.transcript.setPlaceholderText("Ask the model something. Replies appear here as they are decoded.")
        self.transcript.viewport().installEventFilter(self)  # after TokenView's own: asked first (footer_tip_at)
        self._footers: set[str] = set()  # the footers written under replies, to explain them on hover
        self.legend = Legend()
        self.markdown = QCheckBox("Markdown")
        self.markdown.setToolTip(
            "Draw finished replies as Markdown (headings, lists, tables, code), each token "
            "still in its colour; off: the text exactly as the model wrote it"
        )
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
        top = QHBoxLayout()
        top.addWidget(self.system_prompt, 1)
        top.addWidget(self.markdown, 0)
        top.addWidget(self.system_prompt_button, 0)
        layout.addLayout(top)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.legend)
        layout.addWidget(self.editing)
        layout.addLayout(row)

        self._busy = False
        self._ready = False
        self._editing: int | None = None  # index of the message being edited, if one is
        self._system_prompt_text = ""
        self.show_system_prompt("")
        self.composer.sig_submit.connect(self._submit)
        self.composer.sig_escape.connect(self._on_escape)
        self.send_button.clicked.connect(self._on_button)
        self.legend.toggle.toggled.connect(self.transcript.set_colours_enabled)
        self.markdown.toggled.connect(self.transcript.set_markdown)
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
                note = self._footer(message.finish_reason, message.stats)
                self.transcript.add_message("assistant", ASSISTANT_TITLE, tokens=list(message.tokens or []), note=note)

    def message_sent(self, text: str) -> None:
        """The message was saved and sent: clear the composer, unless the user has typed on meanwhile."""
        if self.composer.toPlainText().strip() == text:
            self.composer.clear()
            self.cancel_edit()

    def show_system_prompt(self, text: str) -> None:
        self._system_prompt_text = text
        shown = " ".join(text.split())
        shown = shown if len(shown) <= 160 else shown[:160].rsplit(" ", 1)[0] + "…"
        self.system_prompt.setText(f"System prompt: {shown}" if shown else "No system prompt")
        self.system_prompt.setEnabled(bool(shown))

    def edit_system_prompt(self) -> None:
        """Ask for the system prompt in a small dialog; on OK, sig_system_prompt_edited."""
        dialog = SystemPromptDialog(self._system_prompt_text, self)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.sig_system_prompt_edited.emit(dialog.text(), dialog.as_default())

    def copy_message(self, index: int) -> None:
        """Put a message on the clipboard as its author wrote it (a reply's Markdown as the model wrote it)."""
        QGuiApplication.clipboard().setText(self.transcript.message(index)[1])

    def start_edit(self, index: int) -> None:
        """Put a user's message in the composer; Send then replaces it and what came after it."""
        role, text, _ = self.transcript.message(index)
        if role != "user":
            return
        self._editing = index
        self.composer.setPlainText(text)
        self.composer.setFocus()
        self.editing.setText("Editing an earlier message: Send replaces it and everything after it. Esc cancels.")
        self.editing.show()

    def cancel_edit(self) -> None:
        self._editing = None
        self.editing.hide()

    @property
    def editing_index(self) -> int | None:
        return self._editing

    def add_user_message(self, text: str) -> None:
        self.transcript.add_message("user", USER_TITLE, text=text)

    def begin_reply(self) -> None:
        self.transcript.begin_message("assistant", ASSISTANT_TITLE)

    def append_tokens(self, tokens: tuple[TokenInfo, ...]) -> None:
        self.transcript.append_tokens(tokens)

    def end_reply(self, finish_reason: str, stats: dict | None) -> None:
        self.transcript.end_message(self._footer(finish_reason, stats))

    def footer_tip_at(self, point: QPoint) -> str:
        """The footer's tooltip when `point` (the transcript viewport's coordinates) is on the footer
        under a reply that gives figures, else ""."""
        block = self.transcript.cursorForPosition(point).block()
        return FOOTER_TIP if block.text() in self._footers else ""

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt API
        # A reply's footer explains its figures; everywhere else TokenView's own filter answers (a token's p, q).
        if event.type() == QEvent.Type.ToolTip and watched is self.transcript.viewport():
            tip = self.footer_tip_at(event.pos())
            if tip:
                QToolTip.showText(event.globalPos(), tip, self.transcript.viewport())
                return True
        return super().eventFilter(watched, event)

    def _footer(self, finish_reason: str | None, stats: dict | None) -> str:
        note = reply_note(finish_reason, stats)
        if stats and stats.get("tokens"):
            self._footers.add(note)
        return note

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

    def set_markdown(self, enabled: bool) -> None:
        self.markdown.setChecked(enabled)  # the check box drives the transcript

    # -- internals -----------------------------------------------------------------------

    def _submit(self) -> None:
        text = self.composer.toPlainText().strip()
        if not text or not self._ready:
            return
        # Sending while a reply streams is allowed: the window stops it and starts the new one.
        # The text stays in the composer until it is saved (message_sent): a failed save loses nothing.
        if self._editing is not None:
            self.sig_edit_submitted.emit(self._editing, text)
        else:
            self.sig_send_requested.emit(text)

    def _show_menu(self, point: QPoint) -> None:
        index = self.transcript.message_at(self.transcript.cursorForPosition(point).position())
        if index is not None:
            self.message_menu(index).popup(self.transcript.viewport().mapToGlobal(point))

    def message_menu(self, index: int) -> QMenu:
        """What the transcript's context menu offers for message `index`."""
        role, _, streaming = self.transcript.message(index)
        menu = QMenu(self)
        menu.addAction("Copy as Markdown" if role == "assistant" else "Copy", lambda: self.copy_message(index))
        if role == "user":
            edit = menu.addAction("Edit and resend…", lambda: self.start_edit(index))
            edit.setEnabled(self._ready)
        elif index == self.transcript.message_count() - 1 and not streaming:
            again = menu.addAction("Regenerate", self.sig_regenerate_requested.emit)
            again.setEnabled(self._ready)
        return menu

    def _on_escape(self) -> None:
        if self._editing is not None and not self._busy:
            self.cancel_edit()
            self.composer.clear()
        else:
            self.sig_stop_requested.emit()

    def _on_button(self) -> None:
        if self._busy:
            self.sig_stop_requested.emit()
        else:
            self._submit()

    def _update_controls(self) -> None:
        self.send_button.setText("Stop" if self._busy else "Send")
        self.send_button.setToolTip("Stop the reply (Esc)" if self._busy else "Send the message (Enter)")
        self.send_button.setEnabled(self._busy or self._ready)


class SystemPromptDialog(QDialog):
    """The system prompt of a chat, and whether new chats start with it."""

    def __init__(self, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("System prompt")
        self.editor = QPlainTextEdit(text)
        self.editor.setPlaceholderText("For example: You are a concise assistant. Answer in English.")
        self.default = QCheckBox("Start new chats with this system prompt too")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Sent to the model before the first message of this chat:"))
        layout.addWidget(self.editor, 1)
        layout.addWidget(self.default)
        layout.addWidget(buttons)
        self.resize(480, 260)

    def text(self) -> str:
        return self.editor.toPlainText().strip()

    def as_default(self) -> bool:
        return self.default.isChecked()
