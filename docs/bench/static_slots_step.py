"""One batched decode step of four sequences: the static-shape forward against the eager packed one.

    python docs/bench/static_slots_step.py                # 7 steps per case, 3 runs, one torch thread
    python docs/bench/static_slots_step.py --steps 3 --runs 1

On the CPU, float32, a random llama with SmolLM2-135M's widths (hidden 576, 9 heads, 3 KV
heads, intermediate 1536, vocabulary 49152) and 8 layers (tests/factories/hf_models.py);
four sequences holding 300, 400, 500 and 600 tokens. Each case times the same calls on a
`--compile on` backend (one padded static step: engine/backends/hf/static.py) and on a
`--compile off` one (packed rows, attention per sequence: native_slots.py), alternating, each
step rolled back after it; the medians of `--steps` steps per run are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from engine.backends.hf.backend import TorchBackend  # noqa: E402
from engine.backends.slots import BatchCall  # noqa: E402
from tests.engine.backends.numerics import random_ids  # noqa: E402
from tests.factories.hf_models import make_tiny_model  # noqa: E402

CACHED = (300, 400, 500, 600)
CASES = {"new rows 1, 1, 1, 1": (1, 1, 1, 1), "new rows 1, 3, 5, 2": (1, 3, 5, 2)}


def load(folder: str, compile: str) -> list:
    backend = TorchBackend(folder, dtype="float32", impl="native", compile=compile)
    backend.max_slots = len(CACHED)
    sequences = [backend] + [backend.open_slot() for _ in CACHED[1:]]
    for seed, (sequence, n) in enumerate(zip(sequences, CACHED)):
        sequence.forward(random_ids(n, seed), all_logits=False)
    return sequences


def step(sequences: list, rows: tuple[int, ...], seed: int) -> float:
    calls = [BatchCall(s, random_ids(n, seed + i)) for i, (s, n) in enumerate(zip(sequences, rows))]
    began = time.perf_counter()
    sequences[0].forward_batch(calls)
    took = time.perf_counter() - began
    for sequence, n in zip(sequences, CACHED):
        sequence.rollback(n)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as root:
        folder = make_tiny_model(
            Path(root) / "smollm2-widths", "llama", n_layers=8, hidden=576, n_heads=9, n_kv_heads=3, intermediate=1536
        )
        static, eager = load(folder, "on"), load(folder, "off")
        for name, rows in CASES.items():
            for sequences in (static, eager):  # warm-up: the first step of a shape allocates
                step(sequences, rows, 0)
            for run in range(args.runs):
                times: dict[str, list[float]] = {"static": [], "eager packed": []}
                for i in range(args.steps):
                    times["static"].append(step(static, rows, 10 * i))
                    times["eager packed"].append(step(eager, rows, 10 * i))
                said = "   ".join(f"{k} {1000 * statistics.median(v):.0f} ms" for k, v in times.items())
                print(f"{name}  run {run + 1}:  {said}", flush=True)
        static[0].close()
        eager[0].close()


if __name__ == "__main__":
    main()
