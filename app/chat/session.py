"""The chat's bookkeeping: which conversation is shown, which one a reply is written to.

`ChatSession` sits between the conversation store, the engine controller and the
two chat widgets (the transcript and the conversation list). It is the only
writer of the store. A reply is written to the store as it is shown (a batch
of steps at a time, 4 to 10 times a second), so a crash loses nothing on
screen; it keeps going into its own conversation even when the user opens
another one meanwhile. A message sent
while something is decoding stops that run first and goes out once it has
ended, so the store never mixes the end of one reply with the next question.

A write that fails (read-only folder, full disk) is a `sig_save_failed` message,
once per streak of failures, never an exception: a user message that could not
be saved is not sent and stays in the composer; a reply whose tokens could not
be saved keeps streaming on screen (the store writes them with its next
successful write, and `sig_save_recovered` says so).

A reply cut by the engine process's death keeps every token it showed, in the
transcript and in the store, and ends as "interrupted".

What the store finds as it reads (a row it skipped, a damaged page) is in its
`notices`; each is told once, through `sig_notice`, after the read that found it.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.conversation_panel import ConversationPanel
from app.chat.conversations import Conversation, ConversationStore, StoreError
from app.chat.view import ChatView
from app.runtime.engine_controller import CHAT, EngineController
from engine import GenerationResult, SamplingConfig, StepEvent

NEW_CHAT_TITLE = "New chat"
GREEDY_REGENERATE = (
    "Greedy decoding gives the same reply: raise the temperature in Models ▸ Model pair… (Ctrl+M) "
    "to get a different one."
)
_NOT_SENT = "Your message was not sent (it is still in the message box)."


def title_from(text: str, limit: int = 48) -> str:
    """A conversation's title from its first message: the first line, shortened at a word."""
    line = " ".join(text.split("\n", 1)[0].split())
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + "…"


