"""What verifying k drafts costs a batch, at a short and a long context (MagicDec's question).

Loads the embedded model in float32 on PyTorch's native forward, fills B sequences with C
cached tokens each, then times one forward over the B sequences with 1 new row each (a
plain step) and with k + 1 rows each (a verify step), alternating, medians. The ratio
T(verify) / T(plain) is what one step of speculation costs over plain decoding: the
article's break-even B is where the tokens a step accepts no longer pay it. MagicDec
(arXiv 2408.11049) says that at long contexts reading each sequence's KV cache dominates
both forwards, so the ratio falls back towards 1 and speculation pays again at large B.
Acceptance does not enter: this is the cost side alone.

    python docs/bench/batch_verify_context.py [--batches 1,4,16] [--contexts 64,512,2048] [--k 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.backends.hf.backend import TorchBackend
from engine.backends.slots import BatchCall
from engine.models.locate import resolve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--contexts", default="64,512,2048")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    backend = TorchBackend(resolve("default").path, dtype="float32", n_ctx=max(contexts) + 64)
    backend.max_slots = max(batches)
    sequences = [backend] + [backend.open_slot() for _ in range(max(batches) - 1)]
    print(f"{backend.info.forward}; {args.threads} threads; k = {args.k}; medians of {args.repeat}")
    print("context      B   plain step   verify step   verify / plain")
    for context in contexts:
        for i, sequence in enumerate(sequences):
            sequence.rollback(0)
            sequence.forward([100 + (i * 7 + j) % 30000 for j in range(context)])
        for batch in batches:
            times = {1: [], args.k + 1: []}
            for round_ in range(args.repeat + 1):  # the first round warms up
                for rows in times:
                    calls = [
                        BatchCall(s, list(range(500 + i, 500 + i + rows))) for i, s in enumerate(sequences[:batch])
                    ]
                    start = time.perf_counter()
                    backend.forward_batch(calls)
                    took = time.perf_counter() - start
                    for sequence in sequences[:batch]:
                        sequence.rollback(context)
                    if round_:
                        times[rows].append(took)
            plain, verify = (statistics.median(times[rows]) for rows in times)
            print(f"{context:7d} {batch:6d} {plain * 1e3:9.1f} ms {verify * 1e3:10.1f} ms {verify / plain:12.2f}x")


if __name__ == "__main__":
    main()
