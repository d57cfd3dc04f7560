"""Reading a conversation database that may be damaged, and salvaging what can be read.

Damage comes from outside the store (another program, a disk error, a hand
edit), and none of it may cost more than the rows it touches:

- a value of the wrong type (a title stored as bytes, a time stored as text,
  statistics that are not JSON): every row is checked on its way out, and one
  that fails is skipped and named (`conversation_problem`, `message_problem`);
- text that is not UTF-8: the connection decodes it with U+FFFD for the bad
  bytes (`decode_text`), so one bad byte costs a character, not the list;
- a damaged page: SQLite ends a scan at the first one (SQLITE_CORRUPT), so
  `readable_rows` reads a table in rowid order and steps over the damage one
  rowid at a time: every row on an intact page is read.

`salvage_into` copies every readable, well-typed row into a fresh database
(SQLite's `.recover` is not in Python's sqlite3); the store swaps it in and
keeps the damaged file aside as it was.
"""

from __future__ import annotations

import json
import math
import sqlite3
from functools import partial

from app.chat.journals import is_journal_id

decode_text = partial(str, encoding="utf-8", errors="replace")  # the connections' text_factory
CONVERSATION_COLUMNS = "id, title, created, updated, skipped, system_prompt"
MESSAGE_COLUMNS = "id, conversation, position, role, content, finish_reason, stats"
TOKEN_COLUMNS = "message, position, token_id, text, source, p, q"
SOURCE_CODES = frozenset("arbpu")
# Where neither the table nor an index says how far the rowids go: how many to try past the last good one.
_PROBE_SPAN = 100_000


def is_corruption(error: sqlite3.Error) -> bool:
    return (getattr(error, "sqlite_errorname", "") or "").startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def storable(text: str) -> str:
    """`text` as UTF-8 can hold it: a lone surrogate (half an emoji, from a broken clipboard) becomes U+FFFD.

    Replaced rather than kept with surrogatepass: that would write bytes that are not UTF-8 into a
    TEXT column, the damage `decode_text` exists for, and no reader (Qt included) can show a lone
    surrogate as anything but U+FFFD anyway. A valid pair written as two code points is joined."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# -- reading past damaged pages -----------------------------------------------------------


def readable_rows(
    db: sqlite3.Connection, table: str, columns: str, where: str = "1", parameters: tuple = ()
) -> tuple[list[tuple], bool]:
    """(rows (rowid first) of a rowid table that can be read, in rowid order; whether damage was met).

    A scan that meets a damaged page fails; each rowid after the last good row is then looked up
    alone (a lookup that fails is on the damaged page) until one succeeds, and the scan goes on from
    there. Rowids are SQLite's own, counted from 1."""
    scan = f"SELECT rowid, {columns} FROM {table} NOT INDEXED WHERE rowid > ? AND ({where}) ORDER BY rowid"
    lookup = f"SELECT rowid, {columns} FROM {table} WHERE rowid = ? AND ({where})"
    rows, after, damaged, top = [], 0, False, None
    while True:
        try:
            for row in db.execute(scan, (after, *parameters)):
                rows.append(row)
                after = row[0]
            return rows, damaged
        except sqlite3.DatabaseError as error:
            if not is_corruption(error):
                raise
            damaged = True
        if top is None:
            top = _top_rowid(db, table, after)
        while after < top:
            after += 1
            try:
                rows.extend(db.execute(lookup, (after, *parameters)).fetchall())
                break  # past the damage: scan on
            except sqlite3.DatabaseError as error:
                if not is_corruption(error):
                    raise
        else:
            return rows, damaged


def _top_rowid(db: sqlite3.Connection, table: str, last_good: int) -> int:
    """The highest rowid that may hold a row: the table's, else the highest its indexes can give."""
    try:
        return db.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
    except sqlite3.DatabaseError as error:
        if not is_corruption(error):
            raise
    top = 0
    indexes = db.execute("SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = ?", (table,)).fetchall()
    for (index,) in indexes:
        try:
            for (rowid,) in db.execute(f'SELECT rowid FROM {table} INDEXED BY "{index}"'):
                top = max(top, rowid)
        except sqlite3.DatabaseError as error:
            if not is_corruption(error):
                raise
    return top or last_good + _PROBE_SPAN


def readable_tokens(db: sqlite3.Connection, message: int) -> tuple[list[tuple], bool]:
    """(one message's token rows that can be read, in order; whether damage cost some). The table has
    no rowid: a damaged page costs the tokens of the messages on it."""
    try:
        rows = db.execute(
            f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE message = ? ORDER BY position", (message,)
        ).fetchall()
        return rows, False
    except sqlite3.DatabaseError as error:
        if not is_corruption(error):
            raise
        return [], True


