"""Conversations on disk: one SQLite database, so nothing shown or typed is lost.

`conversations.db` in the data folder holds three tables: conversations (id,
title, times), messages (role, text, how a reply ended, its statistics) and
tokens (each reply token's text, provenance, p and q, so a reply redraws in its
colours). Listing reads only the first table; opening a chat reads its rows.

Durability. The database runs in WAL mode. Every step of a reply is committed
as it is shown, with `synchronous=NORMAL`: a commit has reached the operating
system when it returns, so killing the app loses nothing already on screen.
The user's messages, the end of a reply, renames and deletes commit with
`synchronous=FULL` (fsync'd): a power cut loses at most the reply being written.

Failed writes. A full or read-only disk makes a write raise `StoreError`, whose
message says what happened and what to do; the in-memory `Conversation` keeps
everything (a reply goes on streaming), and the next write that succeeds saves
what the failed ones could not: each object knows what of it is already in the
database. A user message is the exception: if it cannot be saved it is taken
back, so the window can keep it in the composer and send it again later.

Damage from outside (a value of the wrong type, bytes that are not UTF-8, a
damaged page) costs only the rows it touches: store_rows.py reads past it and
checks every row, and `notices` names what was skipped and why. Where a page is
damaged, `salvage()` copies every readable row into a new database and keeps
the damaged file beside it, as it was. Another program holding the database
locked costs a write a quarter of a second and a StoreError, not a frozen window.

Older versions kept one JSON-lines journal per chat. Opening a folder that has
them imports each once (journals.py reads them, surviving torn lines and bad
bytes), checks the import by reading it back, and only then moves the file into
`imported-journals/`; `notices` says what was imported and what was skipped.

No Qt here: the folder is passed in (`default_data_dir` picks the usual one).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.chat import store_rows as rows
from app.chat.journals import JournalReading, import_journals, is_journal_id
from app.chat.store_errors import SALVAGE_ADVICE, StoreError, read_error, salvage_error, write_error
from engine import Source, TokenInfo

DATA_DIR_ENV = "SPECDECK_DATA_DIR"
DATABASE = "conversations.db"
SCHEMA_VERSION = 1
# Long enough for another SpecDeck window's write (milliseconds, an fsync at most); short enough that
# a program holding the database locked does not freeze the window: the write fails and says so.
BUSY_TIMEOUT_S = 0.25
_SOURCE_CODES = {
    Source.ACCEPTED: "a",
    Source.RESAMPLED: "r",
    Source.BONUS: "b",
    Source.PLAIN: "p",
    Source.UNREPORTED: "u",
}
_SOURCES = {code: source for source, code in _SOURCE_CODES.items()}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    skipped INTEGER NOT NULL DEFAULT 0, system_prompt TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS conversations_by_update ON conversations (updated DESC);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, conversation TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
    finish_reason TEXT, stats TEXT, UNIQUE (conversation, position));
CREATE TABLE IF NOT EXISTS tokens (
    message INTEGER NOT NULL REFERENCES messages (id) ON DELETE CASCADE, position INTEGER NOT NULL,
    token_id INTEGER NOT NULL, text TEXT NOT NULL, source TEXT NOT NULL, p REAL NOT NULL, q REAL,
    PRIMARY KEY (message, position)) WITHOUT ROWID;
"""


def is_valid_id(text) -> bool:
    """A conversation id as the store makes them (anything else, a path say, is not one)."""
    return isinstance(text, str) and is_journal_id(text)


@dataclass
class Message:
    role: str  # "user" | "assistant"
    content: str
    tokens: list[TokenInfo] | None = None  # assistant replies: where each token came from
    finish_reason: str | None = None  # None while the reply is still streaming (or was cut by a crash)
    stats: dict | None = None
    # What of this message the database already has (the store's bookkeeping).
    _row: int | None = field(default=None, repr=False, compare=False)
    _saved_tokens: int = field(default=0, repr=False, compare=False)
    _saved_end: bool = field(default=False, repr=False, compare=False)
    _position: int | None = field(default=None, repr=False, compare=False)  # its row's position (gaps: rows skipped)


