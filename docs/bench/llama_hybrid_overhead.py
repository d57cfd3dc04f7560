"""What rolling back a hybrid model costs on the llama.cpp backend (issue 39): per step, one state
checkpoint before each forward, and at a rejection one restore and a replay of the kept tokens.

A transformer cuts its KV cache for free; a model with recurrent layers (engine/backends/llama_state.py)
pays these instead. Timed here, each the best of many repeats (the cost without other programs in
the way: on a shared machine a median measures them), next to what a step costs anyway:

- save: copying the recurrent state of sequence 0 into a checkpoint buffer (every forward);
- restore: copying it back and cutting the attention KV (every rejection);
- replay per token: re-running the kept tokens after the checkpoint, without logits (every rejection);
- forward 1 / forward 5: a plain one-token forward (a draft step) and a 5-token verification.

    python docs/bench/llama_hybrid_overhead.py [--model PATH ...] [--repeats 200] [--threads N]

Without --model it writes the tiny random qwen35, lfm2 and nemotron_h files of the tests
(tests/factories/hybrid_gguf.py) to a temporary folder, and a qwen35 file whose recurrent state has
the size of Qwen3.5-0.8B's (18 MiB); give real GGUFs to time real models.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time

import llama_cpp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from engine.backends.llama_cpp import LlamaCppBackend  # noqa: E402
from engine.backends.llama_state import PARTIAL, SEQ  # noqa: E402

PROMPT = 200  # tokens in the cache when the timings start


def best_s(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(path: str, repeats: int, threads: int | None) -> dict[str, float]:
    backend = LlamaCppBackend(path, n_ctx=1024, n_threads=threads)
    try:
        states = backend._states
        if states is None:
            raise SystemExit(f"{path} has no recurrent layers: nothing to measure")
        prompt = [100 + (i * 37) % 5000 for i in range(PROMPT)]
        backend.prefill(prompt)
        ctx, mem = backend._ctx, backend._mem
        buffer = (ctypes.c_uint8 * states.state_bytes)()
        size = llama_cpp.llama_state_seq_get_data_ext(ctx, buffer, states.state_bytes, SEQ, PARTIAL)

        def save():
            llama_cpp.llama_state_seq_get_data_ext(ctx, buffer, states.state_bytes, SEQ, PARTIAL)

        def restore():
            llama_cpp.llama_state_seq_set_data_ext(ctx, buffer, size, SEQ, PARTIAL)
            llama_cpp.llama_memory_seq_rm(mem, SEQ, PROMPT, -1)

        def replay(n: int):
            def run():
                backend._decode_plain(prompt[:n], PROMPT)
                restore()

            return run

        def forward_s(n: int) -> float:
            """A plain forward of n tokens, no checkpoint before it; the state put back outside the timing."""
            kept, backend._states = backend._states, None
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                backend.forward(prompt[:n])
                times.append(time.perf_counter() - start)
                restore()
                del backend.tokens[PROMPT:]
            backend._states = kept
            return min(times)

        forward_1, forward_5 = forward_s(1), forward_s(5)
        restore_s = best_s(restore, repeats)
        replay_1 = best_s(replay(1), repeats) - restore_s
        replay_4 = best_s(replay(4), repeats) - restore_s
        return {
            "state_kib": states.state_bytes / 1024,
            "save_ms": best_s(save, repeats) * 1e3,
            "restore_ms": restore_s * 1e3,
            "replay_1_ms": replay_1 * 1e3,
            "replay_4_per_token_ms": replay_4 / 4 * 1e3,
            "forward_1_ms": forward_1 * 1e3,
            "forward_5_ms": forward_5 * 1e3,
        }
    finally:
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="a GGUF with recurrent layers (repeatable)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = args.model
        if not paths:
            from tests.factories.hybrid_gguf import make_lfm2_gguf, make_nemotron_h_gguf, make_qwen35_gguf

            paths = [
                make(os.path.join(folder, f"{name}.gguf"))
                for name, make in (
                    ("qwen35", make_qwen35_gguf),
                    ("lfm2", make_lfm2_gguf),
                    ("nemotron_h", make_nemotron_h_gguf),
                )
            ]
            # The recurrent state of Qwen3.5-0.8B (18 delta-net layers of 16 heads of 128 x 128 floats,
            # 18 MiB), around tiny layers otherwise: what a save and a restore cost at a real size.
            real_state = os.path.join(folder, "qwen35-0.8B-state.gguf")
            paths.append(make_qwen35_gguf(real_state, n_layers=24, d_state=128, n_v_heads=16))
        print(
            f"{'model':<24}{'state KiB':>10}{'save ms':>9}{'restore ms':>11}{'replay 1 ms':>12}"
            f"{'replay/tok ms':>14}{'fwd 1 ms':>9}{'fwd 5 ms':>9}"
        )
        for path in paths:
            m = measure(path, args.repeats, args.threads)
            print(
                f"{os.path.basename(path):<24}{m['state_kib']:>10.1f}{m['save_ms']:>9.3f}{m['restore_ms']:>11.3f}"
                f"{m['replay_1_ms']:>12.3f}{m['replay_4_per_token_ms']:>14.3f}{m['forward_1_ms']:>9.3f}"
                f"{m['forward_5_ms']:>9.3f}"
            )


if __name__ == "__main__":
    main()
