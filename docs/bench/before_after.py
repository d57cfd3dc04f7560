"""The table of docs/bench/before_after.sh's runs: speedup before and after, and whether the tokens agree.

python docs/bench/before_after.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAMES = (
    "llama-ngram",
    "torch-bf16-ngram",
    "torch-int8-ngram",
    "torch-bf16-medusa",
    "torch-bf16-eagle",
    "torch-bf16-lookahead",
    "torch-bf16-early-exit",
)


def token_ids(report: dict, mode: str) -> dict:
    return {(r["prompt_id"], r["repeat"]): r["token_ids"] for r in report["runs"] if r["mode"] == mode}


def speculative(report: dict) -> tuple[int, int, int]:
    """(runs identical to vanilla, runs that differ without a rounding explanation, runs)."""
    runs = [r for r in report["runs"] if r["mode"] == "speculative"]
    unexplained = sum(not r["identical"] and not (r["divergence"] or {}).get("explained") for r in runs)
    return sum(bool(r["identical"]) for r in runs), unexplained, len(runs)


def main(out: Path) -> None:
    print(
        "| configuration | speedup before | speedup after | after / before | vanilla tokens, before = after "
        "| speculative = vanilla, before / after | divergences unexplained, before / after |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in NAMES:
        before = json.loads((out / f"base-{name}.json").read_text())
        after = json.loads((out / f"new-{name}.json").read_text())
        sb, sa = before["overall"]["speedup"], after["overall"]["speedup"]
        vb, va = token_ids(before, "vanilla"), token_ids(after, "vanilla")
        same = sum(vb[key] == va.get(key) for key in vb)
        (ib, ub, nb), (ia, ua, na) = speculative(before), speculative(after)
        print(
            f"| {name} | {sb:.3f}x | {sa:.3f}x | {sa / sb:.3f} | {same}/{len(vb)} | {ib}/{nb} / {ia}/{na} "
            f"| {ub} / {ua} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