@dataclass
class Conversation:
    id: str
    title: str
    created: float
    updated: float
    messages: list[Message] = field(default_factory=list)
    skipped: int = 0  # damaged records skipped when it was imported from an old journal
    system_prompt: str = ""  # sent before the first message ("" for none)
    # (title, system prompt) as the database has them; None: not in the database yet.
    _saved_header: tuple[str, str] | None = field(default=None, repr=False, compare=False)

    def chat_messages(self) -> list[dict]:
        """The turns to send to the chat template: the system prompt, then every message with text
        (empty replies, e.g. stopped at once, left out)."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        return system + [{"role": m.role, "content": m.content} for m in self.messages if m.content]


@dataclass(frozen=True)
class ConversationSummary:
    """One row of the list: no messages (listing never reads them)."""

    id: str
    title: str
    created: float
    updated: float


class ConversationStore:
    """The conversations in one folder (or, from `in_memory`, nowhere)."""

    def __init__(self, folder: str | os.PathLike | None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.notices: list[str] = []  # what to tell the user, each once (reads add to it as they find damage)
        self.damaged = False  # a damaged page was met: salvage() can copy what is readable
        if self.folder is None:
            self.path, self._db = None, _connect(":memory:")
            return
        self.path = self.folder / DATABASE
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreError(
                f"The conversation folder {self.folder} cannot be created: "
                f"{_os_reason(error)}. Conversations will not be saved; choose a writable "
                f"folder with the {DATA_DIR_ENV} environment variable."
            ) from error
        self._db = self._open()
        self.notices += import_journals(self, self.folder)

    @classmethod
    def in_memory(cls) -> ConversationStore:
        """A store that keeps nothing once the app closes (when the data folder is unusable)."""
        return cls(None)

    def close(self) -> None:
        self._db.close()

    def salvage(self) -> str:
        """Copy every conversation that can be read into a new database and use that from now on; the
        damaged file is kept beside it as it was. Returns what to tell the user; raises StoreError if it
        could not be done (and then nothing has changed)."""
        if self.path is None:
            raise StoreError("These conversations are kept in memory only: there is no database to salvage.")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.stem}.damaged-{stamp}.db")
        work = Path(tempfile.mkdtemp(dir=self.folder, prefix=".salvage-"))
        closed = False
        try:
            target = _connect(work / DATABASE)
            try:
                copied, lost = rows.salvage_into(self._db, target)
                healthy = target.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            finally:
                target.close()
            if not healthy:
                raise sqlite3.DatabaseError("the new database did not pass SQLite's integrity check")
            for suffix in ("", "-wal"):  # a copy as it is now: closing it below checkpoints its WAL into it
                damaged = self.path.with_name(self.path.name + suffix)
                if damaged.exists():
                    shutil.copy2(damaged, aside.with_name(aside.name + suffix))
            self._db.close()
            closed = True
            for suffix in ("-wal", "-shm"):  # the damaged database's: never to be applied to the new one
                self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
            os.replace(work / DATABASE, self.path)
        except (sqlite3.Error, OSError) as error:
            if closed:
                self._db = _connect(self.path)
            raise salvage_error(error, self.path) from error
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self._db = self._open()
        self.damaged = False
        chats = "conversation" if copied == 1 else "conversations"
        unreadable = f"; {lost} could not be read and {'is' if lost == 1 else 'are'} not in it" if lost else ""
        return (
            f"Salvaged {copied} {chats} into a new database{unreadable}. The damaged database is kept "
            f"as it was, as {aside.name} in {self.folder}."
        )

    # -- reading -------------------------------------------------------------------

    def list(self) -> list[ConversationSummary]:
        """Every conversation that can be read, most recently updated first (reads no messages);
        the others are skipped and named in `notices`."""
        found, damaged = self._rows("conversations", "id, title, created, updated")
        listed = []
        for row in found:
            problem = rows.conversation_problem(row[1:])
            if problem:
                self._note(
                    f"A conversation is not listed because {problem} ({_name(row[1], row[2])}); everything else is."
                )
            else:
                listed.append(ConversationSummary(*row[1:]))
        if damaged:
            lost = self._count("conversations") - len(found)
            what = (
                f"{lost} conversation{'s' if lost != 1 else ''} could not be read and "
                f"{'are' if lost != 1 else 'is'} not listed"
                if lost > 0
                else "some conversations may be missing"
            )
            self._damage_found(f"{what}; every other one is.")
        return sorted(listed, key=lambda summary: summary.updated, reverse=True)

    def load(self, conversation_id: str) -> Conversation | None:
        """A whole conversation, or None if there is none with that id (or the id is not one, or its row
        cannot be read); parts that cannot be read are left out and named in `notices`."""
        if not is_valid_id(conversation_id):
            return None
        head, damaged = self._rows(
            "conversations", "id, title, created, updated, skipped, system_prompt", "id = ?", (conversation_id,)
        )
        if damaged:
            self._damage_found("a conversation may be missing or incomplete.")
        if not head:
            return None
        problem = rows.conversation_problem(head[0][1:])
        if problem:
            self._note(f"A conversation cannot be opened because {problem} ({_name(conversation_id, head[0][2])}).")
            return None
        _, _, title, created, updated, skipped, system = head[0]
        conversation = Conversation(
            conversation_id,
            title,
            created,
            updated,
            skipped=skipped,
            system_prompt=system,
            _saved_header=(title, system),
        )
        found, damaged = self._rows(
            "messages", rows.MESSAGE_COLUMNS.removeprefix("id, "), "conversation = ?", (conversation_id,)
        )
        left_out, skipped_messages = [], 0  # what of it cannot be read, for the note
        by_row = {}
        for row in sorted(found, key=lambda row: row[2] if isinstance(row[2], int) else -1):
            problem = rows.message_problem(row)
            if problem:
                left_out.append(f"a message ({problem})")
                skipped_messages += 1
                continue
            _, _, position, role, content, reason, stats = row
            stats, unreadable = rows.stats_of(stats)
            if unreadable:
                left_out.append(f"the statistics of message {position + 1} (not valid JSON)")
            message = Message(
                role,
                content,
                [] if role == "assistant" else None,
                reason,
                stats,
                _row=row[0],
                _saved_end=reason is not None,
                _position=position,
            )
            by_row[row[0]] = message
            conversation.messages.append(message)
        missing = max((m._position for m in conversation.messages), default=-1) + 1 - len(conversation.messages)
        if damaged or missing > skipped_messages:
            self._damage_found(f"“{title}” may be missing messages that were stored there.")
        bad_tokens = 0
        for token in self._tokens(conversation_id, by_row, title):
            if rows.token_ok(token):
                row, _, token_id, text, code, p, q = token
                by_row[row].tokens.append(TokenInfo(token_id, text, _SOURCES.get(code, Source.PLAIN), p, q))
            else:
                bad_tokens += 1
        if bad_tokens:
            left_out.append(f"{bad_tokens} token{'s' if bad_tokens != 1 else ''} of its replies")
        for message in by_row.values():
            if message.tokens:  # the tokens are the reply (a reply cut by a crash has no final text yet)
                message.content = "".join(t.text for t in message.tokens)
                message._saved_tokens = len(message.tokens)
        if left_out:
            self._note(
                f"Some of “{title}” could not be read and is left out: {'; '.join(left_out)}. Everything else is shown."
            )
        return conversation

    # -- writing -------------------------------------------------------------------

    def create(self, title: str = "New chat", system_prompt: str = "") -> Conversation:
        now = time.time()
        conversation = Conversation(uuid.uuid4().hex, title, now, now, system_prompt=system_prompt)
        self._save(conversation, durable=True)
        return conversation

    def add_user_message(self, conversation: Conversation, text: str) -> None:
        """Saved (fsync'd) before this returns; if it cannot be, the message is taken back and StoreError raised."""
        conversation.messages.append(Message("user", text))
        try:
            self._save(conversation, durable=True)
        except StoreError:
            conversation.messages.pop()
            raise

    def begin_reply(self, conversation: Conversation) -> None:
        conversation.messages.append(Message("assistant", "", tokens=[]))
        self._save(conversation)

    def add_reply_tokens(self, conversation: Conversation, tokens: tuple[TokenInfo, ...]) -> None:
        if not tokens:
            return
        reply = conversation.messages[-1]
        reply.tokens.extend(tokens)
        reply.content += "".join(t.text for t in tokens)
        self._save(conversation)

    def end_reply(self, conversation: Conversation, finish_reason: str, stats: dict | None = None) -> None:
        reply = conversation.messages[-1]
        reply.finish_reason, reply.stats = finish_reason, stats
        self._save(conversation, durable=True)

    def rename(self, conversation: Conversation, title: str) -> None:
        conversation.title = title
        self._save(conversation, durable=True)

    def set_system_prompt(self, conversation: Conversation, text: str) -> None:
        conversation.system_prompt = text
        self._save(conversation, durable=True)

    def truncate(self, conversation: Conversation, position: int) -> None:
        """Drop message `position` and every later one (to edit a message, or regenerate a reply)."""
        dropped = conversation.messages[position:]
        del conversation.messages[position:]
        # Its row's position: after a row that could not be read, the list and the rows no longer count alike.
        cut = next((m._position for m in dropped if m._position is not None), None)
        if cut is None:
            return  # none of them is in the database
        try:
            self._write(
                lambda db: db.execute(
                    "DELETE FROM messages WHERE conversation = ? AND position >= ?", (conversation.id, cut)
                ),
                durable=True,
            )
        except StoreError:
            conversation.messages.extend(dropped)  # nothing changed: the window still shows them
            raise

    def delete(self, conversation_id: str) -> None:
        if is_valid_id(conversation_id):
            self._write(
                lambda db: db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)), durable=True
            )

    def unsaved(self, conversation: Conversation) -> bool:
        """Whether some of it is only in memory (a write failed and nothing has succeeded since)."""
        return conversation._saved_header != (conversation.title, conversation.system_prompt) or any(
            m._row is None or (m.tokens and m._saved_tokens < len(m.tokens)) or (m.finish_reason and not m._saved_end)
            for m in conversation.messages
        )

    # -- internals -----------------------------------------------------------------

    def _save(self, conversation: Conversation, durable: bool = False, touch: bool = True) -> None:
        """Write whatever of `conversation` the database does not have yet, in one transaction."""
        if touch:
            conversation.updated = time.time()
        _make_storable(conversation)
        saved = []  # (message, row, tokens, ended, position): applied only once the transaction has committed

        def write(db: sqlite3.Connection) -> None:
            saved.clear()
            if conversation._saved_header is None:
                db.execute(
                    "INSERT INTO conversations (id, title, created, updated, skipped, system_prompt) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        conversation.id,
                        conversation.title,
                        conversation.created,
                        conversation.updated,
                        conversation.skipped,
                        conversation.system_prompt,
                    ),
                )
            elif not db.execute(
                "UPDATE conversations SET title = ?, system_prompt = ?, updated = ? WHERE id = ?",
                (conversation.title, conversation.system_prompt, conversation.updated, conversation.id),
            ).rowcount:
                return  # deleted meanwhile: the rest of it goes nowhere
            position = -1
            for message in conversation.messages:
                position = message._position if message._position is not None else position + 1
                row = message._row
                if row is None:
                    row = db.execute(
                        "INSERT INTO messages (conversation, position, role, content) VALUES (?, ?, ?, ?)",
                        (conversation.id, position, message.role, message.content),
                    ).lastrowid
                tokens = len(message.tokens or ())
                if tokens > message._saved_tokens:
                    db.executemany(
                        "INSERT INTO tokens (message, position, token_id, text, source, p, q) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [
                            (row, i, t.id, t.text, _SOURCE_CODES[t.source], t.p, t.q)
                            for i, t in enumerate(message.tokens[message._saved_tokens :], message._saved_tokens)
                        ],
                    )
                ended = message.finish_reason is not None
                if ended and not message._saved_end:
                    db.execute(
                        "UPDATE messages SET content = ?, finish_reason = ?, stats = ? WHERE id = ?",
                        (
                            message.content,
                            message.finish_reason,
                            None if message.stats is None else json.dumps(message.stats),
                            row,
                        ),
                    )
                if row != message._row or tokens != message._saved_tokens or ended != message._saved_end:
                    saved.append((message, row, tokens, ended, position))

        self._write(write, durable)
        conversation._saved_header = (conversation.title, conversation.system_prompt)
        for message, row, tokens, ended, position in saved:
            message._row, message._saved_tokens, message._saved_end, message._position = row, tokens, ended, position

    def _rows(self, table: str, columns: str, where: str = "1", parameters: tuple = ()) -> tuple[list[tuple], bool]:
        """(rows of `table`, rowid first; whether a damaged page was met): past one, those that can be read."""
        try:
            try:
                found = self._db.execute(f"SELECT rowid, {columns} FROM {table} WHERE {where}", parameters).fetchall()
                return found, False
            except sqlite3.DatabaseError as error:
                if not rows.is_corruption(error):
                    raise
            return rows.readable_rows(self._db, table, columns, where, parameters)
        except sqlite3.Error as error:
            raise read_error(error, self.path) from error

    def _tokens(self, conversation_id: str, messages: dict, title: str) -> list[tuple]:
        """The token rows of these messages (by row), in order; past a damaged page, those that can be read."""
        try:
            try:
                found = self._db.execute(
                    f"SELECT {rows.TOKEN_COLUMNS} FROM tokens WHERE message IN "
                    "(SELECT id FROM messages WHERE conversation = ?) ORDER BY message, position",
                    (conversation_id,),
                ).fetchall()
                return [token for token in found if token[0] in messages]
            except sqlite3.DatabaseError as error:
                if not rows.is_corruption(error):
                    raise
            found = []
            for row in messages:
                tokens, damaged = rows.readable_tokens(self._db, row)
                found += tokens
                if damaged:
                    self._damage_found(f"the colours of some replies in “{title}” could not be read.")
            return found
        except sqlite3.Error as error:
            raise read_error(error, self.path) from error

    def _count(self, table: str) -> int:
        """How many rows `table` holds as far as SQLite can count them (-1 if it cannot)."""
        try:
            return self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        except sqlite3.Error:
            return -1

    def _note(self, notice: str) -> None:
        if notice not in self.notices:
            self.notices.append(notice)

    def _damage_found(self, what: str) -> None:
        self.damaged = True
        self._note(f"Part of the conversation database is damaged: {what} {SALVAGE_ADVICE}")

    def _write(self, write, durable: bool = False) -> None:
        db = self._db
        try:
            if durable:
                db.execute("PRAGMA synchronous = FULL")
            db.execute("BEGIN IMMEDIATE")
            try:
                write(db)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as error:
            if rows.is_corruption(error):
                self.damaged = True
            raise write_error(error, self.path) from error
        finally:
            if durable:
                try:
                    db.execute("PRAGMA synchronous = NORMAL")
                except sqlite3.Error:
                    pass

    def _read(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        try:
            return self._db.execute(sql, parameters).fetchall()
        except sqlite3.Error as error:
            raise read_error(error, self.path) from error

    def _open(self) -> sqlite3.Connection:
        """Open (or create) the database: read-only on a read-only disk; an unreadable one is moved aside."""
        try:
            return _connect(self.path)
        except sqlite3.DatabaseError as error:
            name = getattr(error, "sqlite_errorname", "")
            if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
                return self._start_anew()
            if not (self.path.exists() and name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN"))):
                raise write_error(error, self.path) from error
            db = self._open_read_only()
            if db is None:
                raise write_error(error, self.path) from error
            self.notices.append(
                f"The conversation folder {self.folder} is read-only: your conversations "
                f"are shown, but new messages cannot be saved until it is writable again."
            )
            return db

    def _open_read_only(self) -> sqlite3.Connection | None:
        # A WAL database on a read-only disk opens only as immutable once its -shm file cannot be made.
        for options in ("mode=ro", "mode=ro&immutable=1"):
            try:
                return _connect(f"{self.path.resolve().as_uri()}?{options}", read_only=True)
            except sqlite3.Error:
                continue
        return None

    def _start_anew(self) -> sqlite3.Connection:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            damaged = self.path.with_name(self.path.name + suffix)
            if damaged.exists():
                os.replace(damaged, self.path.with_name(f"{self.path.stem}.unreadable-{stamp}.db{suffix}"))
        self.notices.append(
            f"The conversation database {self.path} could not be read (it is damaged or "
            f"not a database). It was kept as {self.path.stem}.unreadable-{stamp}.db in "
            f"the same folder, and a new, empty one was started."
        )
        try:
            return _connect(self.path)
        except sqlite3.Error as error:
            raise write_error(error, self.path) from error

    def _insert_reading(self, reading: JournalReading) -> bool:
        """Import one journal's reading (for journal_import); False if that conversation is already here."""
        if self._read("SELECT 1 FROM conversations WHERE id = ?", (reading.id,)):
            return False
        conversation = Conversation(
            reading.id, reading.title, reading.created, reading.updated, skipped=reading.skipped
        )
        for message in reading.messages:
            conversation.messages.append(
                Message(message.role, message.content, message.tokens, message.finish_reason, message.stats)
            )
        self._save(conversation, touch=False)  # the journal is kept (moved aside), so no fsync per chat
        return True


def _connect(path, read_only: bool = False) -> sqlite3.Connection:
    # Transactions are explicit (_write), hence isolation_level=None.
    db = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_S, uri=read_only)
    db.text_factory = rows.decode_text  # a bad byte in one title costs a character, not the list
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"The conversation database {path} was written by a newer SpecDeck "
                f"(format {version}; this one reads {SCHEMA_VERSION}). Update SpecDeck, or "
                f"set {DATA_DIR_ENV} to another folder."
            )
        if read_only:
            db.execute("SELECT count(*) FROM conversations").fetchone()
            return db
        if path != ":memory:":
            db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = ON")
        db.executescript(_SCHEMA)
        if version != SCHEMA_VERSION:
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        db.close()
        raise
    return db


