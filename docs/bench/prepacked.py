"""What one native forward costs with float32 weights prepacked for oneDNN, and without (packed.py).

Loads the embedded model twice in float32 on the CPU (prepack "auto" and "off"), gives each the
same 300 cached tokens, then times forwards of 1, 2, 4, 8 and 16 new rows (a step, verify
blocks) and one forward over four sequences of one row each (a batch), the two loads in
alternation, and prints the medians and T(rows) / T(1), the ratio the speedup formula reads.

    python docs/bench/prepacked.py [--threads 2] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.backends.hf.backend import TorchBackend
from engine.backends.slots import BatchCall
from engine.models.locate import resolve

ROWS = (1, 2, 4, 8, 16)
CACHED = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve("default").path
    loads = {choice: TorchBackend(path, dtype="float32", n_ctx=2048, prepack=choice) for choice in ("auto", "off")}
    for backend in loads.values():
        backend.max_slots = 4
        backend.forward(list(range(100, 100 + CACHED)))
    slots = {choice: _batch_of_four(backend) for choice, backend in loads.items()}
    times: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.repeat + 1):  # the first round warms up and is not counted
        for case in [*map(str, ROWS), "4 sequences"]:
            for choice, backend in loads.items():
                took = _time(backend, slots[choice], case)
                if round_:
                    times.setdefault((choice, case), []).append(took)
    print(f"{loads['auto'].info.forward} against {loads['off'].info.forward}; {args.threads} threads, "
          f"medians of {args.repeat}")  # fmt: skip
    one = {choice: statistics.median(times[choice, "1"]) for choice in loads}
    for case in [*map(str, ROWS), "4 sequences"]:
        packed, plain = (statistics.median(times[choice, case]) for choice in ("auto", "off"))
        label = f"{case} row{'s' if case != '1' else ''}" if case.isdigit() else case
        print(
            f"{label:>12}: plain {plain * 1e3:6.1f} ms (T/T(1) {plain / one['off']:.2f})   "
            f"packed {packed * 1e3:6.1f} ms (T/T(1) {packed / one['auto']:.2f})   {plain / packed:.2f}x"
        )


def _batch_of_four(backend):
    """Three more sequences beside `backend`, each with CACHED tokens of its own."""
    slots = [backend.open_slot() for _ in range(3)]
    for i, slot in enumerate(slots):
        slot.forward(list(range(1000 + i, 1000 + i + CACHED)))
    return slots


def _time(backend, slots, case: str) -> float:
    """Seconds of one forward of `case` after CACHED tokens (rolled back after)."""
    if case.isdigit():
        start = time.perf_counter()
        backend.forward(list(range(500, 500 + int(case))))
        took = time.perf_counter() - start
        backend.rollback(CACHED)
        return took
    calls = [BatchCall(backend, [500])] + [BatchCall(slot, [501 + i]) for i, slot in enumerate(slots)]
    start = time.perf_counter()
    backend.forward_batch(calls)
    took = time.perf_counter() - start
    for sequence in [backend, *slots]:
        sequence.rollback(CACHED)
    return took


if __name__ == "__main__":
    main()
