"""What the command line asks of its terminal, in one place for every command."""

from __future__ import annotations


def isatty(stream) -> bool:
    """Whether `stream` is a terminal; False for None and for closed or replaced streams."""
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, OSError, ValueError):
        return False
