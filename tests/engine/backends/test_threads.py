"""Decoding threads follow the cores other processes leave free, measured before each generation."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import llama_cpp
import pytest

from engine.backends import threads
from engine.backends.llama_cpp import LlamaCppBackend
from engine.backends.threads import CoreCount, decode_threads, free_cores, measure
from engine.core.decode import decode_steps
from engine.core.sampling import SamplingConfig
from engine.drafters.model import ModelDrafter
from tests.factories.gguf_models import default_gguf_path

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two_cores = pytest.mark.skipif(
    len(ALLOWED) < 2 or not os.path.exists("/proc/stat"), reason="needs /proc/stat and two allowed cores"
)


@pytest.fixture(autouse=True)
def fresh_measurement(monkeypatch):
    threads.forget()
    monkeypatch.setattr(threads, "_companions", set())
    yield
    threads.forget()


def _spinner(core: int) -> subprocess.Popen:
    """Another process that keeps `core` busy; returns once it has spun for a while."""
    code = f"import os, sys; os.sched_setaffinity(0, {{{core}}}); print(flush=True)\nwhile True: pass"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    child.stdout.readline()  # pinned and about to spin
    time.sleep(0.2)
    return child


# -- the measurement -------------------------------------------------------------------


@needs_two_cores
def test_a_core_another_process_keeps_busy_is_not_free():
    child = _spinner(ALLOWED[-1])
    try:
        seen = [free_cores() for _ in range(3)]
    finally:
        child.kill()
        child.wait()
    assert all(1 <= n < len(ALLOWED) for n in seen), seen


@needs_two_cores
def test_the_engines_own_busy_threads_do_not_count_as_taken():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    spinning = threading.Thread(target=spin, daemon=True)
    spinning.start()
    try:
        for _ in range(10):  # others share this machine: wait for a moment they leave it quiet
            stop.set()
            spinning.join()
            quiet = free_cores()
            stop.clear()
            spinning = threading.Thread(target=spin, daemon=True)
            spinning.start()
            time.sleep(0.02)
            if quiet == len(ALLOWED):
                assert free_cores() == len(ALLOWED)  # our own spinning thread runs on one of them
                return
        pytest.skip("other processes kept a core busy for the whole test")
    finally:
        stop.set()
        spinning.join()


@needs_two_cores
def test_the_window_whose_engine_this_is_counts_as_the_engines_own():
    """The app's window is busy for a moment at each Send, as the engine measures: its CPU must
    not cost the reply a thread (it did: 1 of 2 threads, the app at 0.7x the CLI's speed)."""
    window = _spinner(ALLOWED[-1])
    try:
        assert free_cores() < len(ALLOWED)  # another program, until the engine is told whose it is
        threads.add_companion(window.pid)
        for _ in range(10):  # others share this machine: wait for a moment they leave it quiet
            if free_cores() == len(ALLOWED):
                return
        pytest.skip("other processes kept a core busy for the whole test")
    finally:
        window.kill()
        window.wait()


def test_a_companion_that_has_ended_counts_nothing():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    threads.add_companion(child.pid)
    assert threads._companion_seconds() == 0.0
    threads.add_companion(os.getpid())  # a live one: its CPU time so far
    assert threads._companion_seconds() > 0.0


def _fake_stat(path, busy_ticks: list[int], idle_ticks: list[int]) -> None:
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{i} {b} 0 0 {d} 0 0 0 0 0 0" for i, (b, d) in enumerate(zip(busy_ticks, idle_ticks))]
    path.write_text("\n".join(lines + ["intr 0"]) + "\n")


@pytest.mark.parametrize(
    ("others_s", "own_s", "free"),
    [(0.0, 0.0, 2), (1.0, 0.0, 1), (0.0, 2.0, 2), (1.0, 1.0, 1), (2.0, 0.0, 1), (0.3, 0.0, 2), (0.6, 0.0, 1)],
)
def test_others_load_is_the_cores_busy_time_less_our_own(tmp_path, monkeypatch, others_s, own_s, free):
    """Over a 1 s window of 2 cores: busy time (from /proc/stat) less this process's CPU time
    is the others' load; a core of it or more (rounded at half a core) is taken; at least 1 is free."""
    tick = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    _fake_stat(stat, [0, 0], [0, 0])
    monkeypatch.setattr(threads, "_PROC_STAT", str(stat))
    monkeypatch.setattr(threads, "allowed_cpus", lambda: {0, 1})
    clock = {"wall": 100.0, "cpu": 5.0}
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock["wall"])
    monkeypatch.setattr(threads.time, "process_time", lambda: clock["cpu"])

    def window(_s):
        busy = round((others_s + own_s) * tick)
        _fake_stat(stat, [busy // 2, busy - busy // 2], [tick - busy // 2, tick - (busy - busy // 2)])
        clock["wall"] += 1.0
        clock["cpu"] += own_s

    monkeypatch.setattr(threads.time, "sleep", window)
    assert measure() == CoreCount(2, free, measured=True)


def test_without_proc_stat_every_allowed_core_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "_PROC_STAT", str(tmp_path / "missing"))
    assert measure() == CoreCount(threads._allowed_count(), threads._allowed_count(), measured=False)
    monkeypatch.setattr(threads, "allowed_cpus", lambda: None)  # macOS, Windows
    assert measure().free == (os.cpu_count() or 1)


def test_a_measurement_is_short_and_reused_for_generations_that_follow_quickly(monkeypatch):
    start = time.perf_counter()
    first = threads.current()
    assert time.perf_counter() - start < 0.15
    calls = []
    monkeypatch.setattr(threads, "measure", lambda: calls.append(1) or CoreCount(2, 1, True))
    assert threads.current() is first and not calls
    threads.forget()
    assert decode_threads(None) == 1 and len(calls) == 1


def test_a_thread_count_the_user_chose_is_kept(monkeypatch):
    monkeypatch.setattr(threads, "measure", lambda: CoreCount(2, 1, True))
    assert decode_threads(3) == 3
    assert decode_threads(None) == 1
    assert decode_threads(None, cap=1) == 1
    monkeypatch.setattr(threads, "measure", lambda: CoreCount(16, 16, True))
    threads.forget()
    assert decode_threads(None) == threads.MAX_DEFAULT_THREADS


# -- before each generation ---------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    backend = LlamaCppBackend(default_gguf_path(), n_ctx=256)
    yield backend
    backend.close()


def _free(monkeypatch, n: int) -> None:
    monkeypatch.setattr(threads, "measure", lambda: CoreCount(4, n, True))
    threads.forget()


def _generate(backend, drafter=None) -> None:
    prompt = backend.tokenize("The lighthouse keeper found a bottle")
    list(decode_steps(backend, prompt, SamplingConfig(max_tokens=4, temperature=0.0), drafter=drafter))


def test_each_llama_generation_decodes_with_the_cores_free_when_it_starts(llama, monkeypatch):
    _free(monkeypatch, 1)
    _generate(llama)
    assert llama_cpp.llama_n_threads(llama._ctx) == llama_cpp.llama_n_threads_batch(llama._ctx) == 1 == llama.n_threads
    _free(monkeypatch, 2)
    _generate(llama)
    assert llama_cpp.llama_n_threads(llama._ctx) == llama_cpp.llama_n_threads_batch(llama._ctx) == 2 == llama.n_threads


def test_a_llama_draft_models_threads_follow_too(llama, monkeypatch):
    _free(monkeypatch, 2)
    _generate(llama)
    _free(monkeypatch, 1)
    ModelDrafter(llama, llama.vocab_size).reset()  # what decode_steps calls at the start
    assert llama_cpp.llama_n_threads(llama._ctx) == 1


def test_threads_given_at_load_stay_whatever_the_load(monkeypatch):
    _free(monkeypatch, 1)
    fixed = LlamaCppBackend(default_gguf_path(), n_ctx=256, n_threads=2)
    try:
        _generate(fixed)
        assert llama_cpp.llama_n_threads(fixed._ctx) == llama_cpp.llama_n_threads_batch(fixed._ctx) == 2
    finally:
        fixed.close()


@needs_two_cores
def test_a_llama_generation_with_a_core_busy_elsewhere_uses_one_thread_fewer(llama):
    child = _spinner(ALLOWED[-1])
    try:
        _generate(llama)
    finally:
        child.kill()
        child.wait()
    assert 1 <= llama.n_threads < len(ALLOWED)
    assert llama_cpp.llama_n_threads(llama._ctx) == llama.n_threads


def test_torch_threads_follow_the_free_cores_up_to_torchs_own_count(monkeypatch):
    import torch

    from engine.backends.hf import base as hf

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        _free(monkeypatch, 1)
        hf.HFBackend.prepare_threads(None)  # it reads no model state: the count is process-wide
        assert torch.get_num_threads() == 1
        _free(monkeypatch, 64)
        hf.HFBackend.prepare_threads(None)
        assert torch.get_num_threads() == hf._TORCH_THREADS
        monkeypatch.setenv("OMP_NUM_THREADS", str(hf._TORCH_THREADS))  # the user's count: left alone
        _free(monkeypatch, 1)
        hf.HFBackend.prepare_threads(None)
        assert torch.get_num_threads() == hf._TORCH_THREADS
    finally:
        torch.set_num_threads(before)


def test_torch_threads_follow_llamas_so_none_spins_beside_it(llama, monkeypatch):
    """Each step's logits go through torch: with one core free, a second torch thread would
    spin after every op on the core llama.cpp's one thread decodes on."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _free(monkeypatch, 1)
        _generate(llama)
        assert llama.n_threads == torch.get_num_threads() == 1
        fixed = LlamaCppBackend(default_gguf_path(), n_ctx=256, n_threads=1)  # --threads 1, on a quiet machine
        try:
            torch.set_num_threads(2)
            _free(monkeypatch, 2)
            _generate(fixed)
            assert torch.get_num_threads() == 1
        finally:
            fixed.close()
    finally:
        torch.set_num_threads(before)