def _make_storable(conversation: Conversation) -> None:
    """Lone surrogates out of what is about to be saved, in memory too: the window then shows what is saved."""
    conversation.title = rows.storable(conversation.title)
    conversation.system_prompt = rows.storable(conversation.system_prompt)
    for message in conversation.messages:
        if message._row is None or (message.finish_reason is not None and not message._saved_end):
            message.content = rows.storable(message.content)
        for i in range(message._saved_tokens, len(message.tokens or ())):
            token = message.tokens[i]
            if rows.storable(token.text) is not token.text:
                message.tokens[i] = replace(token, text=rows.storable(token.text))


def _name(conversation_id, title) -> str:
    """A skipped conversation as a note names it: its title where that is text, and its id."""
    shown = f"“{title}”, " if isinstance(title, str) else ""
    return f"{shown}id {conversation_id if isinstance(conversation_id, str) else '(none)'}"


def _os_reason(error: OSError) -> str:
    return error.strerror.lower() if error.strerror else str(error)


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
    path = Path(path)
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


def default_data_dir() -> Path:
    """$SPECDECK_DATA_DIR, else Qt's per-user application data folder + /conversations."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override)
    # Imported here so the store itself stays Qt-free (and testable without a QApplication).
    from PySide6.QtCore import QStandardPaths

    location = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    return Path(location) / "conversations"
