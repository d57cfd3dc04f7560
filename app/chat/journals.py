"""Reading the JSON-lines journals that earlier versions kept, once, for the import.

Before the SQLite store, each conversation was a file `<id>.jsonl`: a header
line, then one line per thing that happened (a user message, the start of a
reply, one step's tokens, the end of a reply, a rename). Files written by a
process that crashed or ran out of disk can hold every kind of damage, and the
reader survives each of them, recovering what is left and counting the rest:

- a torn line (a crash mid-write) with the next record glued onto it, because
  the old writer appended after the fragment without a newline: the glued
  record is recovered, the fragment counted as skipped;
- bytes that are not UTF-8 (a tear inside an accent, a CJK character or an
  emoji, or stray bytes): only the line they are on is affected; where the
  line still parses as JSON it is kept, the bad bytes shown as U+FFFD;
- lines that parse but have the wrong shape (`42`, `null`, a token row that is
  not `[id, text, source, p, q]`, a header without an id): skipped and counted.

`import_journals` brings every journal of a folder into the store, once: a
journal is moved into `imported-journals/` only after its conversation has been
read back from the database and found equal to what the journal held. Only files
the old store wrote count as journals (`written_by_specdeck`: its name pattern
and its header line): the data folder may be one the user also keeps other
`.jsonl` files in, and those stay where they are, untouched.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from app.chat.store_errors import StoreError
from engine import Source, TokenInfo

JOURNAL_SUFFIX = ".jsonl"
IMPORTED_FOLDER = "imported-journals"
_SOURCES = {"a": Source.ACCEPTED, "r": Source.RESAMPLED, "b": Source.BONUS, "p": Source.PLAIN, "u": Source.UNREPORTED}
_RECORD_START = '{"type":'  # how every record of the old writer began (compact separators)
# How the old writer began every journal (and every compaction of one): its header record. Spaces are
# allowed, for journals written by hand or by tests; a tear after its first bytes leaves it readable.
_HEADER_START = re.compile(rb'\{\s*"type"\s*:\s*"conversation"')


@dataclass
class JournalMessage:
    role: str
    content: str = ""
    tokens: list[TokenInfo] | None = None
    finish_reason: str | None = None
    stats: dict | None = None
    at: float | None = None


@dataclass
class JournalReading:
    """What could be read from one journal; `messages` may be empty, `skipped` counts damaged records."""

    id: str
    title: str
    created: float
    updated: float
    messages: list[JournalMessage]
    skipped: int
    header: bool = False  # whether its first record (id, title, creation time) could be read


def is_journal_id(text: str) -> bool:
    return bool(text) and len(text) <= 128 and all(c.isalnum() or c in "-_" for c in text)


def written_by_specdeck(path: Path) -> bool:
    """Whether `path` is a journal the old store wrote: named `<id>.jsonl` and starting with its header."""
    if not (path.name.endswith(JOURNAL_SUFFIX) and is_journal_id(path.name[: -len(JOURNAL_SUFFIX)])):
        return False
    try:
        with open(path, "rb") as file:
            return _HEADER_START.match(file.read(64)) is not None
    except OSError:
        return True  # unreadable now: counted as not imported, and tried again at the next start


def read_journal(path: Path) -> JournalReading:
    """Every record that can be recovered from `path` (raises OSError only if the file cannot be read)."""
    data = path.read_bytes()
    mtime = path.stat().st_mtime
    records: list = []
    skipped = 0
    for raw in data.split(b"\n"):
        if raw.strip():
            recovered, damaged = _parse_line(raw)
            records.extend(recovered)
            skipped += damaged
    stem_id = path.stem if is_journal_id(path.stem) else uuid.uuid4().hex
    reading = JournalReading(stem_id, "Recovered chat", mtime, 0.0, [], skipped)
    for record in records:
        if not isinstance(record, dict):
            reading.skipped += 1
        elif record.get("type") == "conversation" and not reading.header:
            reading.header = True
            _read_header(reading, record)
        elif not _replay(reading, record):
            reading.skipped += 1
    reading.updated = max(reading.updated, reading.created)
    return reading


def _parse_line(raw: bytes) -> tuple[list, int]:
    """The records on one line, and how many damaged pieces were dropped (0 or 1)."""
    text = raw.decode("utf-8", errors="replace")
    try:
        return [json.loads(text)], 0
    except ValueError:
        pass
    # A fragment torn by a crash, with the next record appended right after it: find that record.
    start = text.find(_RECORD_START, 1)
    while start != -1:
        try:
            return [json.loads(text[start:])], 1
        except ValueError:
            start = text.find(_RECORD_START, start + 1)
    return [], 1


def _read_header(reading: JournalReading, record: dict) -> None:
    if isinstance(record.get("id"), str) and is_journal_id(record["id"]):
        reading.id = record["id"]
    if isinstance(record.get("title"), str) and record["title"].strip():
        reading.title = record["title"]
    if _is_time(record.get("created")):
        reading.created = float(record["created"])


def _replay(reading: JournalReading, record: dict) -> bool:
    """Apply one record; False if it has the wrong shape (the caller counts it as skipped)."""
    kind, messages = record.get("type"), reading.messages
    at = float(record["at"]) if _is_time(record.get("at")) else None
    reply = messages[-1] if messages and messages[-1].role == "assistant" else None
    if kind == "user" and isinstance(record.get("content"), str):
        messages.append(JournalMessage("user", record["content"], at=at))
    elif kind == "reply":
        messages.append(JournalMessage("assistant", tokens=[], at=at))
    elif kind == "tokens" and reply is not None and isinstance(record.get("tokens"), list):
        tokens = [_token(row) for row in record["tokens"]]
        good = [t for t in tokens if t is not None]
        reply.tokens.extend(good)
        reply.content += "".join(t.text for t in good)
        reply.at = at or reply.at
        reading.skipped += len(tokens) - len(good)
    elif kind == "end" and reply is not None:
        reason, stats = record.get("finish_reason"), record.get("stats")
        reply.finish_reason = reason if isinstance(reason, str) else None
        reply.stats = stats if isinstance(stats, dict) else None
        reply.at = at or reply.at
    elif kind == "rename" and isinstance(record.get("title"), str) and record["title"].strip():
        reading.title = record["title"]
    else:
        return False
    if at is not None:
        reading.updated = max(reading.updated, at)
    return True


def _token(row) -> TokenInfo | None:
    if not isinstance(row, list) or len(row) != 5:
        return None
    token_id, text, code, p, q = row
    if not (
        isinstance(token_id, int)
        and isinstance(text, str)
        and code in _SOURCES
        and _is_probability(p)
        and (q is None or _is_probability(q))
    ):
        return None
    return TokenInfo(token_id, text, _SOURCES[code], float(p), None if q is None else float(q))


def _is_time(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _is_probability(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def import_journals(store, folder: Path) -> list[str]:
    """Import the journals in `folder` into `store` (ConversationStore); returns what to tell the user."""
    _remove_stale_temporaries(folder)
    journals = [path for path in sorted(folder.glob(f"*{JOURNAL_SUFFIX}")) if written_by_specdeck(path)]
    if not journals:
        return []
    backup = folder / IMPORTED_FOLDER
    imported, damaged, skipped, unreadable, kept = 0, 0, 0, [], []
    for path in journals:
        try:
            reading = read_journal(path)
        except OSError:
            kept.append(path.name)
            continue
        if not reading.header and not reading.messages:
            unreadable.append(path.name)
        else:
            try:
                store._insert_reading(reading)
                verified = _same(store.load(reading.id), reading)
            except StoreError as error:
                return [
                    f"The old conversation files in {folder} could not be imported yet ({error}) "
                    f"They are kept as they are, and the import runs again at the next start."
                ]
            if not verified:
                kept.append(path.name)
                continue
            imported += 1
            if reading.skipped:
                damaged, skipped = damaged + 1, skipped + reading.skipped
        try:
            backup.mkdir(exist_ok=True)
            os.replace(path, backup / path.name)
        except OSError:
            kept.append(path.name)
    return _import_notices(imported, damaged, skipped, unreadable, kept, folder, backup)


def _same(conversation, reading: JournalReading) -> bool:
    """Whether the database gives back what the journal held."""
    if conversation is None:
        return False
    stored = [(m.role, m.content, m.finish_reason, len(m.tokens or ())) for m in conversation.messages]
    read = [(m.role, m.content, m.finish_reason, len(m.tokens or ())) for m in reading.messages]
    return stored == read and conversation.title == reading.title


def _import_notices(imported, damaged, skipped, unreadable, kept, folder, backup) -> list[str]:
    notices = []
    if imported:
        chats = "conversation" if imported == 1 else "conversations"
        notice = f"Imported {imported} {chats} from the old journal files (now in {backup})."
        if skipped:
            records = "record" if skipped == 1 else "records"
            notice += (
                f" {skipped} damaged {records} in {damaged} of them could not be read and "
                f"{'was' if skipped == 1 else 'were'} skipped; everything else is there."
            )
        notices.append(notice)
    if unreadable:
        notices.append(f"Nothing could be read from {', '.join(unreadable)}; moved to {backup}.")
    if kept:
        notices.append(f"Could not import {', '.join(kept)}: left as they are in {folder}.")
    return notices


def _remove_stale_temporaries(folder: Path) -> None:
    """Temporary copies left by a compaction that was killed (the journal beside each is intact): named
    `.<id>.<random>.tmp` after a journal that is there (or was imported), holding the start of one."""
    for temporary in folder.glob(".*.*.tmp"):
        journal = temporary.name[1:].split(".", 1)[0] + JOURNAL_SUFFIX
        if not ((folder / journal).exists() or (folder / IMPORTED_FOLDER / journal).exists()):
            continue
        try:
            with open(temporary, "rb") as file:
                start = file.read(len(_RECORD_START))
            if _RECORD_START.encode().startswith(start):  # empty, or a record's first bytes
                temporary.unlink()
        except OSError:
            pass  # a read-only folder: they do no harm
