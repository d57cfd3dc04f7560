"""A benchmark report as plain-text tables (for the terminal) and as JSON (for everything else)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.bench.results import VANILLA, BenchReport, GroupSummary, PeerResult, PromptSummary
from engine.figures import ACCEPTANCE_LENGTH, DECODE_SPEEDUP, DRAFT_ACCEPTANCE, PER_TOKEN_ACCEPTANCE, PREDICTED_SPEEDUP


def to_json(report: BenchReport) -> str:
    return json.dumps(report.as_dict(), indent=2, ensure_ascii=False, default=_jsonable)


def write_json(report: BenchReport, path: str | os.PathLike) -> None:
    Path(path).write_text(to_json(report) + "\n", encoding="utf-8")


def _jsonable(value):
    return str(value)


def format_text(report: BenchReport) -> str:
    s = report.settings
    t = s["target"]
    drafter = f"draft model {s['draft']['name']}" if s.get("draft") else f"drafter {s['drafter']}"
    threads = f", {_threads(s['threads'])}" if s.get("threads") else ""
    kinds = ", ".join(f"{n} {k}" for k, n in s["kinds"].items())
    groups = (*report.kinds, report.overall)
    lines = [
        f"Target {t['name']} ({t['dtype']}, {t['backend']}, {t['device']}{threads}); {drafter}, k {s['k']}",
        (
            f"{s['prompts']} prompts ({kinds}), greedy, up to {s['max_tokens']} tokens, "
            f"{s['repeat']} repeat(s) after {s['warmup']} warm-up; tok/s: median decode speed, prefill excluded"
        ),
        "",
        _table(["prompt", *_COLUMNS], [[p.id, *_prompt_cells(p)] for p in report.prompts]),
        "",
        _table(["kind", "prompts", *_COLUMNS[1:]], [[g.name, str(g.prompts), *_group_cells(g)] for g in groups]),
        f"(per kind and for all prompts the {DECODE_SPEEDUP.name} is the geometric mean of the prompts')",
        "",
        *[f"{figure.name}: {figure.tip}" for figure in _FIGURES],
        "",
        *_checks(report),
    ]
    if report.peers:
        lines += ["", *_peers(report)]
    return "\n".join(lines)


# The glossary's names (engine/figures.py), the leading figures first: draft acceptance (accepted /
# drafted, as llama.cpp prints it), mean acceptance length (tokens per step), then the formula's a.
_COLUMNS = [
    "tokens",
    "vanilla tok/s",
    "spec tok/s",
    DECODE_SPEEDUP.name,
    DRAFT_ACCEPTANCE.name,
    ACCEPTANCE_LENGTH.name,
    PER_TOKEN_ACCEPTANCE.name,
    PREDICTED_SPEEDUP.name,
    "efficiency",
    "identical",
]
_FIGURES = (DECODE_SPEEDUP, DRAFT_ACCEPTANCE, ACCEPTANCE_LENGTH, PER_TOKEN_ACCEPTANCE, PREDICTED_SPEEDUP)


def _prompt_cells(p: PromptSummary) -> list[str]:
    if p.identical:
        same = "yes"
    elif p.divergence and p.divergence.get("explained"):
        same = f"no @{p.divergence['index']} (rounding)"
    else:
        same = "NO: unexplained" if p.divergence else "no"
    return [
        str(p.tokens),
        f"{p.vanilla_tps:.1f}",
        f"{p.speculative_tps:.1f}",
        f"{p.speedup:.2f}x",
        f"{p.draft_acceptance:.0%}",
        f"{p.tokens_per_forward:.2f}",
        f"{p.acceptance:.2f}",
        f"{p.predicted_speedup:.2f}x",
        f"{p.efficiency:.2f}",
        same,
    ]


def _group_cells(g: GroupSummary) -> list[str]:
    return [
        f"{g.vanilla_tps:.1f}",
        f"{g.speculative_tps:.1f}",
        f"{g.speedup:.2f}x",
        f"{g.draft_acceptance:.0%}",
        f"{g.tokens_per_forward:.2f}",
        f"{g.acceptance:.2f}",
        f"{g.predicted_speedup:.2f}x",
        f"{g.efficiency:.2f}",
        f"{g.identical}/{g.prompts}",
    ]


def _checks(report: BenchReport) -> list[str]:
    lines = []
    f = report.floor
    if f is not None:
        threads = f", {_threads(f.threads)}" if f.threads else ""
        lines.append(
            "Bandwidth floor (the fastest a token can be if every weight is read once per token): "
            f"{_size(f.weight_bytes)} of weights / {f.bandwidth_bytes_per_s / 1e9:.1f} GB/s copy bandwidth "
            f"({f.device}{threads}) = {f.floor_s * 1e3:.2f} ms/token ({1 / f.floor_s:.0f} tok/s); plain decoding "
            f"took {f.vanilla_s * 1e3:.2f} ms/token, {f.ratio:.2f}x the floor"
        )
    o = report.overall
    lines.append(
        f"Efficiency: {DECODE_SPEEDUP.name} {o.speedup:.2f}x / predicted {o.predicted_speedup:.2f}x = {o.efficiency:.2f} "
        "(the share of the predicted speedup this machine delivered)"
    )
    m = report.memory
    if m.vanilla_peak_bytes is None or m.speculative_peak_bytes is None:
        lines.append("Memory: peak resident memory cannot be read on this system.")
    else:
        scope = "" if m.per_run else " (peaks since the process started: this system cannot reset them)"
        lines.append(
            f"Memory: peak resident vanilla {_size(m.vanilla_peak_bytes)}, speculative "
            f"{_size(m.speculative_peak_bytes)}; limit (vanilla + draft {_size(m.draft_bytes)}) "
            f"+ {m.margin:.0%} = {_size(m.limit_bytes)}: {_verdict(m.ok)}{scope}"
        )
    return lines


def _peers(report: BenchReport) -> list[str]:
    ours = {VANILLA: report.overall.vanilla_tps, "speculative": report.overall.speculative_tps}
    rows = [_peer_row(peer, ours[peer.mode], len(report.prompts)) for peer in report.peers]
    ours_rows = [
        ["SpecDeck vanilla", VANILLA, f"{ours[VANILLA]:.1f}", "-", "-", "the reference"],
        [
            "SpecDeck speculative",
            "speculative",
            f"{ours['speculative']:.1f}",
            "-",
            f"{report.overall.identical}/{report.overall.prompts}",
            "",
        ],
    ]
    header = ["system (same process, same model file)", "mode", "tok/s", "ours / theirs", "identical", "note"]
    legend = (
        "Peers: median tok/s over prompts; ours / theirs = our tok/s in the same mode over theirs; "
        "identical = same output as our vanilla greedy run"
    )
    return [legend, _table(header, ours_rows + rows)]


def _peer_row(peer: PeerResult, ours: float, n_prompts: int) -> list[str]:
    if not peer.ok:
        return [peer.name, peer.mode, "-", "-", "-", f"FAILED: {_one_line(peer.error)}"]
    ratio = ours / peer.tokens_per_s if peer.tokens_per_s > 0 else 0.0
    return [peer.name, peer.mode, f"{peer.tokens_per_s:.1f}", f"{ratio:.2f}x", f"{peer.identical}/{n_prompts}", ""]


def _one_line(text: str | None, limit: int = 160) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _verdict(ok: bool | None) -> str:
    return "unknown" if ok is None else ("met" if ok else "NOT MET")


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """Columns of numbers right-aligned (header too), text left-aligned."""
    table = [header, *rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    numeric = [i > 0 and all(_looks_numeric(str(row[i])) for row in rows if row[i]) for i in range(len(header))]

    def line(cells) -> str:
        return "  ".join(
            str(c).rjust(w) if num else str(c).ljust(w) for c, w, num in zip(cells, widths, numeric)
        ).rstrip()

    return "\n".join(line(row) for row in table)


def _looks_numeric(cell: str) -> bool:
    return cell == "-" or (bool(cell) and (cell[0].isdigit() or cell[0] == "."))


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")
