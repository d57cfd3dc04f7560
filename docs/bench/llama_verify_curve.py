"""What a llama.cpp forward of n tokens costs against one token, on the embedded model (issue 16).

Speculative decoding pays only where verifying k + 1 tokens costs much less than k + 1
single decodes. This times `forward` of n = 1..16 tokens after a 100-token context,
rolled back after each, medians of 15, at 2 threads and at 1.

    HF_HUB_OFFLINE=1 python docs/bench/llama_verify_curve.py
"""

from __future__ import annotations

import statistics
import time

from engine.backends.llama_cpp import LlamaCppBackend
from engine.models.locate import default_model_path

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
REPEATS = 15


def curve(threads: int) -> dict[int, float]:
    backend = LlamaCppBackend(default_model_path(), n_ctx=2048, n_threads=threads)
    try:
        context = backend.tokenize("The quick brown fox jumps over the lazy dog. " * 12)[:100]
        backend.prefill(context)
        base = len(backend.tokens)
        times: dict[int, list[float]] = {n: [] for n in SIZES}
        for _ in range(REPEATS):
            for n in SIZES:
                start = time.perf_counter()
                backend.forward(context[:n], all_logits=True)
                times[n].append(time.perf_counter() - start)
                backend.rollback(base)
        return {n: statistics.median(t) for n, t in times.items()}
    finally:
        backend.close()


def main() -> None:
    print("| threads | " + " | ".join(f"n={n}" for n in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for threads in (2, 1):
        ms = curve(threads)
        one = ms[1]
        cells = [f"{ms[1] * 1e3:.2f} ms"] + [f"{ms[n] / one:.2f}x" for n in SIZES[1:]]
        print(f"| {threads} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
