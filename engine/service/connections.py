"""Connections: how many a server holds, how long one may take to say what it wants, and a quiet log.

uvicorn on its own keeps a connection that never finishes its request headers open
for ever, and accepts connections until the process runs out of file descriptors;
then every accept fails and is logged, many times a second. So:

- **A header deadline.** A connection has `header_timeout_s` from connecting (or from
  the end of its last reply, when it starts another request) to finish its request
  headers; then it is closed. A request whose headers have come is the routes'
  business (its body has limits.Guard's time limit, a generation its own).
- **A connection limit**, below the process's file limit. A connection past it
  takes the place of the oldest connection that is not in the middle of a request
  (one still sending its headers, or idle between requests): a flood of half-open
  connections cannot keep out a client that asks for `/health`. Only when every
  connection is serving a request is a new one closed at once.
- **Repeated log lines once a minute.** A flood of bad requests or failed accepts
  logs its first line, then how many more there were.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)
FD_HEADROOM = 128  # file descriptors kept for the models, logs and llama.cpp's own files
BACKLOG = 128  # connections the kernel queues for accepting; asyncio accepts up to this many at once


def connection_limit(wanted: int) -> int:
    """`wanted`, lowered to fit the process's open-file limit with room to spare: for the files
    the process holds anyway, and for one burst of accepted connections not yet turned away."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft - FD_HEADROOM - BACKLOG))


def guarded_protocol(limit: int, header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header deadline and a connection limit (the module docstring);
    one class per server, since the connections it counts are that server's."""
    open_connections: dict[GuardedH11Protocol, None] = {}  # in the order they connected
    refused = Repeats(log, "connections refused: %d are open, all serving requests (the limit)")

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(open_connections) >= limit and not _evict_idle(open_connections):
                refused.note(len(open_connections))
                transport.abort()
                return
            open_connections[self] = None
            self._arm()

        def connection_lost(self, exc) -> None:
            open_connections.pop(self, None)
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self.busy:  # a request begun but its headers not finished, or the next request's first bytes
                self._arm()

        @property
        def busy(self) -> bool:
            """Serving a request: its headers have come and its reply has not ended."""
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            if self._deadline is None and not self.transport.is_closing():
                self._deadline = self.loop.call_later(header_timeout_s, self._expire, self.cycle)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self, cycle_when_armed) -> None:
            self._deadline = None
            if self.busy or self.transport.is_closing():
                return
            # A request came and went since then, and nothing of another has arrived: the
            # keep-alive timer closes it when it has waited long enough.
            if self.cycle is not cycle_when_armed and self.conn.their_state is h11.IDLE:
                return
            self.transport.close()

    return GuardedH11Protocol


def _evict_idle(connections: dict) -> bool:
    """Close the oldest connection that is not serving a request; False when every one is."""
    oldest = next((c for c in connections if not c.busy), None)
    if oldest is None:
        return False
    connections.pop(oldest, None)
    oldest._disarm()
    oldest.transport.abort()
    return True


class Repeats:
    """A log line said once, then at most once a minute with how many times it happened since."""

    def __init__(self, logger: logging.Logger, message: str, every_s: float = 60.0) -> None:
        self.logger, self.message, self.every_s = logger, message, every_s
        self._last, self._since = float("-inf"), 0

    def note(self, *args) -> None:
        self._since += 1
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        more = f" ({self._since - 1} more in the last minute)" if self._since > 1 and self._last > float("-inf") else ""
        self.logger.warning(self.message + more, *args)
        self._last, self._since = now, 0


class OncePerMinute(logging.Filter):
    """Lets each distinct message of a logger through once a minute (uvicorn's "Invalid HTTP request
    received.", asyncio's failed accepts): a flood fills no disk."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}:{record.msg}"
        now = time.monotonic()
        if now - self._seen.get(key, float("-inf")) < self.every_s:
            return False
        if len(self._seen) > 1000:  # distinct messages are few; this only bounds a pathological case
            self._seen.clear()
        self._seen[key] = now
        return True


QUIETED = ("uvicorn.error", "asyncio")  # the loggers a flood of connections writes to


def quiet_floods() -> OncePerMinute:
    """Install OncePerMinute on the loggers a flood of connections writes to (idempotent)."""
    for name in QUIETED:
        logger = logging.getLogger(name)
        for existing in logger.filters:
            if isinstance(existing, OncePerMinute):
                return existing
    flood = OncePerMinute()
    for name in QUIETED:
        logging.getLogger(name).addFilter(flood)
    return flood
