"""How many CPU threads to decode with: the cores that are free right now, not the cores there are.

llama.cpp's worker threads spin while they wait for each other at every barrier, so
when another process takes one of their cores, every thread waits for the one that
lost its core: on a 2-core machine with one core kept busy elsewhere, 2 threads decode at
less than half the speed of 1 (docs/benchmarks.md, "Measurements behind the code"). torch's OpenMP threads stall the same way. So before each generation the backends ask `decode_threads`,
which looks at how busy the allowed cores were over a short window and leaves out
those another process keeps busy. The engine's own CPU time (its threads) is
subtracted, and so is that of its companions (`add_companion`): the desktop window
whose private engine this is. A core we keep busy ourselves is ours to use: the
window is busy for a moment when Send is clicked, exactly while the engine measures,
and counted as another program it left the reply with one thread of two.

Light on purpose (no torch, no llama.cpp): the app and the CLI can import it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

MAX_DEFAULT_THREADS = 8  # CPU decoding is memory-bound: more threads stop helping
WINDOW_S = 0.08  # long enough for ~8 clock ticks per core at 100 Hz, short enough per generation
CACHE_S = 1.5  # generations that follow each other quickly reuse the last decision
BUSY_SHARE = 0.5  # a core counts as taken when other processes use at least this share of it

_PROC_STAT = "/proc/stat"
_companions: set[int] = set()


def add_companion(pid: int) -> None:
    """Count process `pid`'s CPU time as this process's own (the app's window for its engine)."""
    _companions.add(pid)


def _companion_seconds() -> float:
    """CPU seconds the companions have used (user + system, from /proc/<pid>/stat); a companion
    that is gone counts 0, as does one where /proc is missing."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    for pid in tuple(_companions):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "(comm)", which may hold spaces
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total


@dataclass(frozen=True)
class CoreCount:
    """What one measurement found: the cores this process may use and those free of other work."""

    allowed: int
    free: int
    measured: bool  # False where /proc/stat is missing (macOS, Windows): then free == allowed

    def describe(self) -> str:
        """For notes and logs: "2 of 2 cores free", "1 of 2 cores free (1 busy elsewhere)"."""
        if not self.measured:
            return f"{self.allowed} cores (load not measured)"
        busy = self.allowed - self.free
        return f"{self.free} of {self.allowed} cores free" + (f" ({busy} busy elsewhere)" if busy else "")


def allowed_cpus() -> set[int] | None:
    """Ids of the CPUs this process may run on (taskset, cgroups' cpusets), None where unknown."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return None


def _allowed_count() -> int:
    cpus = allowed_cpus()
    return len(cpus) if cpus else (os.cpu_count() or 1)


def _busy_seconds(cpus: set[int]) -> tuple[float, int] | None:
    """Seconds the `cpus` (those /proc/stat lists) have spent not idle since boot, and how many
    of them it lists; None without a readable /proc/stat."""
    try:
        with open(_PROC_STAT, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = 0
    found = 0
    for line in lines:
        if not line.startswith(b"cpu") or line[3:4] == b" ":  # per-cpu lines only ("cpu0 ...")
            continue
        name, *fields = line.split()
        try:
            cpu = int(name[3:])
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        except ValueError:
            continue
        if cpu not in cpus or len(values) < 5:
            continue
        found += 1
        busy += sum(values) - values[3] - values[4]  # steal counts as busy: the core is not ours then
    return (busy / tick, found) if found else None


def measure(window_s: float = WINDOW_S) -> CoreCount:
    """Cores of this process's affinity that other processes leave free, over `window_s` seconds.

    Others' load = the allowed cores' busy time over the window minus this process's own CPU
    time (all its threads) and its companions', in cores; each whole core of it (rounded at BUSY_SHARE) is taken.
    Always at least 1 free: a process that runs at all has a share of some core.
    """
    allowed = _allowed_count()
    cpus = allowed_cpus()
    if cpus is None:
        return CoreCount(allowed, allowed, measured=False)
    before = _busy_seconds(cpus)
    if before is None:
        return CoreCount(allowed, allowed, measured=False)
    own_before, wall_before = time.process_time() + _companion_seconds(), time.monotonic()
    time.sleep(window_s)
    after = _busy_seconds(cpus)
    own = time.process_time() + _companion_seconds() - own_before
    wall = time.monotonic() - wall_before
    if after is None or wall <= 0:
        return CoreCount(allowed, allowed, measured=False)
    listed = min(after[1], allowed)
    others = max(0.0, (after[0] - before[0]) - own) / wall  # in cores
    taken = int(others + (1 - BUSY_SHARE))  # 0.5 of a core or more counts as one
    return CoreCount(listed, max(1, min(listed, listed - taken)), measured=True)


def free_cores(window_s: float = WINDOW_S) -> int:
    """How many of this process's allowed cores are not kept busy by other processes (>= 1).
    Where the load cannot be read (no /proc), all allowed cores."""
    return measure(window_s).free


_lock = threading.Lock()
_last: tuple[float, CoreCount] | None = None


def current(max_age_s: float = CACHE_S) -> CoreCount:
    """The last measurement if it is younger than `max_age_s`, else a new one (WINDOW_S long)."""
    global _last
    with _lock:  # two backends asking at once measure once
        now = time.monotonic()
        if _last is None or now - _last[0] > max_age_s:
            _last = (time.monotonic(), measure())
        return _last[1]


def forget() -> None:
    """Drop the cached measurement, so that the next `current` measures again."""
    global _last
    with _lock:
        _last = None


def follow_in_torch(n: int) -> None:
    """torch's intra-op threads (process-wide): `n`, unless the user set OMP_NUM_THREADS, which
    torch read and which is kept. Call it only where torch is already imported."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def decode_threads(requested: int | None, cap: int = MAX_DEFAULT_THREADS) -> int:
    """Threads for the next generation: `requested` when the user chose a count (kept as is),
    otherwise the free cores (measured at most every CACHE_S seconds), at least 1 and at most `cap`."""
    if requested is not None:
        return requested
    return max(1, min(current().free, cap))


def static_threads(cap: int = MAX_DEFAULT_THREADS) -> int:
    """The allowed cores, capped, without measuring the load (what the default was before)."""
    return max(1, min(_allowed_count(), cap))
