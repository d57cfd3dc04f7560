"""The chat's bookkeeping: which conversation is shown, which one a reply is written to.

`ChatSession` sits between the conversation store, the engine controller and the
two chat widgets (the transcript and the conversation list). It is the only
writer of the store. A reply is written to the store step by step as it is
shown, so a crash loses nothing on screen; it keeps going into its own
conversation even when the user opens another one meanwhile. A message sent
while something is decoding stops that run first and goes out once it has
ended, so the journal never mixes the end of one reply with the next question.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

from engine import SamplingConfig
from engine.events import GenerationResult, StepEvent
from app.chat_view import ChatView
from app.conversation_panel import ConversationPanel
from app.conversations import Conversation, ConversationStore
from app.engine_controller import CHAT, EngineController

NEW_CHAT_TITLE = "New chat"


def title_from(text: str, limit: int = 48) -> str:
    """A conversation's title from its first message: the first line, shortened at a word."""
    line = " ".join(text.split("\n", 1)[0].split())
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + "…"


class ChatSession(QObject):
    """Conversations shown, saved and continued."""

    sig_title_changed = Signal(str)
    """The shown conversation's title (for the window title)."""

    def __init__(self, store: ConversationStore, controller: EngineController, view: ChatView,
                 panel: ConversationPanel, parent: QObject | None = None) -> None:  # fmt: skip
        super().__init__(parent)
        self.store, self.controller, self.view, self.panel = store, controller, view, panel
        self.conversation: Conversation | None = None  # the one shown
        self.replying_to: Conversation | None = None  # the one the streaming reply belongs to
        self._queued: tuple[str, SamplingConfig] | None = None
        controller.sig_run_started.connect(self._on_run_started)
        controller.sig_step.connect(self._on_step)
        controller.sig_run_finished.connect(self._on_run_finished)
        controller.sig_busy_changed.connect(self._on_busy_changed)
        panel.sig_selected.connect(self.open)
        panel.sig_renamed.connect(self.rename)

    # -- sending -------------------------------------------------------------------------

    def send(self, text: str, sampling: SamplingConfig) -> None:
        if self.controller.busy:
            self._queued = (text, sampling)  # sent by _on_busy_changed once the run has ended
            self.controller.stop()
            return
        if self.conversation is None:
            self.conversation = self.store.create(title_from(text))
            self.refresh()
        self.store.add_user_message(self.conversation, text)
        self.view.add_user_message(text)
        self.replying_to = self.conversation
        self.controller.chat(self.conversation.chat_messages(), sampling)

    def _on_run_started(self, kind: str) -> None:
        if kind == CHAT and self.replying_to is not None:
            self.store.begin_reply(self.replying_to)
            if self.replying_to is self.conversation:
                self.view.begin_reply()

    def _on_step(self, label: str, event: StepEvent) -> None:
        # Only chat runs have a conversation to reply to (comparisons leave it None).
        if self.replying_to is not None and event.tokens:
            self.store.add_reply_tokens(self.replying_to, event.tokens)
            if self.replying_to is self.conversation:
                self.view.append_tokens(event.tokens)

    def _on_run_finished(self, kind: str, result: GenerationResult | None) -> None:
        if kind != CHAT or self.replying_to is None:
            return
        reason = result.finish_reason if result is not None else "error"
        stats = result.stats.as_dict() if result is not None else None
        conversation, self.replying_to = self.replying_to, None
        self.store.end_reply(conversation, reason, stats)
        self.store.compact(conversation)
        if conversation is self.conversation:
            self.view.end_reply(reason, stats)
        self.refresh()

    def _on_busy_changed(self, busy: bool) -> None:
        if not busy and self._queued is not None:
            # Not from inside this signal: the other listeners must first hear "not busy"
            # before the new run makes it busy again, or they would end up believing the former.
            QTimer.singleShot(0, self._send_queued)

    def _send_queued(self) -> None:
        if self._queued is not None:
            queued, self._queued = self._queued, None
            self.send(*queued)

    def close(self) -> None:
        """After the controller has shut down: a reply cut by closing still ends in the journal."""
        if self.replying_to is not None:
            self.store.end_reply(self.replying_to, "cancelled")
            self.replying_to = None

    # -- conversations -------------------------------------------------------------------

    def open(self, conversation_id: str | None) -> None:
        """Show a saved conversation, or an empty chat (None) that is saved on its first message."""
        if conversation_id is not None and self.conversation is not None and conversation_id == self.conversation.id:
            return
        if self.replying_to is not None and conversation_id == self.replying_to.id:
            conversation = self.replying_to  # the live object, still being written
        else:
            conversation = self.store.load(conversation_id) if conversation_id else None
        self.conversation = conversation
        streaming = conversation is not None and conversation is self.replying_to
        self.view.show_conversation(conversation, streaming=streaming)
        self.refresh()

    def rename(self, conversation_id: str, title: str) -> None:
        live = [c for c in (self.conversation, self.replying_to) if c is not None and c.id == conversation_id]
        conversation = live[0] if live else self.store.load(conversation_id)
        if conversation is not None and title != conversation.title:
            self.store.rename(conversation, title)
            self.refresh()

    def delete(self, conversation_id: str) -> None:
        if self.replying_to is not None and self.replying_to.id == conversation_id:
            self.controller.stop()
            self.replying_to = None  # the rest of that reply goes nowhere
        self.store.delete(conversation_id)
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.open(None)
        self.refresh()

    def refresh(self) -> None:
        """Redraw the list (most recent first) and announce the title."""
        self.panel.set_conversations(self.store.list(), self.conversation.id if self.conversation else None)
        self.sig_title_changed.emit(self.conversation.title if self.conversation else NEW_CHAT_TITLE)
