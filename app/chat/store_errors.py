"""What a failed read or write of the conversation store tells the user.

SQLite reports a full disk, a read-only folder or a damaged file by error
names (`sqlite_errorname`, Python 3.11+); each becomes one sentence that says
what happened, that nothing on screen is lost, and what to do.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

# Every notice and error about a damaged database ends with this (the window offers the salvage there too).
SALVAGE_ADVICE = (
    "File ▸ Salvage conversations copies every conversation that can still be read into a new "
    "database; the damaged file is kept beside it, as it is."
)


class StoreError(Exception):
    """A conversation could not be read or saved; str() is the sentence to show."""


def _reason(error: sqlite3.Error) -> tuple[str, str]:
    """(what happened, what to do) for an SQLite error."""
    name = getattr(error, "sqlite_errorname", "") or ""
    text = str(error).lower()
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return "the disk is full", "Free some space: it is saved as soon as there is room."
    if name.startswith(("SQLITE_READONLY", "SQLITE_PERM", "SQLITE_AUTH")) or "readonly" in text:
        return (
            "the folder or the database is read-only",
            "Make it writable, or start SpecDeck with SPECDECK_DATA_DIR set to a writable folder.",
        )
    if name.startswith("SQLITE_CANTOPEN"):
        return (
            "the database file cannot be opened",
            "Check that the folder exists and is writable (or set SPECDECK_DATA_DIR).",
        )
    if name.startswith("SQLITE_BUSY") or name.startswith("SQLITE_LOCKED"):
        return (
            "another program holds the database locked",
            "It is saved with the next change once that program lets go (close it, or the other SpecDeck "
            "window); try again in a moment.",
        )
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return "part of the database is damaged", SALVAGE_ADVICE
    if name.startswith("SQLITE_IOERR"):
        return "the disk reported an input/output error", "Check the disk; it is saved again on the next change."
    return str(error), "Try again; if it keeps happening, please report it."


def write_error(error: sqlite3.Error, path: Path | None) -> StoreError:
    what, advice = _reason(error)
    where = f" ({path})" if path else ""
    return StoreError(
        f"The conversation could not be saved: {what}{where}. Nothing on screen is lost "
        f"while SpecDeck stays open. {advice}"
    )


def salvage_error(error: Exception, path: Path | None) -> StoreError:
    what = _reason(error)[0] if isinstance(error, sqlite3.Error) else (error.strerror or str(error)).lower()
    return StoreError(f"The conversations could not be salvaged: {what}. Nothing was changed: {path} is as it was.")


def read_error(error: sqlite3.Error, path: Path | None) -> StoreError:
    what, advice = _reason(error)
    where = f" ({path})" if path else ""
    return StoreError(f"The saved conversations could not be read: {what}{where}. {advice}")
