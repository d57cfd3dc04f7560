"""Conversations on disk: one append-only journal per chat, so nothing shown is lost.

Each conversation is a JSON-lines file `<id>.jsonl` in the data folder. The
first line describes it; every later line is one thing that happened: a user
message, the start of a reply, the tokens of one decoding step, the end of a
reply, a rename. The app appends a line (and flushes it to the OS) for every
step it shows, so killing the process loses nothing already on screen;
`fsync` runs at the end of each reply, so a power cut loses at most the reply
being written. A line torn by a crash mid-write is skipped when reading.

Rewrites (compacting a journal, a rename of an old chat) never edit a file in
place: they write a temporary file beside it and `os.replace` it, which is
atomic on every platform we support.

No Qt here: the folder is passed in (`default_data_dir` picks the usual one).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from engine.events import Source, TokenInfo

DATA_DIR_ENV = "SPECDECK_DATA_DIR"
FORMAT_VERSION = 1
_SOURCE_CODES = {Source.ACCEPTED: "a", Source.RESAMPLED: "r", Source.BONUS: "b", Source.PLAIN: "p"}
_SOURCES = {code: source for source, code in _SOURCE_CODES.items()}


@dataclass
class Message:
    role: str  # "user" | "assistant"
    content: str
    tokens: list[TokenInfo] | None = None  # assistant replies: where each token came from
    finish_reason: str | None = None  # None while the reply is still streaming (or was cut by a crash)
    stats: dict | None = None


@dataclass
class Conversation:
    id: str
    title: str
    created: float
    updated: float
    messages: list[Message] = field(default_factory=list)

    def chat_messages(self) -> list[dict]:
        """The turns to send to the chat template (empty replies, e.g. stopped at once, left out)."""
        return [{"role": m.role, "content": m.content} for m in self.messages if m.content]


class ConversationStore:
    """The conversations in one folder."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    # -- reading -------------------------------------------------------------------

    def list(self) -> list[Conversation]:
        """Every readable conversation, most recently updated first."""
        conversations = []
        for path in self.folder.glob("*.jsonl"):
            conversation = self._read(path)
            if conversation is not None:
                conversations.append(conversation)
        return sorted(conversations, key=lambda c: c.updated, reverse=True)

    def load(self, conversation_id: str) -> Conversation | None:
        return self._read(self._path(conversation_id))

    # -- writing -------------------------------------------------------------------

    def create(self, title: str = "New chat") -> Conversation:
        now = time.time()
        conversation = Conversation(uuid.uuid4().hex, title, now, now)
        header = {"type": "conversation", "version": FORMAT_VERSION, "id": conversation.id, "title": title,
                  "created": now}  # fmt: skip
        _atomic_write(self._path(conversation.id), _line(header))
        return conversation

    def add_user_message(self, conversation: Conversation, text: str) -> None:
        conversation.messages.append(Message("user", text))
        self._append(conversation, {"type": "user", "content": text}, sync=True)

    def begin_reply(self, conversation: Conversation) -> None:
        conversation.messages.append(Message("assistant", "", tokens=[]))
        self._append(conversation, {"type": "reply"})

    def add_reply_tokens(self, conversation: Conversation, tokens: tuple[TokenInfo, ...]) -> None:
        if not tokens:
            return
        reply = conversation.messages[-1]
        reply.tokens.extend(tokens)
        reply.content += "".join(t.text for t in tokens)
        self._append(conversation, {"type": "tokens", "tokens": [_encode_token(t) for t in tokens]})

    def end_reply(self, conversation: Conversation, finish_reason: str, stats: dict | None = None) -> None:
        reply = conversation.messages[-1]
        reply.finish_reason, reply.stats = finish_reason, stats
        self._append(conversation, {"type": "end", "finish_reason": finish_reason, "stats": stats}, sync=True)

    def rename(self, conversation: Conversation, title: str) -> None:
        conversation.title = title
        self._append(conversation, {"type": "rename", "title": title}, sync=True)

    def delete(self, conversation_id: str) -> None:
        self._path(conversation_id).unlink(missing_ok=True)

    def compact(self, conversation: Conversation) -> None:
        """Rewrite a journal as one line per message (atomically); reading it gives the same chat."""
        lines = [_line({"type": "conversation", "version": FORMAT_VERSION, "id": conversation.id,
                        "title": conversation.title, "created": conversation.created})]  # fmt: skip
        for message in conversation.messages:
            if message.role == "user":
                lines.append(_line({"type": "user", "content": message.content, "at": conversation.updated}))
                continue
            lines.append(_line({"type": "reply"}))
            if message.tokens:
                lines.append(_line({"type": "tokens", "tokens": [_encode_token(t) for t in message.tokens]}))
            if message.finish_reason is not None:
                lines.append(_line({"type": "end", "finish_reason": message.finish_reason, "stats": message.stats,
                                    "at": conversation.updated}))  # fmt: skip
        _atomic_write(self._path(conversation.id), "".join(lines))

    # -- internals -----------------------------------------------------------------

    def _path(self, conversation_id: str) -> Path:
        if not conversation_id or not all(c.isalnum() or c in "-_" for c in conversation_id):
            raise ValueError(f"not a conversation id: {conversation_id!r}")
        return self.folder / f"{conversation_id}.jsonl"

    def _append(self, conversation: Conversation, record: dict, sync: bool = False) -> None:
        conversation.updated = record["at"] = time.time()
        with open(self._path(conversation.id), "a", encoding="utf-8") as journal:
            journal.write(_line(record))
            journal.flush()
            if sync:
                os.fsync(journal.fileno())

    def _read(self, path: Path) -> Conversation | None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        records = []
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a crash: everything before it is intact
        if not records or records[0].get("type") != "conversation":
            return None
        head = records[0]
        conversation = Conversation(head["id"], head.get("title", "Chat"), head["created"], head["created"])
        for record in records[1:]:
            _replay(conversation, record)
        return conversation


