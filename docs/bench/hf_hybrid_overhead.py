"""What a rejection costs on a hybrid target (transformers' forward), and which rollback is faster.

    python docs/bench/hf_hybrid_overhead.py                 # tiny qwen3_5, lfm2, nemotron_h + a bigger qwen3_5
    python docs/bench/hf_hybrid_overhead.py --quick         # the tiny models only

Three parts, on tiny random models written by tests/factories/hybrid_models.py (float32, CPU):

1. Rollback strategies at k = 4, drafts rejected with probability r = 0.3 and 0.7 each (the
   accepted count j of a step is geometric, capped at k): seconds per step of
   - replay: one forward over the k + 1 rows, then on a rejection restore the checkpoint saved
     before it and replay the j + 1 kept tokens (what the backend does);
   - per-position: the k + 1 rows run one at a time, a checkpoint before each, so that a
     rejection restores the exact state and replays nothing;
   - rebuild: the rollback recomputes the whole context (what the backend did before).
2. The checkpoint's own cost (save_state per forward) and a restore + replay per rejection.
3. Efficiency on a self-drafting pair (target = draft, the draft-model drafter, k = 4): measured
   speedup (plain wall time / speculative wall time) over the run's predicted speedup.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from engine.backends.hf import hybrid_cache  # noqa: E402
from engine.backends.hf.backend import TorchBackend  # noqa: E402
from engine.backends.hf.transformers_backend import TransformersBackend  # noqa: E402
from tests.factories.hybrid_models import make_hybrid_model  # noqa: E402

K = 4
CONTEXT = 128


class PerPosition(TransformersBackend):
    """The verify run one row at a time, each preceded by its checkpoint: a rollback replays nothing."""

    def _run(self, tokens, all_logits):
        if not all_logits or len(tokens) == 1:
            return super()._run(tokens, all_logits)
        return torch.cat([super(PerPosition, self)._run([t], True) for t in tokens])


def load(folder, strategy: str):
    backend = TorchBackend(folder, dtype="float32", impl="transformers")
    if strategy == "per-position":
        backend.__class__ = PerPosition
    elif strategy == "rebuild":
        backend._rollback_kind, backend._checkpoints = "rebuild", None
    return backend


def steps(backend, rejection: float, n_steps: int, seed: int) -> float:
    """Mean seconds per verify step (forward of k + 1 rows, then the rollback of the rejected ones),
    the rejections drawn from `seed`: every strategy sees the same ones."""
    rng = random.Random(seed)
    ids = [(i * 7919) % 40000 + 300 for i in range(CONTEXT + n_steps * (K + 1) + 8)]
    backend.prefill(ids[:CONTEXT])
    total = 0.0
    for _ in range(n_steps):
        start = len(backend.tokens)
        kept = next((j for j in range(K) if rng.random() < rejection), K)
        t0 = time.perf_counter()
        backend.forward(ids[start : start + K + 1])
        backend.rollback(start + 1 + kept)  # x_m and the kept drafts stay
        total += time.perf_counter() - t0
    return total / n_steps


STRATEGIES = ("replay", "per-position", "rebuild")


def compare(folder, rejection: float, n_steps: int, rounds: int) -> list[float]:
    """Seconds per step of each strategy: the rounds interleaved, each strategy's fastest round kept
    (another process on the machine only ever slows a round down)."""
    backends = {s: load(folder, s) for s in STRATEGIES}
    for backend in backends.values():
        steps(backend, rejection, 2, seed=99)  # warm-up
    best = dict.fromkeys(STRATEGIES, float("inf"))
    for r in range(rounds):
        for s, backend in backends.items():
            best[s] = min(best[s], steps(backend, rejection, n_steps, seed=r))
    return [best[s] for s in STRATEGIES]


def checkpoint_costs(folder, n: int = 30) -> tuple[float, float]:
    """Seconds of one save_state, and of one restore + cut + replay of K // 2 + 1 tokens."""
    backend = load(folder, "replay")
    ids = list(range(300, 300 + CONTEXT + K + 1))
    backend.prefill(ids[:CONTEXT])
    saves, rollbacks = [], []
    for _ in range(n):
        with torch.inference_mode():
            t0 = time.perf_counter()
            hybrid_cache.save_state(backend._cache)
            saves.append(time.perf_counter() - t0)
        backend.forward(ids[CONTEXT:])
        t0 = time.perf_counter()
        backend.rollback(CONTEXT + K // 2 + 1)
        rollbacks.append(time.perf_counter() - t0)
        backend.rollback(CONTEXT)
    return statistics.median(saves), statistics.median(rollbacks)


def efficiency(folder, max_tokens: int = 48, rounds: int = 3) -> tuple[float, float, float]:
    """(measured speedup, predicted speedup, their ratio) of target = draft with the draft-model drafter."""
    from engine.api import Engine, EngineConfig
    from engine.core.draft_length import CostModel
    from engine.core.sampling import SamplingConfig
    from engine.drafters import registry

    target = TorchBackend(folder, dtype="float32")
    config = EngineConfig(k=K).with_drafter("model", draft=folder, dtype="float32")
    engine = Engine(target, registry.make_drafter(target, config), config, CostModel())
    prompt = target.tokenize("The quick brown fox jumps over the lazy dog. " * 4)
    sampling = SamplingConfig(max_tokens=max_tokens)
    engine.generate(prompt, sampling)  # warm-up: the cost model learns the curve
    plain, speculative = [], []
    for _ in range(rounds):  # interleaved; the fastest of each kept
        plain.append(engine.generate(prompt, sampling, speculative=False).stats.wall_s)
        speculative.append(engine.generate(prompt, sampling))
    best = min(speculative, key=lambda r: r.stats.wall_s)
    measured = min(plain) / best.stats.wall_s
    predicted = best.stats.predicted_speedup
    return measured, predicted, measured / predicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny models only")
    parser.add_argument("--steps", type=int, default=12, help="steps per round")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds; the fastest is kept")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    root = Path(tempfile.mkdtemp(prefix="hf-hybrid-bench-"))
    models = [
        (f"{arch} tiny (hidden 64, 4 layers)", make_hybrid_model(root / arch, arch, seed=1))
        for arch in ("qwen3_5", "lfm2", "nemotron_h")
    ]
    if not args.quick:
        models.append(
            (
                "qwen3_5 (hidden 512, 8 layers)",
                make_hybrid_model(root / "qwen-512", "qwen3_5", seed=1, hidden=512, n_layers=8),
            )
        )
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; k = {K}, context {CONTEXT}")
    print("\n1. ms per step (forward of k+1 rows + rollback), by rejection probability per draft")
    print(f"{'model':36} {'r':>4} {'replay':>8} {'per-pos':>8} {'rebuild':>8}")
    for label, folder in models:
        for rejection in (0.3, 0.7):
            row = [t * 1e3 for t in compare(folder, rejection, args.steps, args.rounds)]
            print(f"{label:36} {rejection:4.1f} " + " ".join(f"{v:8.2f}" for v in row))
    print("\n2. checkpoint costs: ms per save (every forward), per restore + replay of k/2+1 tokens")
    for label, folder in models:
        save, rollback = checkpoint_costs(folder)
        print(f"{label:36} save {save * 1e3:6.3f}  rollback {rollback * 1e3:7.2f}")
    print("\n3. self-drafting pair (target = draft, draft-model drafter, k = 4), greedy")
    for label, folder in models[:1] + models[3:]:
        measured, predicted, ratio = efficiency(folder, rounds=args.rounds)
        print(f"{label:36} measured {measured:5.3f}  predicted {predicted:5.3f}  efficiency {ratio:5.3f}")


if __name__ == "__main__":
    main()
