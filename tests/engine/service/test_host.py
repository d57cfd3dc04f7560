"""`Host`'s jobs all run on one thread, the one a server loaded its model on.

Why it matters (engine/service/host.py, `EngineThread`): llama.cpp and torch keep an
OpenMP pool per decoding thread, and with more pool threads than cores libgomp sleeps
at every barrier; a server that loaded on one thread and decoded on others ran at
two thirds of the CLI's speed.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine.service.host import EngineThread, Host


def _run(host: Host, name: str, job) -> list:
    async def collect() -> list:
        return [item async for item in host.run(name, job)]

    return asyncio.run(collect())


def test_every_job_runs_on_the_thread_the_model_was_loaded_on():
    thread = EngineThread()
    loaded_on = thread.call(threading.current_thread)
    host = Host(object(), thread=thread)

    def job(cancel, emit) -> None:
        emit(threading.current_thread())

    assert _run(host, "generate", job) == [loaded_on]
    assert _run(host, "compare", job) == [loaded_on]
    assert loaded_on != threading.current_thread()  # and never the caller's (the event loop's)


def test_a_failing_job_leaves_the_thread_working_for_the_next():
    host = Host()

    def fails(cancel, emit) -> None:
        emit(threading.current_thread())
        raise RuntimeError("llama.cpp could not decode")

    failed_on = []
    with pytest.raises(RuntimeError, match="could not decode"):
        asyncio.run(_collect_into(host.run("generate", fails), failed_on))
    assert _run(host, "generate", lambda cancel, emit: emit(threading.current_thread())) == failed_on


def test_call_raises_what_the_function_raised():
    thread = EngineThread()
    with pytest.raises(FileNotFoundError, match="no such model"):
        thread.call(lambda: (_ for _ in ()).throw(FileNotFoundError("no such model")))
    assert thread.call(lambda: 42) == 42


async def _collect_into(items, out: list) -> None:
    async for item in items:
        out.append(item)