def _replay(conversation: Conversation, record: dict) -> None:
    kind = record.get("type")
    conversation.updated = max(conversation.updated, record.get("at", conversation.updated))
    messages = conversation.messages
    if kind == "user":
        messages.append(Message("user", record.get("content", "")))
    elif kind == "reply":
        messages.append(Message("assistant", "", tokens=[]))
    elif kind == "tokens" and messages and messages[-1].role == "assistant":
        tokens = [_decode_token(t) for t in record.get("tokens", [])]
        messages[-1].tokens.extend(tokens)
        messages[-1].content += "".join(t.text for t in tokens)
    elif kind == "end" and messages and messages[-1].role == "assistant":
        messages[-1].finish_reason = record.get("finish_reason")
        messages[-1].stats = record.get("stats")
    elif kind == "rename":
        conversation.title = record.get("title", conversation.title)


def _encode_token(info: TokenInfo) -> list:
    return [info.id, info.text, _SOURCE_CODES[info.source], round(info.p, 6),
            None if info.q is None else round(info.q, 6)]  # fmt: skip


def _decode_token(row: list) -> TokenInfo:
    token_id, text, code, p, q = row
    return TokenInfo(token_id, text, _SOURCES.get(code, Source.PLAIN), p, q)


def _line(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def export_markdown(conversation: Conversation) -> str:
    """The conversation as a Markdown document (code blocks pass through as they are)."""
    parts = [f"# {conversation.title}\n"]
    for message in conversation.messages:
        heading = "You" if message.role == "user" else "Assistant"
        body = message.content.rstrip() or "*(no reply)*"
        if message.role == "assistant" and message.finish_reason == "cancelled":
            body += "\n\n*(stopped)*"
        parts.append(f"## {heading}\n\n{body}\n")
    return "\n".join(parts)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """For exports: the file is either the old one or the complete new one."""
    _atomic_write(Path(path), text)


def default_data_dir() -> Path:
    """$SPECDECK_DATA_DIR, else Qt's per-user application data folder + /conversations."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override)
    # Imported here so the store itself stays Qt-free (and testable without a QApplication).
    from PySide6.QtCore import QStandardPaths

    location = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    return Path(location) / "conversations"
