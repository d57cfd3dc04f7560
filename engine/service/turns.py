"""`Turns`: who uses the engine next, in the order the requests came.

A job takes a turn ALONE (a load, a benchmark, a comparison, and every generation of an
engine that decodes one sequence at a time) or SHARED (a generation of an engine loaded
with --parallel N > 1: up to N of them decode together, batch_loop.py). Turns are given
first come, first served, and the first in line holds up the rest: a job that needs the
engine alone waits until the generations running have ended (the batch drains), and the
generations that came after it wait until it has ended. That keeps a load or a benchmark
from starving behind a steady stream of chat requests, and keeps a chat request from
slipping in while a benchmark has the engine.

Everything here runs on the server's event loop, so it needs no lock; a turn is given
back from there too (Host's `finish`), once the engine's thread is done with the job.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

ALONE, SHARED = "alone", "shared"


@dataclass(eq=False)
class _Waiter:
    may_share: bool
    granted: asyncio.Future


class Turns:
    """First come, first served turns on the engine; `capacity()`: how many generations may share it
    now (the loaded engine's --parallel, 1 without one)."""

    def __init__(self, capacity: Callable[[], int]) -> None:
        self._capacity = capacity
        self._line: deque[_Waiter] = deque()
        self.alone = False  # a job has the engine to itself
        self.shared = 0  # generations decoding together

    def free_now(self, may_share: bool) -> bool:
        """Whether a job asking now would get its turn at once (nobody waits, and there is room)."""
        return not self._line and self._mode(may_share) is not None

    async def take(self, may_share: bool) -> str:
        """Wait for a turn: ALONE or SHARED (`may_share`: a generation, which shares the engine when the
        engine decodes several sequences). Give it back with `give_back`, once, whatever happens."""
        waiter = _Waiter(may_share, asyncio.get_running_loop().create_future())
        self._line.append(waiter)
        self._grant()
        try:
            return await waiter.granted
        except BaseException:  # cancelled while waiting (the request went away)
            if waiter.granted.done() and not waiter.granted.cancelled():
                self.give_back(waiter.granted.result())  # granted in the same moment: not used
            elif waiter in self._line:
                self._line.remove(waiter)
                self._grant()  # the next in line may go now
            raise

    def give_back(self, mode: str) -> None:
        if mode == ALONE:
            self.alone = False
        else:
            self.shared -= 1
        self._grant()

    def _mode(self, may_share: bool) -> str | None:
        """The turn a job would get now, None while it must wait."""
        if self.alone:
            return None
        capacity = self._capacity()
        if may_share and capacity > 1:
            return SHARED if self.shared < capacity else None
        return ALONE if self.shared == 0 else None

    def _grant(self) -> None:
        while self._line:
            head = self._line[0]
            if head.granted.done():  # cancelled: `take` removes it, or has
                self._line.popleft()
                continue
            mode = self._mode(head.may_share)
            if mode is None:
                return  # the first in line waits, and so does everyone behind it
            self._line.popleft()
            if mode == ALONE:
                self.alone = True
            else:
                self.shared += 1
            head.granted.set_result(mode)
