"""Quantized self-drafting: automatic k against fixed k and vanilla, in one process.

The embedded model on PyTorch (bf16 where the CPU has it) as the target, its own
Q4_1 GGUF on llama.cpp as the draft. One engine loads once; for every prompt of
the shipped bench set each mode runs in turn (vanilla, auto, k = 3, 4, 5), so all
modes see the same machine load, and each speedup is a ratio within one round.
Prints, per prompt kind, the median over prompts and rounds of tokens/s, speedup
over vanilla (wall clock, and CPU time of the process: on a shared machine the
second is far steadier, since another process's load stretches wall time), acceptance
and tokens per target forward, and auto over the best fixed k.

    HF_HUB_OFFLINE=1 python docs/bench/self_draft.py [--rounds 2] [--max-tokens 128] [--kinds open,reuse]
                                                     [--ids quote-paragraph,robot-story]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

from engine.bench.prompts import default_prompts_path, load_prompts
from engine.core.sampling import SamplingConfig
from engine.api import Engine, EngineConfig

MODES = ("vanilla", "auto", "3", "4", "5")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kinds", default="reuse,open")
    parser.add_argument("--ids", default=None, help="only these prompts of the set, comma-separated")
    args = parser.parse_args()
    kinds = tuple(args.kinds.split(","))
    config = EngineConfig(target="default", backend="torch").with_drafter("model", draft="default", backend="llama.cpp")
    engine = Engine.load(config)
    prompts = load_prompts(default_prompts_path(), kinds)
    if args.ids:
        prompts = [p for p in prompts if p.id in args.ids.split(",")]
    sampling = SamplingConfig(max_tokens=args.max_tokens)
    print(f"target {engine.target.info.name} {engine.target.info.dtype}, draft {engine.drafter.backend.info.dtype}",
          file=sys.stderr)  # fmt: skip
    warm = engine.prompt_ids(list(prompts[0].messages))
    for mode in ("vanilla", "auto"):  # warm-up
        run(engine, config, mode, warm, sampling)
    rows: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(args.rounds):
        for prompt in prompts:
            ids = engine.prompt_ids(list(prompt.messages))
            base = None
            for mode in MODES:
                stats, cpu = run(engine, config, mode, ids, sampling)
                base = base or (stats.tokens_per_s, cpu)
                rows.setdefault((prompt.kind, mode), []).append(
                    dict(tps=stats.tokens_per_s, x=stats.tokens_per_s / base[0], cpu_x=base[1] / cpu,
                         a=stats.acceptance_rate, tpf=stats.tokens_per_step)  # fmt: skip
                )
                print(f"round {round_} {prompt.id} {mode}: {stats.tokens_per_s:.1f} tok/s, {cpu * 1000:.1f} "
                      f"CPU ms/token, acceptance {stats.acceptance_rate:.2f}, {stats.tokens_per_step:.2f} "
                      "tokens/forward", file=sys.stderr)  # fmt: skip
    engine.close()
    for kind in kinds:
        print(f"\n{kind} prompts (median over {args.rounds} rounds x prompts)\n")
        print("| mode | tok/s | x vanilla (wall) | x vanilla (CPU time) | acceptance | tokens/forward |")
        print("|---|---|---|---|---|---|")
        keys = ("tps", "x", "cpu_x", "a", "tpf")
        med = {m: {key: statistics.median(r[key] for r in rows[(kind, m)]) for key in keys} for m in MODES}
        for m in MODES:
            name = "vanilla" if m == "vanilla" else f"k = {m}"
            v = med[m]
            print(f"| {name} | {v['tps']:.1f} | {v['x']:.2f}x | {v['cpu_x']:.2f}x | {v['a']:.2f} | {v['tpf']:.2f} |")
        for key, what in (("x", "wall"), ("cpu_x", "CPU time")):
            best = max(("3", "4", "5"), key=lambda m: med[m][key])
            print(f"\nauto / best fixed k ({what}; k = {best}): {med['auto'][key] / med[best][key]:.2f}")
    return 0


def run(engine, config, mode, ids, sampling):
    """RunStats of one generation, and the process's CPU seconds per token for it."""
    engine.config = replace(config, k="auto" if mode == "vanilla" else mode)
    start = time.process_time()
    stats = engine.generate(ids, sampling, speculative=mode != "vanilla").stats
    return stats, (time.process_time() - start) / max(stats.tokens, 1)


if __name__ == "__main__":
    sys.exit(main())
