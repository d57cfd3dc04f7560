"""The one object that owns the engine: a local engine process, and the jobs it runs there.

The engine decodes in a process of its own (`engine.EngineProcess`: a private
server on a loopback port with a random key), not in the window's: its threads
get the cores without the GUI in their way, and an engine that dies takes
nothing else with it. This process imports no torch and no llama.cpp; it only
reads the event stream (`engine.EngineClient`).

Views never touch the engine. They call `load`, `chat`, `compare` or `stop`
here, and listen to signals that arrive on the GUI thread. Every job runs on a
worker thread through one `TaskRunner`, so the window never has more than one
request at the server: a new request cancels the running one (the server stops
it at its next step) and starts once the old thread has ended. The process
starts with the first load, inside that job, so the GUI never waits for it.

A reply and a comparison are one path (`_run`, by its kind). Each step is the
engine's record (`StepEvent`), with what the engine copied beside it, between two
steps, on its own thread: its run, the drafter's statistics and the cost model's
`CostSnapshot`. The window gets them in the batches the server sent them in
(`sig_steps`), four to ten a second: each hand-over wakes the GUI thread, which
takes a core from the engine for a moment. What the window shows about the loaded
pair is the server's `LoadedPair`.

Every `SpecDeckError` becomes `sig_error` with the engine's own message; any
other exception is a bug, reported the same way with its type so that the
window survives it. When the engine process dies (killed, out of memory, a C++
abort), the job that was using it ends with what it had streamed, the window
hears `sig_engine_stopped` with the process's own account of its end, nothing
is loaded any more, and the next reply or comparison starts the process again
and loads the same pair first (a load like any other, with its progress).

Other work on the engine (the benchmark) runs through `lend`, in turn with
everything else: today in this process, after the engine process has freed its
models, so that the machine never holds two copies of them; or, `on_server`,
on the engine process itself, through its client.

The pair dialog's check (`preflight`) runs in the engine process too, since it
reads devices through torch and llama.cpp; not as a job, but at once, beside
whatever runs (it reads metadata only), from the dialog's own worker thread. It
starts the engine process when none runs.

Where the pair runs is `choice` (an EngineChoice, from the pair dialog): the
engine process ("local"), or a server. On a SpecDeck server the same client
loads the same config there, and nothing starts here. llama-server, vLLM and
SGLang serve their own model: the load connects (`app/runtime/remote.py`),
`loaded` is a `ServerPair`, replies and comparisons go through the engine's
adapter, and their steps come without drafter statistics or costs; the
benchmark and training need an engine of SpecDeck's, and `lend` says so. A
server that cannot be reached, or breaks off a reply, is an error like any
other (what was shown stays), and the next reply connects again first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from app.runtime import remote
from app.runtime.worker import GeneratorWorker, TaskRunner
from app.shell.settings import LOCAL, EngineChoice
from engine import (
    EngineClient,
    EngineConfig,
    EngineProcess,
    EngineUnavailable,
    LoadedPair,
    SamplingConfig,
    SpecDeckError,
    decodes_on_cpu,
)

LOAD, CHAT, COMPARE = "load", "chat", "compare"
DEATH_WAIT_S = 3.0  # a dropped connection waits this long for the process to be seen gone
log = logging.getLogger(__name__)


def shares_cores(pair, own_engine: bool) -> bool:
    """Whether `pair` decodes on the cores the window runs on: the window's own engine (`own_engine`),
    on the CPU. There the engine takes every core, and its threads wait for each other at every
    barrier: each moment the window takes stalls them all, so the engine loses about twice the
    window's share. On a GPU, or on a server elsewhere, the window's moments cost the engine nothing."""
    return own_engine and isinstance(pair, LoadedPair) and decodes_on_cpu(pair.target.device)


class EngineStopped(EngineUnavailable):
    """The engine process ended while a job used it (or between two jobs)."""


class NotLoaded(SpecDeckError):
    """A reply or comparison was asked for with no pair loaded."""


class EngineController(QObject):
    """Runs the engine process, loads pairs there, and runs chat replies and comparisons, one at a time."""

    sig_load_progress = Signal(str, float)
    """What loading is doing (as the engine process reports it), and the fraction done."""

    sig_load_started = Signal(object)
    """A load began on the worker thread (its EngineConfig): also the reload after the engine stopped."""

    sig_loaded = Signal(object)
    """An engine is ready; the argument is its EngineConfig (and `loaded` says the rest)."""

    sig_unloaded = Signal(object)
    """The engine's models were freed for a job that loads its own (`lend`); the argument is the
    freed pair's EngineConfig, for loading it again afterwards."""

    sig_run_started = Signal(str)
    """A chat reply ("chat") or a comparison ("compare") started decoding."""

    sig_steps = Signal(object)
    """Decoding steps, in order, a batch at a time, as the server sent them (ten a second, four where
    the engine decodes on the CPU): a list of `StepEvent`s, each with its run, and what the engine
    copied just after it: the drafter's statistics and the cost model. Listeners do their work once
    per batch."""

    sig_run_finished = Signal(str, object)
    """A run ended: its kind and its result (GenerationResult / Comparison), None if it failed."""

    sig_load_failed = Signal(str)
    """Loading failed, with the message for the user; no engine is loaded now."""

    sig_busy_changed = Signal(bool)
    """Whether a job is running or queued."""

    sig_error = Signal(str)
    """A run failed: a message for the user, saying what went wrong and what to do."""

    sig_engine_stopped = Signal(str)
    """The engine process ended on its own, under a run or between two: what happened, for the
    user (emitted before the sig_error and sig_run_finished of the run it cut). A load it cuts
    says so with sig_load_failed instead."""

    def __init__(self, parent: QObject | None = None, process: EngineProcess | None = None) -> None:
        """`process`: an engine process to use (and leave running at shutdown), e.g. one the tests
        share between windows; by default the controller starts its own and stops it at shutdown."""
        super().__init__(parent)
        self.process = process if process is not None else EngineProcess()
        self._owns_process = process is None
        self.loaded: LoadedPair | remote.ServerPair | None = None  # what the engine holds for this window; GUI thread
        self.config: EngineConfig | None = None  # the pair asked for last: loaded again after a stop
        self.choice: EngineChoice = LOCAL  # where it runs: the engine process, or a server (set by load)
        self._server = None  # with a remote choice: the EngineClient or adapter that loaded `loaded`
        self._restart = False  # the engine stopped under a run: the next run loads `config` first
        self._loaded_pid: int | None = None  # the engine process that loaded the local pair
        self._unseen_stop = ""  # how that process ended, when a check started another before a run saw it
        self._load_failed = False  # the last load failed: a run queued behind it adds no second error
        self._runner = TaskRunner(self)
        self._runner.sig_started.connect(self._on_started)
        self._runner.sig_done.connect(self._on_done)
        self._busy = False

    # -- state -------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._runner.busy

    @property
    def loading(self) -> bool:
        current = self._runner.current
        return current is not None and current.name == LOAD

    @property
    def speculative(self) -> bool:
        """Whether chat replies are decoded speculatively (there is a drafter)."""
        return self.loaded is not None and self.loaded.speculative

    @property
    def client(self) -> EngineClient | None:
        """The engine process's client while it runs (for jobs on the worker thread)."""
        return self.process.client if self.process.running else None

    @property
    def retries(self) -> bool:
        """A server could not be reached: the next reply or comparison connects (and loads) again first."""
        return self._restart and self.choice.remote

    # -- requests ----------------------------------------------------------------------

    def load(self, config: EngineConfig, choice: EngineChoice | None = None) -> None:
        """Load `config` where `choice` says (default: where the last load did): in the engine
        process (started first if it is not running; it frees the old pair before it loads the
        new one), on a SpecDeck server, or, for llama-server, vLLM or SGLang, connect to the
        server's own pair (`config` is then kept only for a later local load)."""
        if choice is not None:
            self.choice = choice
        choice = self.choice
        self.config, self._restart, self._load_failed = config, False, False
        self._close_server()
        self.loaded = self._server = None  # at once: nothing new may use the old pair

        def job(cancel: threading.Event, report):
            def progress(message: str, fraction: float) -> None:
                report((message, fraction))

            if not choice.remote:
                client = self._started_client()
                return None, self._call(lambda: client.load(config, progress=progress))
            self._free_local()  # a remote pair: the machine need not hold a local one too
            report((f"Connecting to the {choice.label()} at {choice.url}", 0.0))
            if choice.adapter:
                return remote.connect(choice)
            client = remote.server_client(choice)
            return client, client.load(config, progress=progress)

        self._start(LOAD, job, config)

    def chat(self, messages: list[dict], sampling: SamplingConfig) -> None:
        self._run(CHAT, messages, sampling)

    def compare(self, messages: list[dict], sampling: SamplingConfig) -> None:
        """Both runs of the side by side, always greedy (`SamplingConfig.as_greedy`): identical outputs are
        what it shows, whatever temperature the chat samples at."""
        self._run(COMPARE, messages, sampling.as_greedy())

    def _run(self, kind: str, messages: list[dict], sampling: SamplingConfig) -> None:
        """A reply (CHAT) or a comparison (COMPARE) on the loaded pair; its batches of steps go to
        `sig_steps` as they arrive."""
        self._restart_if_stopped()

        def job(cancel: threading.Event, report):
            client = self._loaded_client()
            run = client.compare if kind == COMPARE else client.generate
            return self._call(
                lambda: run(messages, sampling, cancel=cancel, on_steps=report), local=client is not self._server
            )

        self._start(kind, job)

    @property
    def shares_cores(self) -> bool:
        """Whether the loaded pair decodes on the cores this window runs on (its own engine, on the
        CPU): what the window does meanwhile is taken from the engine (`shares_cores`)."""
        return shares_cores(self.loaded, own_engine=not self.choice.remote)

    def preflight(self, config: EngineConfig):
        """`engine.preflight(config)` in the engine process (started first if it is not running) ->
        Preflight; on any thread but the GUI's (the pair dialog's worker), at once, beside a running
        job. Raises EngineUnavailable when the process cannot start, EngineStopped when it ends
        during the check. Wherever the pair runs, this checks this computer's files."""
        if (
            not self.process.running
            and self.process.pid is not None
            and self.loaded is not None
            and not self.choice.remote
        ):
            # The process that held the window's pair has ended unseen: the next run says how.
            self._unseen_stop = self.process.death_message()
        client = self.process.ensure()
        return self._call(lambda: client.preflight(config))

    def lend(
        self,
        name: str,
        config: EngineConfig,
        job: Callable[[Any, threading.Event, Any], Any],
        connect: Callable[[GeneratorWorker], None],
        *,
        on_server: bool = False,
    ) -> GeneratorWorker:
        """Run `job(lent, cancel, report)` on the worker thread, in turn with loads and replies (a
        running reply is cancelled first, as by any new request); returns its worker. Its signals
        are the caller's: `connect(worker)` connects them before it starts (this controller reports
        none of them).

        By default `lent` is None and the job loads `config` itself, in this process: the engine
        process frees its models first (sig_unloaded with the freed pair, when the window had
        one), so the machine never holds two copies of them. With `on_server`, `lent` is the
        engine process's EngineClient (the process is started if need be) and nothing is freed:
        the job runs its work there; if it leaves another pair loaded than the window's, the
        window's counts as freed (sig_unloaded once the job has ended, or as soon as the job's
        caller hears it and calls `freed_by_job`).

        On a SpecDeck server (`choice`), `lent` is that server's client. Raises SpecDeckError while
        a load waits behind a running job (only the newest request waits, and the load must not be
        lost), and where the window runs on llama-server, vLLM or SGLang, which run no SpecDeck job.
        """
        if self.choice.adapter:
            what = (
                "Training"
                if name.startswith("train")
                else {"bench": "The benchmark", "autotune": "Auto-tune"}.get(name, "This job")
            )
            raise SpecDeckError(
                remote.NEEDS_ENGINE.format(what=what, server=f"the {self.choice.label()} at {self.choice.url}")
            )
        pending = self._runner.pending
        if pending is not None and pending.name == LOAD:
            raise SpecDeckError("The window is about to load a model pair: try again once it has loaded.")
        held: list[LoadedPair | None] = []  # the window's pair when the job started
        after: list[LoadedPair | None] = []  # on_server: what the engine process holds once it ended

        def prepare() -> None:  # on the GUI thread, when no job runs (TaskRunner._launch)
            held.append(self.loaded)
            if not on_server and self.loaded is not None:
                self.loaded = None
                self.sig_unloaded.emit(held[0].config)

        def run(cancel: threading.Event, report):
            if on_server:
                client = self._started_client()
                try:
                    return self._call(lambda: job(client, cancel, report), local=not self.choice.remote)
                finally:
                    try:
                        after.append(client.loaded())
                    except SpecDeckError:
                        after.append(None)
            client = self.client if not self.choice.remote else None  # a server's pair is not ours to free
            if client is not None:
                try:
                    client.unload()
                except EngineUnavailable:
                    pass  # the process has ended: it holds nothing
            return job(None, cancel, report)

        def finished() -> None:  # on the GUI thread, after the job's own signals
            if not on_server or not held or held[0] is None or self.loaded is not held[0]:
                return
            now = after[0] if after else None
            if now is None or now.config != held[0].config:
                self.loaded = None
                self.sig_unloaded.emit(held[0].config)

        worker = GeneratorWorker(run, name=name, prepare=prepare)
        connect(worker)
        worker.sig_finished.connect(finished)
        self._runner.start(worker)
        self._set_busy(True)
        return worker

    def freed_by_job(self, freed: EngineConfig) -> None:
        """On the GUI thread: a job lent the engine process (`lend(..., on_server=True)`) heard it
        free the window's pair (the client's `on_unloaded`, the job's first event): the window
        hears sig_unloaded now, while the job runs, rather than once it has ended."""
        if self.loaded is not None and self.loaded.config == freed:
            self.loaded = None  # lend's end then finds the pair already told freed
            self.sig_unloaded.emit(freed)

    def stop(self) -> None:
        """Stop the running generation and drop a queued one; a queued load still happens.

        A load cannot be interrupted (llama.cpp and transformers give no way to): a
        running one finishes, and only then does anything queued behind it start.
        """
        pending = self._runner.pending
        self._runner.cancel(keep_pending=pending is not None and pending.name == LOAD)

    def shutdown(self) -> None:
        """Stop everything, wait for the worker thread, stop the engine process (unless it was
        given to this controller). Call once, on close."""
        self._runner.shutdown()
        self.loaded = None
        self._close_server()
        if self._owns_process:
            self.process.stop()

    def _close_server(self) -> None:
        """What the last remote adapter started (llama-server's vanilla twin) stops with it. A running
        job still holding it ends first: TaskRunner cancels it before a new load starts."""
        if self._server is not None:
            self._server.close()

    # -- the engine process --------------------------------------------------------------

    def _started_client(self) -> EngineClient:
        """The engine process's client, the process started first if need be (with a SpecDeck server
        chosen, that server's client); on the worker thread."""
        if self.choice.remote:
            return remote.server_client(self.choice)
        return self.process.ensure()

    def _free_local(self) -> None:
        """On the worker thread, before a remote load: the engine process stops (or, one shared with
        this controller, frees its models)."""
        if not self.process.running:
            return
        if self._owns_process:
            self.process.stop()
            return
        try:
            self.process.client.unload()
        except EngineUnavailable:
            pass  # it has ended: it holds nothing

    def _loaded_client(self):
        """For a run: the client of the process that holds the window's pair, or the server's client
        or adapter; on the worker thread (`loaded` was set by the load before it, whose signals were
        handled before this job began)."""
        if self.loaded is None:
            raise NotLoaded("No model is loaded. Choose a model pair (Models ▸ Model pair…) and load it.")
        if self._server is not None:
            return self._server
        client = self.client
        if client is None:
            raise EngineStopped(self.process.death_message())
        return client

    def _call(self, call: Callable[[], Any], local: bool = True) -> Any:
        """`call()`, with a broken connection to a process that has ended told as its end
        (EngineStopped, saying how it ended) rather than as a network error. A server's errors
        (not `local`) are its client's own."""
        if not local:
            return call()
        try:
            return call()
        except EngineStopped:
            raise
        except EngineUnavailable as error:
            # The socket closes while the process exits: give the system a moment to say it has.
            deadline = time.monotonic() + DEATH_WAIT_S
            while self.process.running and time.monotonic() < deadline:
                time.sleep(0.02)
            if not self.process.running:
                raise EngineStopped(self.process.death_message()) from error
            raise

    def _restart_if_stopped(self) -> None:
        """Before a run (GUI thread): an engine process that ended since the last run is started
        again, and the window's pair loaded there, before the run starts."""
        if self.loaded is not None and not self.choice.remote and not self._holds_pair() and not self._runner.busy:
            # It ended between two runs: nothing reported it yet (a check may have started another since).
            self.loaded, self._restart = None, True
            message = f"{self._unseen_stop or self.process.death_message()} Starting it again."
            self._unseen_stop = ""
            self.sig_engine_stopped.emit(message)
            self.sig_error.emit(message)
        if self._restart and self.config is not None and (self.loaded is None or self.choice.remote):
            self.load(self.config)  # a server: connect again (a SpecDeck server's loaded pair answers at once)

    def _holds_pair(self) -> bool:
        """The engine process that loaded the window's pair still runs (not one started since)."""
        return self.process.running and self.process.pid == self._loaded_pid

    # -- plumbing ----------------------------------------------------------------------

    def _start(self, kind: str, job, config: EngineConfig | None = None) -> None:
        worker = GeneratorWorker(job, name=kind)
        worker.sig_yielded.connect(self._on_yielded)
        worker.sig_returned.connect(self._on_returned)
        worker.sig_errored.connect(self._on_errored)
        worker.config = config  # what a load loads (sig_load_started)
        self._runner.start(worker)
        self._set_busy(True)

    @Slot(object)
    def _on_started(self, worker: GeneratorWorker) -> None:
        if worker.name == LOAD:
            self.sig_load_started.emit(worker.config)
        elif worker.name in (CHAT, COMPARE):
            self.sig_run_started.emit(worker.name)

    # Worker signals are queued to this (GUI) thread. Only one worker runs at a time and
    # its signals are all delivered before the next one starts, so `current` says whose
    # signal this is.
    @Slot(object)
    def _on_yielded(self, value: Any) -> None:
        worker = self._runner.current
        if worker is None:
            return
        if worker.name == LOAD:
            self.sig_load_progress.emit(*value)
        else:
            self.sig_steps.emit(value)  # a batch of steps

    @Slot(object)
    def _on_returned(self, result: Any) -> None:
        worker = self._runner.current
        if worker is None:
            return
        if worker.name == LOAD:
            self._server, self.loaded = result
            self._loaded_pid = self.process.pid if self._server is None else None
            self._unseen_stop = ""
            self.sig_loaded.emit(self.loaded.config)  # None for a llama-server, vLLM or SGLang pair
        else:
            self.sig_run_finished.emit(worker.name, result)

    @Slot(object)
    def _on_errored(self, error: BaseException) -> None:
        worker = self._runner.current
        if isinstance(error, SpecDeckError):
            message = str(error)
        elif isinstance(error, MemoryError):
            message = "Out of memory. Choose smaller models, a shorter context, or close other programs."
        else:
            log.error("unexpected error in a %s job", worker.name if worker else "finished", exc_info=error)
            message = f"Unexpected error ({type(error).__name__}: {error}). Please report it."
        loading = worker is not None and worker.name == LOAD
        if self.choice.remote and remote.retried(error):
            self._restart = True  # the next reply connects again first
            message += " Everything shown so far is kept; Send tries again." if not loading else " Send tries again."
        if isinstance(error, NotLoaded) and self._load_failed and worker is not None:
            # Queued behind a load that failed (a Send that reconnected): the load has said why.
            self.sig_run_finished.emit(worker.name, None)
            return
        if isinstance(error, EngineStopped):
            self.loaded = None
            if not loading:  # a pair that had loaded: the next run loads it again (a load says it failed)
                self._restart = True
                message = f"{message} Everything shown so far is kept; Send starts it again."
                self.sig_engine_stopped.emit(message)
        if loading:
            self._load_failed = True
            self.sig_load_failed.emit(message)
            return
        self.sig_error.emit(message)
        if worker is not None:
            self.sig_run_finished.emit(worker.name, None)

    @Slot(object)
    def _on_done(self, worker: GeneratorWorker) -> None:
        self._set_busy(self._runner.busy)

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.sig_busy_changed.emit(busy)
