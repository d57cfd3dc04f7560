"""A load test as text: one table per context (B x mode), the break-evens, the draft's memory and the
sentence that names the failure mode. What `specdeck-cli bench --concurrency` prints. Light (no torch)."""

from __future__ import annotations

from engine.bench.load_results import VANILLA, LoadSweep

COLUMNS = ("B", "mode", "tok/s all", "tok/s each", "TTFT s", "mean k", "accept", "in step", "speedup", "predicted")


def format_load(sweep: LoadSweep) -> str:
    lines = [f"Load test: {sweep.target} ({sweep.backend}), drafter {sweep.drafter}"]
    for context in sweep.contexts:
        lines += ["", f"Context {context} tokens:", *_table(sweep, context)]
    lines.append("")
    for context, measured, predicted in sweep.break_evens:
        lines.append(
            f"Break-even B ({sweep.break_even_mode}, context {context}): measured {_b(measured)}, "
            f"predicted {_b(predicted)}"
        )
    memory = sweep.memory
    if memory is not None:
        lines.append(
            f"Memory ({size_text(memory.budget_bytes)}, sequences of {memory.context} tokens): "
            f"{memory.max_batch_plain} fit without the draft model, {memory.max_batch_with_draft} with it"
        )
    if sweep.failure_mode:
        lines += ["", sweep.failure_mode]
    lines += [f"note: {note}" for note in sweep.notes]
    return "\n".join(lines)


def _table(sweep: LoadSweep, context: int) -> list[str]:
    rows = [COLUMNS]
    for batch in sweep.batches:
        for mode in sweep.modes:
            p = sweep.point(batch, mode, context)
            if p is None:
                continue
            speedup = sweep.speedup(batch, mode, context) if mode != VANILLA else None
            predicted = sweep.predicted_speedup(batch, mode, context) if mode != VANILLA else None
            rows.append(
                (
                    str(batch),
                    mode,
                    f"{p.aggregate_tps:.1f}",
                    f"{p.request_tps:.1f}",
                    f"{p.ttft_s:.3f}",
                    f"{p.mean_k:.1f}" if mode != VANILLA else "-",
                    f"{p.acceptance:.0%}" if p.acceptance is not None else "-",
                    f"{p.mean_batch:.1f}",
                    f"{speedup:.2f}x" if speedup is not None else "-",
                    f"{predicted:.2f}x" if predicted is not None else "-",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return [
        "  " + "  ".join(cell.rjust(w) if i != 1 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]


def size_text(n: int) -> str:
    """Bytes in the unit that reads best: "7.5 GiB", "51 MiB"."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _b(batch: int | None) -> str:
    return "none (speculation paid at every B)" if batch is None else f"B = {batch}"
