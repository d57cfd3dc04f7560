"""A hand-made LoadSweep with realistic numbers (a small pair on a CPU): speculation 1.6x at B = 1,
1.1x at B = 4, a loss at B = 8 with a fixed k (automatic k about even), break-even at B = 8."""

from __future__ import annotations

import dataclasses

from engine.bench.load_results import AUTO, VANILLA, LoadPoint, LoadSweep, Memory

BATCHES = (1, 2, 4, 8, 16)
PLAIN_TPS = {1: 20.0, 2: 36.0, 4: 62.0, 8: 95.0, 16: 120.0}
SPEEDUPS = {  # mode -> speedup per B
    AUTO: {1: 1.60, 2: 1.34, 4: 1.10, 8: 0.99, 16: 0.98},
    "k=4": {1: 1.55, 2: 1.30, 4: 1.06, 8: 0.95, 16: 0.81},
}
MEAN_K = {AUTO: {1: 4.0, 2: 3.2, 4: 1.9, 8: 0.6, 16: 0.1}, "k=4": dict.fromkeys(BATCHES, 4.0)}
PREDICTED = ((1, 1.68), (2, 1.41), (4, 1.13), (8, 0.97), (16, 0.9))
GIB = 2**30
MEMORY = Memory(
    budget_bytes=16 * GIB,
    context=4096,
    weights_bytes=int(3.4 * GIB),
    target_kv_bytes_per_sequence=int(1.3 * GIB),
    draft_bytes=int(1.0 * GIB),
    draft_kv_bytes_per_sequence=int(0.55 * GIB),
    max_batch_plain=9,
    max_batch_with_draft=6,
)
FAILURE = (
    "Failure mode 2, the batch fills the forward: from B = 8 each drafted token costs about what a real one "
    "does, so speculation stops paying and automatic k drafts almost nothing."
)


def points(context: int = 512, scale: float = 1.0) -> list[LoadPoint]:
    out = []
    for b in BATCHES:
        plain = PLAIN_TPS[b] * scale
        out.append(LoadPoint(b, context, VANILLA, plain, plain / b, 0.08 * b, mean_batch=b, tokens=128 * b))
        for mode, speedups in SPEEDUPS.items():
            tps = plain * speedups[b]
            out.append(LoadPoint(b, context, mode, tps, tps / b, 0.09 * b, MEAN_K[mode][b], 0.78, float(b), 128 * b))
    return out


PREDICTED_FIXED = ((1, 1.62), (2, 1.36), (4, 1.08), (8, 0.93), (16, 0.78))


def load_sweep(draft_model: bool = True, contexts: tuple[int, ...] = (512,)) -> LoadSweep:
    """The sweep; `draft_model`: with a draft model (its memory line), else an n-gram drafter (none).
    A longer context's break-even is one doubling later (MagicDec: the KV read makes room again)."""
    all_points = [p for i, c in enumerate(contexts) for p in points(c, 1.0 / (1 + i))]
    predicted = [
        (c, b, mode, s)
        for c in contexts
        for mode, curve in ((AUTO, PREDICTED), ("k=4", PREDICTED_FIXED))
        for b, s in curve
    ]
    return LoadSweep(
        target="SmolLM2-360M-Instruct",
        drafter="draft model SmolLM2-135M-Instruct" if draft_model else "ngram",
        backend="PyTorch bf16, CPU",
        points=tuple(all_points),
        predicted=PREDICTED,
        break_even_measured=8,
        break_even_predicted=8,
        memory=MEMORY if draft_model else None,
        failure_mode=FAILURE,
        verify_curve=((1, 0.05), (4, 0.055), (8, 0.07), (16, 0.11), (32, 0.2), (64, 0.39)),
        break_even_mode="k=4",
        break_evens=tuple((c, 8 * 2**i, 8 * 2**i) for i, c in enumerate(contexts)),
        predicted_by_context=tuple(predicted),
    )


def without_break_even(sweep: LoadSweep) -> LoadSweep:
    return dataclasses.replace(
        sweep,
        break_even_measured=None,
        break_even_predicted=None,
        break_evens=tuple((c, None, None) for c, _, _ in sweep.break_evens),
    )
