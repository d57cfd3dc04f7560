"""Efficiency of speculative decoding on hybrid GGUF models (issue 39): measured speedup over the
speedup the article's formula predicts from the run's own acceptance and measured costs.

A hybrid's rollback restores a state and replays the kept tokens; if the cost model missed that,
the prediction would promise more than the run delivers and the efficiency would fall below 1.
Two pairs per model, greedy, k = 4, the draft-model drafter:

- self: the target drafts for itself (every draft accepted: no rollback at all);
- near: a model of the same random draws with heavier layers drafts (drafts kept and rejected,
  so the target restores and replays after most steps).

    python docs/bench/llama_hybrid_efficiency.py [--repeats 5] [--tokens 96]

The files are the tests' tiny random ones (tests/factories/hybrid_gguf.py), qwen35 with the
recurrent state of Qwen3.5-0.8B (18 MiB) so that the save and the replay weigh what they would.
Each line: the median over the repeats of vanilla and speculative tokens per second (decoding
only), the measured speedup, the predicted one and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from engine import Engine, SamplingConfig  # noqa: E402
from tests.engine.drafters.build import legacy_config  # noqa: E402
from tests.factories.hybrid_gguf import make_lfm2_gguf, make_qwen35_gguf  # noqa: E402

TEXT = "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese."


def files(folder: str) -> dict[str, tuple[str, str]]:
    big = {"d_state": 128, "n_v_heads": 16}  # Qwen3.5-0.8B's recurrent state size
    return {
        "qwen35 (0.8B-size state)": (
            make_qwen35_gguf(os.path.join(folder, "q.gguf"), mix=0.3, **big),
            make_qwen35_gguf(os.path.join(folder, "q-near.gguf"), mix=0.35, **big),
        ),
        "lfm2 (tiny)": (
            make_lfm2_gguf(os.path.join(folder, "l.gguf"), mix=0.3),
            make_lfm2_gguf(os.path.join(folder, "l-near.gguf"), mix=0.35),
        ),
    }


def efficiency(target: str, draft: str, repeats: int, tokens: int) -> tuple[float, float, float, float, float]:
    engine = Engine.load(legacy_config(target=target, drafter="model", draft=draft, k=4, n_ctx=1024))
    try:
        prompt = engine.prompt_ids(TEXT)
        runs = [engine.compare(prompt, SamplingConfig(max_tokens=tokens)) for _ in range(repeats)]
    finally:
        engine.close()
    vanilla = statistics.median(r.vanilla.stats.tokens_per_s for r in runs)
    speculative = statistics.median(r.speculative.stats.tokens_per_s for r in runs)
    measured = statistics.median(r.speedup for r in runs)
    predicted = statistics.median(r.speculative.stats.predicted_speedup for r in runs)
    acceptance = statistics.median(r.speculative.stats.acceptance_rate for r in runs)
    return vanilla, speculative, measured, predicted, acceptance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    print("| model | pair | a | vanilla tok/s | speculative tok/s | measured | predicted | efficiency |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, (target, near) in files(folder).items():
            for pair, draft in (("self", target), ("near", near)):
                v, s, m, p, a = efficiency(target, draft, args.repeats, args.tokens)
                print(f"| {name} | {pair} | {a:.2f} | {v:.1f} | {s:.1f} | {m:.2f}x | {p:.2f}x | {m / p:.2f} |")


if __name__ == "__main__":
    main()