# -- checking each row's types -----------------------------------------------------------------


def conversation_problem(row: tuple) -> str | None:
    """Why a conversations row (id, title, created, updated[, skipped, system_prompt]) cannot be used, or None."""
    conversation_id, title, created, updated, skipped, system_prompt = (*row, 0, "")[:6]
    if not (isinstance(conversation_id, str) and is_journal_id(conversation_id)):
        return f"its id is {_shown(conversation_id)}, not one SpecDeck makes"
    if not isinstance(title, str):
        return f"its title is {_shown(title)}, not text"
    if not is_time(created):
        return f"its creation time is {_shown(created)}, not a time"
    if not is_time(updated):
        return f"its last-change time is {_shown(updated)}, not a time"
    if not (isinstance(skipped, int) and skipped >= 0):
        return f"its count of skipped records is {_shown(skipped)}, not a number"
    if not isinstance(system_prompt, str):
        return f"its system prompt is {_shown(system_prompt)}, not text"
    return None


def message_problem(row: tuple) -> str | None:
    """Why a messages row (id, conversation, position, role, content, finish_reason, stats) cannot be used."""
    _, _, position, role, content, finish_reason, _ = row
    if not isinstance(position, int):
        return f"its position is {_shown(position)}"
    if role not in ("user", "assistant"):
        return f"its role is {_shown(role)}"
    if not isinstance(content, str):
        return f"its text is {_shown(content)}"
    if finish_reason is not None and not isinstance(finish_reason, str):
        return f"its end is {_shown(finish_reason)}"
    return None


def stats_of(stats) -> tuple[dict | None, bool]:
    """(a reply's statistics from their column, whether they were unreadable and left out)."""
    if stats is None:
        return None, False
    try:
        value = json.loads(stats) if isinstance(stats, str) else None
    except ValueError:
        value = None
    return (value, False) if isinstance(value, dict) else (None, True)


def token_ok(row: tuple) -> bool:
    """Whether a tokens row (message, position, token_id, text, source, p, q) can be shown."""
    _, position, token_id, text, source, p, q = row
    return (
        isinstance(position, int)
        and isinstance(token_id, int)
        and isinstance(text, str)
        and source in SOURCE_CODES
        and _is_number(p)
        and (q is None or _is_number(q))
    )


def is_time(value) -> bool:
    return _is_number(value) and math.isfinite(value) and value >= 0


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value) -> str:
    """A stored value as a note can name it."""
    if value is None:
        return "missing"
    if isinstance(value, bytes):
        return f"{len(value)} bytes of binary data"
    if isinstance(value, str):
        return f"the text “{value[:24]}{'…' if len(value) > 24 else ''}”"
    return f"the number {value!r}"


# -- salvage ---------------------------------------------------------------------------------


def salvage_into(source: sqlite3.Connection, target: sqlite3.Connection) -> tuple[int, int]:
    """Copy every readable, well-typed row of `source` into `target` (an empty store database), in one
    transaction; returns (conversations copied, conversations listed in `source` but not copied)."""
    conversations, _ = readable_rows(source, "conversations", CONVERSATION_COLUMNS)
    kept = {row[1]: row for row in conversations if conversation_problem(row[1:]) is None}
    messages, _ = readable_rows(source, "messages", MESSAGE_COLUMNS)
    positions = set()
    target.execute("BEGIN IMMEDIATE")
    try:
        target.executemany(
            f"INSERT INTO conversations ({CONVERSATION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            [row[1:] for row in kept.values()],
        )
        for row in messages:
            message = row[1:]
            if message[1] not in kept or message_problem(message) or (message[1], message[2]) in positions:
                continue
            positions.add((message[1], message[2]))
            stats, _ = stats_of(message[6])
            target.execute(
                f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*message[:6], None if stats is None else json.dumps(stats)),
            )
            tokens, _ = readable_tokens(source, message[0])
            target.executemany(
                f"INSERT INTO tokens ({TOKEN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [token for token in tokens if token_ok(token)],
            )
        target.execute("COMMIT")
    except BaseException:
        if target.in_transaction:
            target.execute("ROLLBACK")
        raise
    return len(kept), _listed(source, len(conversations)) - len(kept)


def _listed(db: sqlite3.Connection, read: int) -> int:
    """How many conversations the database holds, as far as its indexes can say (at least `read`)."""
    try:
        return max(read, db.execute("SELECT count(*) FROM conversations").fetchone()[0])
    except sqlite3.DatabaseError as error:
        if not is_corruption(error):
            raise
        return read