class ChatSession(QObject):
    """Conversations shown, saved and continued."""

    sig_title_changed = Signal(str)
    """The shown conversation's title (for the window title)."""

    sig_save_failed = Signal(str)
    """Saving (or reading) failed: what and why; for writes, once until a write succeeds again."""

    sig_save_recovered = Signal()
    """A write succeeded after failures: everything shown is saved again."""

    sig_notice = Signal(str)
    """Something the user should know about the conversations (damaged records or rows skipped, a salvage)
    or a reply (that regenerating a greedy one gives the same text)."""

    def __init__(
        self,
        store: ConversationStore,
        controller: EngineController,
        view: ChatView,
        panel: ConversationPanel,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store, self.controller, self.view, self.panel = store, controller, view, panel
        self.conversation: Conversation | None = None  # the one shown
        self.replying_to: Conversation | None = None  # the one the streaming reply belongs to
        self._queued = None  # what to do once the running generation has stopped (a callable)
        self.default_system_prompt = ""  # what a new conversation starts with (the settings' default)
        self._new_chat_system_prompt: str | None = None  # set for the empty chat before its first message
        self._save_failing = False  # in a streak of failed writes: said once, not once per token
        self._engine_stopped = False  # the engine process died under the running reply
        self._told = 0  # how many of the store's notices sig_notice has told
        controller.sig_run_started.connect(self._on_run_started)
        controller.sig_steps.connect(self._on_steps)
        controller.sig_run_finished.connect(self._on_run_finished)
        controller.sig_busy_changed.connect(self._on_busy_changed)
        controller.sig_engine_stopped.connect(self._on_engine_stopped)
        panel.sig_selected.connect(self.open)
        panel.sig_renamed.connect(self.rename)

    # -- sending -------------------------------------------------------------------------

    def send(self, text: str, sampling: SamplingConfig) -> None:
        """Save the user's message and ask for a reply; the composer is cleared once it is saved."""
        if self._after_stop(lambda: self.send(text, sampling)):
            return
        conversation = self.conversation
        if conversation is None:
            conversation = self._write(
                _NOT_SENT, self.store.create, title_from(text), self.system_prompt, always_say=True
            )
            if conversation is None:
                return
            self.conversation = conversation
            self.refresh()
        # The store takes the message back if it cannot be saved; it stays in the composer.
        if not self._write(_NOT_SENT, self.store.add_user_message, conversation, text, always_say=True):
            return
        self._new_chat_system_prompt = None
        self.view.message_sent(text)
        self.view.add_user_message(conversation.messages[-1].content)  # as saved (a lone surrogate is not)
        self.replying_to = conversation
        self.controller.chat(conversation.chat_messages(), sampling)

    def regenerate(self, sampling: SamplingConfig) -> None:
        """Write the last reply again (the reply goes; the question stays and is answered anew),
        with a seed of its own: the same seed would draw the same reply. Greedy decoding has
        no draw to change, so the user is told how to get another reply."""
        if self._after_stop(lambda: self.regenerate(sampling)):
            return
        conversation = self.conversation
        if conversation is None or not conversation.messages:
            return
        last = len(conversation.messages) - 1
        if conversation.messages[last].role == "assistant":
            if not self._write(
                "The reply was not regenerated.", self.store.truncate, conversation, last, always_say=True
            ):
                return
        self.view.show_conversation(conversation)
        self.replying_to = conversation
        if sampling.greedy:
            self.sig_notice.emit(GREEDY_REGENERATE)
        self.controller.chat(conversation.chat_messages(), sampling.with_new_seed())

    def edit_and_resend(self, position: int, text: str, sampling: SamplingConfig) -> None:
        """Replace the user's message at `position` with `text`, drop what came after it, and send it."""
        if self._after_stop(lambda: self.edit_and_resend(position, text, sampling)):
            return
        conversation = self.conversation
        if conversation is None or not 0 <= position < len(conversation.messages):
            return
        if conversation.messages[position].role != "user":
            return
        if not self._write(_NOT_SENT, self.store.truncate, conversation, position, always_say=True):
            return
        self.view.show_conversation(conversation)
        self.send(text, sampling)

    @property
    def system_prompt(self) -> str:
        """The shown conversation's system prompt (for an empty chat, the one it will start with)."""
        if self.conversation is not None:
            return self.conversation.system_prompt
        if self._new_chat_system_prompt is not None:
            return self._new_chat_system_prompt
        return self.default_system_prompt

    def set_system_prompt(self, text: str) -> None:
        """For the shown conversation from its next reply on (an empty chat: from its first)."""
        if self.conversation is None:
            self._new_chat_system_prompt = text
        else:
            self._write(
                "The system prompt was not saved.",
                self.store.set_system_prompt,
                self.conversation,
                text,
                always_say=True,
            )
        self.view.show_system_prompt(self.system_prompt)

    def _after_stop(self, then) -> bool:
        """While a generation runs: stop it and do `then` once it has ended (True); else False."""
        if not self.controller.busy:
            return False
        self._queued = then  # run by _on_busy_changed once the run has ended
        self.controller.stop()
        return True

    def _on_engine_stopped(self, message: str) -> None:
        self._engine_stopped = True  # the run it cut ends next (sig_run_finished with None)

    def _on_run_started(self, kind: str) -> None:
        self._engine_stopped = False
        if kind == CHAT and self.replying_to is not None:
            self._write("", self.store.begin_reply, self.replying_to)
            if self.replying_to is self.conversation:
                self.view.begin_reply()

    def _on_steps(self, steps: list[StepEvent]) -> None:
        # Only chat runs have a conversation to reply to (comparisons leave it None).
        # One write and one insertion per batch: each has a cost of its own, whatever its size.
        tokens = tuple(token for step in steps for token in step.tokens)
        if self.replying_to is not None and tokens:
            self._write("", self.store.add_reply_tokens, self.replying_to, tokens)
            if self.replying_to is self.conversation:
                self.view.append_tokens(tokens)

    def _on_run_finished(self, kind: str, result: GenerationResult | None) -> None:
        if kind != CHAT or self.replying_to is None:
            return
        reason = result.finish_reason if result is not None else ("interrupted" if self._engine_stopped else "error")
        self._engine_stopped = False
        stats = result.stats.as_dict() if result is not None else None
        conversation, self.replying_to = self.replying_to, None
        self._write("", self.store.end_reply, conversation, reason, stats)
        if conversation is self.conversation:
            self.view.end_reply(reason, stats)
        self.refresh()

    def _read(self, read, *args):
        """Call a store read; on StoreError say so and return None."""
        try:
            return read(*args)
        except StoreError as error:
            self.sig_save_failed.emit(str(error))
            return None

    def _write(self, context: str, write, *args, always_say: bool = False):
        """Call a store write; on StoreError say so (once per streak, or `always_say`) and return None.

        `context` goes before the store's sentence (which says what failed, why and what to do)."""
        try:
            written = write(*args)
        except StoreError as error:
            if always_say or not self._save_failing:
                self.sig_save_failed.emit(f"{context} {error}".strip())
            self._save_failing = True
            return None
        if self._save_failing:
            self._save_failing = False
            self.sig_save_recovered.emit()
        return written if written is not None else True

    def _on_busy_changed(self, busy: bool) -> None:
        if not busy and self._queued is not None:
            # Not from inside this signal: the other listeners must first hear "not busy"
            # before the new run makes it busy again, or they would end up believing the former.
            QTimer.singleShot(0, self._send_queued)

    def _send_queued(self) -> None:
        if self._queued is not None:
            queued, self._queued = self._queued, None
            queued()

    def close(self) -> None:
        """After the controller has shut down: a reply cut by closing is still ended in the store."""
        if self.replying_to is not None:
            self._write("", self.store.end_reply, self.replying_to, "cancelled")
            self.replying_to = None

    # -- conversations -------------------------------------------------------------------

    def open(self, conversation_id: str | None) -> None:
        """Show a saved conversation, or an empty chat (None) that is saved on its first message."""
        if conversation_id is not None and self.conversation is not None and conversation_id == self.conversation.id:
            return
        if self.replying_to is not None and conversation_id == self.replying_to.id:
            conversation = self.replying_to  # the live object, still being written
        else:
            conversation = self._read(self.store.load, conversation_id) if conversation_id else None
        self.conversation = conversation
        self._new_chat_system_prompt = None
        streaming = conversation is not None and conversation is self.replying_to
        self.view.show_conversation(conversation, streaming=streaming)
        self.view.show_system_prompt(self.system_prompt)
        skipped = ""
        if conversation is not None and conversation.skipped:
            records = "record" if conversation.skipped == 1 else "records"
            skipped = (
                f"“{conversation.title}” had {conversation.skipped} damaged {records} that could not be "
                f"read and {'was' if conversation.skipped == 1 else 'were'} skipped; "
                "everything else is shown."
            )
        self.refresh(skipped)

    def salvage(self) -> None:
        """Copy every readable conversation into a new database (the damaged one is kept), and show them."""
        if self.controller.busy:
            self.sig_save_failed.emit(
                "Stop the running reply first: nothing may be written while the conversations are salvaged."
            )
            return
        try:
            done = self.store.salvage()
        except StoreError as error:
            self.sig_save_failed.emit(str(error))
            return
        shown, self.conversation = self.conversation, None  # its rows are new ones now: read again
        self.open(shown.id if shown is not None else None)
        self.sig_notice.emit(done)

    def find(self, conversation_id: str) -> Conversation | None:
        """The conversation with this id: the live object if it is shown or replied to, else the saved one."""
        live = [c for c in (self.conversation, self.replying_to) if c is not None and c.id == conversation_id]
        return live[0] if live else self._read(self.store.load, conversation_id)

    def rename(self, conversation_id: str, title: str) -> None:
        conversation = self.find(conversation_id)
        if conversation is not None and title != conversation.title:
            self._write("The new title was not saved.", self.store.rename, conversation, title, always_say=True)
            self.refresh()

    def delete(self, conversation_id: str) -> None:
        if self.replying_to is not None and self.replying_to.id == conversation_id:
            self.controller.stop()
            self.replying_to = None  # the rest of that reply goes nowhere
        if (
            self._write("The conversation was not deleted.", self.store.delete, conversation_id, always_say=True)
            is None
        ):
            self.refresh()
            return
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.open(None)
        self.refresh()

    def refresh(self, notice: str = "") -> None:
        """Redraw the list (most recent first), announce the title, and tell what the store found (then `notice`)."""
        listed = self._read(self.store.list)
        if listed is None:
            listed = [self.conversation] if self.conversation else []
        self.panel.set_conversations(listed, self.conversation.id if self.conversation else None)
        self.sig_title_changed.emit(self.conversation.title if self.conversation else NEW_CHAT_TITLE)
        notices = self.store.notices[self._told :]
        self._told = len(self.store.notices)
        if notices or notice:
            self.sig_notice.emit(" ".join([*notices, notice]).strip())
