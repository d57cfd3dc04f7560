"""What the machine allows: copy bandwidth, the bandwidth floor, peak resident memory.

Decoding one token reads every weight once, so no decoder can produce a token
faster than `weight_bytes / bandwidth`: that is the floor the benchmark prints
beside the measured vanilla time per token. Bandwidth is measured in the same
run as the decoding, with the same number of threads, as STREAM measures its
"Copy": bytes read plus bytes written per second, median of several copies of
a buffer far larger than any cache.

Peak resident memory on Linux is the kernel's high-water mark (VmHWM), which
writing "5" to /proc/self/clear_refs resets to the current resident size, so
each run gets its own peak. Elsewhere `getrusage` gives the peak of the whole
process, which can only grow: the report then says the peaks are cumulative.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass

import torch

COPY_BYTES = 256 * 2**20  # far above any last-level cache a desktop or a small server has
COPY_REPEATS = 7


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float  # bytes read + written per second
    device: str
    threads: int | None  # CPU threads used (None on a GPU)
    buffer_bytes: int
    repeats: int


def copy_bandwidth(
    device: str = "cpu", threads: int | None = None, nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS
) -> Bandwidth:
    """Median bandwidth of `repeats` copies of an `nbytes` buffer on `device`."""
    previous = torch.get_num_threads()
    if device == "cpu" and threads:
        torch.set_num_threads(threads)
    try:
        source = torch.ones(nbytes, dtype=torch.uint8, device=device)  # touched: really resident
        target = torch.empty_like(source)
        target.copy_(source)  # first touch of the target's pages is not a copy to time
        times = []
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            target.copy_(source)
            _sync(device)
            times.append(time.perf_counter() - start)
        del source, target
    finally:
        torch.set_num_threads(previous)
    seconds = statistics.median(times)
    return Bandwidth(2 * nbytes / seconds, device, threads if device == "cpu" else None, nbytes, repeats)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def floor_s_per_token(weight_bytes: int, bandwidth: Bandwidth) -> float:
    """The least time one decoded token can take: every weight read once at the copy bandwidth."""
    return weight_bytes / bandwidth.bytes_per_s if bandwidth.bytes_per_s > 0 else 0.0


# -- peak resident memory ---------------------------------------------------------------


def reset_peak_rss() -> bool:
    """Start a new peak at the current resident size; False where the OS cannot (then peaks accumulate)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """Peak resident memory since the last reset (Linux), else since the process started."""
    value = _proc_status("VmHWM")
    if value is not None:
        return value
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return None
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux and BSD KiB


def _proc_status(key: str) -> int | None:
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
