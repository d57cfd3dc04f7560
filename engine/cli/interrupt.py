"""Ctrl+C on the command line: exit at once, with status 130 and one line "cancelled".

Python's own handler raises KeyboardInterrupt wherever the main thread happens to
be, and in three places that cannot be made safe from outside: inside an import
(torch or numpy stay half imported, and a library that swallows the interrupt then
fails with an AttributeError), inside a Python function that C++ called (pybind11
turns the exception into std::terminate: SIGABRT) and inside a ctypes callback
from llama.cpp (printed as a traceback, then ignored). The command line keeps no
state worth saving, so the handler ends the process itself: `os._exit` runs no
destructor and no atexit hook that could abort on the way out.

What an exit could spoil is output half written, so a command writes its final
JSON (to stdout or to a file) inside `held()`: an interrupt that arrives there
waits until the write is done. Text streamed so far is flushed, never lost.
`train-heads` replaces this handler with its own while it trains (the first
Ctrl+C saves a checkpoint) and comes back to `exit_cancelled` for the second;
`chat` does the same while a reply streams (`interrupt_sets`: Ctrl+C stops the reply).

The handler goes in as the first statement of `engine/__init__.py` when the process
is specdeck-cli (`exit_quietly_in_program`): the console script's
`from engine.cli.main import main` runs that file first, so every startup import
(engine.cli.main's, argparse's, then torch's and llama.cpp's in the commands) is
covered. What comes before it, the interpreter's start and site-packages, is
Python's own: an interrupt there still ends the Python way.
"""

from __future__ import annotations

# Only modules that site-packages has already imported: the console script imports this
# module before it installs the handler, and every millisecond here is one without it.
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.cli.terminal import isatty

EXIT_CANCELLED = 130  # 128 + SIGINT, what a shell reports for a process stopped by Ctrl+C

_held = 0  # depth of held() blocks
_pending = False  # an interrupt arrived inside held()
_stderr_fd: int | None = None  # a copy of fd 2: llama.cpp points fd 2 at /dev/null while it loads


def started_as_program() -> bool:
    """True in the specdeck-cli process itself (its console script), not where Python code
    imports the command line (tests, scripts)."""
    return Path(sys.argv[0] if sys.argv else "").stem == "specdeck-cli"


def exit_quietly_in_program() -> None:
    """In the specdeck-cli process, install the handler for good (`import engine` calls this first);
    elsewhere (the app, tests, scripts that import the engine) leave Ctrl+C alone."""
    if started_as_program():
        exit_on_interrupt()


def exit_on_interrupt() -> Callable[[], None]:
    """Install the handler (main thread only); return a function that puts the previous one back."""
    global _stderr_fd
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is _on_interrupt:
        return lambda: None
    _stderr_fd = os.dup(2)
    previous = signal.signal(signal.SIGINT, _on_interrupt)

    def restore() -> None:
        global _stderr_fd
        signal.signal(signal.SIGINT, previous)
        if _stderr_fd is not None:
            os.close(_stderr_fd)
            _stderr_fd = None

    return restore


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold interrupts back while the block writes output that must not be cut in half."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if _held == 0 and _pending:
            exit_cancelled()


def exit_cancelled() -> None:
    """Flush what was written, say "cancelled" on stderr and end the process with status 130."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe, or a flush already under way in the interrupted code
            pass
    interactive = any(isatty(s) for s in (sys.stdout, sys.stderr))
    # On a terminal: clear the line (a "loading…" line, or the reply so far ends above).
    message = ("\n\r\033[Kcancelled\n" if interactive else "cancelled\n").encode()
    try:
        os.write(_stderr_fd if _stderr_fd is not None else 2, message)
    except OSError:
        pass
    os._exit(EXIT_CANCELLED)


def _on_interrupt(signum, frame) -> None:
    global _pending
    if _held:
        _pending = True
        return
    exit_cancelled()


@contextlib.contextmanager
def interrupt_sets(cancel: threading.Event) -> Iterator[None]:
    """Inside the block the first Ctrl+C sets `cancel` (the run under way stops after its
    step) instead of ending the process; a second one ends it as usual. Main thread only:
    elsewhere Python cannot install a handler, and the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_interrupt(signum, frame) -> None:
        if cancel.is_set():
            exit_cancelled()
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
