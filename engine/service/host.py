"""`Host`: the engine a server holds, and the rule that one job uses it at a time.

A job is anything that touches the models: a load, a generation, a comparison,
a benchmark. Jobs run one after the other on the engine's thread (`EngineThread`:
the event loop never decodes), and at most `queue_limit` more may wait; past that
a request is refused with `ServerBusy` rather than left hanging. A job reports
what it makes through `emit`; the request that started it reads those items as
they come.

A job ends early when its request goes away: a client that disconnects, or the
route that stops reading (an async generator closed), sets the job's cancel
event, and the engine stops at its next step, with its caches rolled back. The
next job starts only once that job has returned, so two jobs never share a
model. `cancel()` asks a job to stop without closing anything: its stream still
ends with the engine's last, "cancelled" step. A client names its job (the
`X-SpecDeck-Job` header, `JOB_HEADER`) so that its cancel stops that job, running
or still waiting, and never another client's.

An engine loaded with --parallel N > 1 serves up to N generations at once: they
share the engine (turns.py gives the turns, first come first served) and decode
together in one batch (batch_loop.py); each is still a job of its own here, with
its own cancel event, time limit and stream. A job that needs the engine alone (a
load, a benchmark, a comparison) waits for the batch to drain, and the generations
that come after it wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

from engine.service.batch_loop import BatchLoop, Member, Start, run_alone
from engine.service.errors import ServerBusy
from engine.service.turns import SHARED, Turns

log = logging.getLogger(__name__)
Job = Callable[[threading.Event, Callable[[Any], None]], None]  # job(cancel, emit)
_ITEM, _DONE, _FAILED = "item", "done", "failed"
DISCONNECT_POLL_S = 0.25
JOB_HEADER = "X-SpecDeck-Job"


class EngineThread:
    """The one thread that every job of a server runs on, for the server's whole life.

    One thread, not one per job, because of OpenMP: llama.cpp's CPU backend (and torch's)
    keeps a pool of worker threads for each thread that decodes, and while more of those
    threads exist than there are cores, libgomp stops spinning at its barriers and sleeps
    instead, thousands of times a second. A model loaded on the main thread and a reply
    decoded on a thread of its own made 3 such threads on a 2-core machine: the server
    decoded at 40 tok/s where `specdeck-cli generate` decodes at 65
    (docs/benchmarks.md, "One decoding thread for the server's jobs").
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._work, name="specdeck-engine", daemon=True).start()

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` on the engine's thread, after the jobs submitted before it."""
        self._jobs.put(job)

    def call(self, function: Callable[[], Any]) -> Any:
        """`function()` on the engine's thread, waited for here: its result, or what it raised."""
        future: Future = Future()

        def job() -> None:
            try:
                future.set_result(function())
            except BaseException as error:  # noqa: BLE001 - raised again in the caller
                future.set_exception(error)

        self.submit(job)
        return future.result()

    def _work(self) -> None:
        while True:
            self._jobs.get()()  # each job catches what it raises (Host.run's target, call's job)


class Host:
    def __init__(
        self, engine=None, *, queue_limit: int = 8, thread: EngineThread | None = None, reload_after_jobs: bool = True
    ) -> None:
        self.engine = engine  # an engine.Engine, or None until one is loaded
        # Load the pair again after a job that freed it (routes_jobs): a shared server's other clients
        # need it. The app's own engine leaves that to its one client, which reloads when it wants.
        self.reload_after_jobs = reload_after_jobs
        self.thread = thread or EngineThread()  # where every job runs; the one that loaded `engine`, if given
        self.queue_limit = queue_limit
        self.waiting = 0
        self.batch_loop = BatchLoop(self)  # the generations decoding together (--parallel N > 1)
        self._turns = Turns(self._parallel)
        self._running: dict[int, tuple[str, threading.Event]] = {}  # id(cancel) -> (job name, cancel event)
        self._named: dict[str, threading.Event] = {}  # job id -> cancel event, running or waiting

    @property
    def job_name(self) -> str | None:
        """What the running job is doing ("load", "generate"...; the first of several generations), None when idle."""
        return next(iter(self._running.values()), (None,))[0]

    @property
    def running(self) -> int:
        """Jobs holding the engine: 0 or 1, or up to --parallel generations decoding together."""
        return len(self._running)

    def _parallel(self) -> int:
        """Generations the loaded engine decodes together (its config's --parallel), 1 without one."""
        return getattr(getattr(self.engine, "config", None), "parallel", 1)

    @property
    def status(self) -> str:
        """ "loading" while a load runs, "busy" while another job runs, else "idle"."""
        if self.job_name is None:
            return "idle"
        return "loading" if self.job_name == "load" else "busy"

    # -- the loaded pair (on the engine's thread, inside a job) ---------------------------------------

    def replace(self, config, progress=None) -> None:
        """Load `config` in place of the loaded pair. The old pair is freed first (two pairs at once
        is how memory runs out); when the new one fails to load, the old one is loaded again, so a
        bad request never leaves every client without a model, and the error says so."""
        from engine.api import Engine, load_summary  # loads torch: only when a model is asked for
        from engine.service.capacity import check_parallel

        load_summary(config)  # a target that cannot be found is said before anything is freed
        check_parallel(config)  # so is a --parallel that cannot be served
        old = self.free()
        try:
            self.engine = Engine.load(config, progress=progress)
        except BaseException as error:
            if old is not None:
                _add_sentence(error, self.restore(old))
            raise

    def free(self):
        """Close the loaded pair; its config (None when nothing was loaded)."""
        if self.engine is None:
            return None
        old, self.engine = self.engine, None
        old.close()
        return old.config

    def restore(self, config) -> str:
        """Load `config` again after a job that needed the memory (a failed load, a training); a
        sentence that says how it went, for the job's last word."""
        from engine.api import Engine

        try:
            self.engine = Engine.load(config)
        except Exception as error:  # noqa: BLE001 - said to the client; the server stays up without a pair
            log.warning("the pair that was loaded could not be loaded again: %s", error)
            return f"The pair loaded before could not be loaded again ({error}): load one (POST /specdeck/load)."
        return f"The pair loaded before ({self.engine.target.info.name}) was loaded again and answers as before."

    def cancel(self, job_id: str | None = None) -> bool:
        """Ask job `job_id` (default: the running ones) to stop at its next step, or a waiting one to
        end as soon as its turn comes; False when there is no such job. A generation decoding beside
        others stops alone: theirs go on."""
        if job_id is None:
            events = [cancel for _, cancel in self._running.values()]
        else:
            events = [self._named[job_id]] if job_id in self._named else []
        for cancel in events:
            cancel.set()
        return bool(events)

    def run(self, name: str, job: Job, request=None, *, time_limit_s: float | None = None) -> AsyncIterator[Any]:
        """Run `job` once the engine is free, with the engine to itself; yield what it emits. Raises what
        the job raised.

        `request` (a Starlette request): when its client disconnects, the job is cancelled, while it
        waits too (a job whose client has gone never starts); its JOB_HEADER names the job for
        `cancel`. `time_limit_s`: the job is cancelled that long after it starts.
        """
        return self._serve(name, job, None, request, time_limit_s)

    def generate(
        self, start: Start, request=None, *, name: str = "generate", time_limit_s: float | None = None
    ) -> AsyncIterator[Any]:
        """A generation (batch_loop.py `Start`), as `run` runs a job: alone (`run_alone`) on an engine
        that decodes one sequence at a time, else beside the others in the batch (`BatchLoop`)."""

        def alone(cancel: threading.Event, emit: Callable[[Any], None]) -> None:
            from engine.service.http import require_engine

            run_alone(require_engine(self), start, cancel, emit)

        return self._serve(name, alone, start, request, time_limit_s)

    async def _serve(
        self, name: str, job: Job, start: Start | None, request, time_limit_s: float | None
    ) -> AsyncIterator[Any]:
        """`run` and `generate`: `start` given, the job may share the engine with other generations."""
        turns, may_share = self._turns, start is not None
        if not turns.free_now(may_share) and self.waiting >= self.queue_limit:
            raise ServerBusy(
                f"The server is busy: {self.waiting} requests are already waiting for the engine. Try again later."
            )
        cancel, gone = threading.Event(), threading.Event()  # gone: nobody reads what the job would make
        job_id = request.headers.get(JOB_HEADER) if request is not None else None
        if job_id:
            self._named[job_id] = cancel
        watcher = asyncio.create_task(_watch(request, cancel, gone)) if request is not None else None
        self.waiting += 1
        try:
            mode = await turns.take(may_share)
        except BaseException:
            self._named.pop(job_id, None)
            if watcher is not None:
                watcher.cancel()
            raise
        finally:
            self.waiting -= 1
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()
        self._running[id(cancel)] = (name, cancel)
        timer = loop.call_later(time_limit_s, cancel.set) if time_limit_s is not None else None

        def put(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(items.put_nowait, (kind, value))
            except RuntimeError:  # the loop has closed: the server is shutting down
                cancel.set()

        def finish(kind: str, value: Any) -> None:
            # The engine is free before the request hears the job's end: a client that sends its
            # next request the moment a reply ends finds the server idle, not still busy.
            self._running.pop(id(cancel), None)
            self._named.pop(job_id, None)
            turns.give_back(mode)
            items.put_nowait((kind, value))

        def ended(error: BaseException | None) -> None:
            """The job's end, heard on the engine's thread."""
            try:
                loop.call_soon_threadsafe(finish, *((_DONE, None) if error is None else (_FAILED, error)))
            except RuntimeError:  # the loop has closed: the server is shutting down
                pass

        def target() -> None:
            error = None
            try:
                if gone.is_set():  # its client left while it waited: it never starts
                    return
                self.batch_loop.close()  # the engine alone: a batch's slots are freed first
                job(cancel, lambda value: put(_ITEM, value))
            except BaseException as failure:  # noqa: BLE001 - handed to the request, which says it
                error = failure
            finally:
                ended(error)

        # Handed on inside the try: whatever happens to the request from here, the job is cancelled
        # or ends, and the turn is given back once the engine's thread is done with it.
        try:
            if mode == SHARED:
                self.batch_loop.add(Member(start, cancel, gone, lambda value: put(_ITEM, value), ended))
            else:
                self.thread.submit(target)
            while True:
                kind, value = await items.get()
                if kind == _DONE:
                    return
                if kind == _FAILED:
                    raise value
                yield value
        finally:
            gone.set()
            cancel.set()  # a no-op once the job has ended; else the request went away
            if watcher is not None:
                watcher.cancel()
            if timer is not None:
                timer.cancel()


def _add_sentence(error: BaseException, sentence: str) -> None:
    """Append `sentence` to an error's message (its first argument, when that is the message)."""
    if error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]} {sentence}", *error.args[1:])


async def _watch(request, cancel: threading.Event, gone: threading.Event) -> None:
    """Cancel the job when the client disconnects (a non-streaming request notices nothing else)."""
    while not gone.is_set():
        if await request.is_disconnected():
            gone.set()
            cancel.set()
            return
        await asyncio.sleep(DISCONNECT_POLL_S)
