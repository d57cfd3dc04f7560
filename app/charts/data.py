"""The numbers behind the live charts: per-step ring buffers and the series drawn from them.

No Qt here. `LiveCharts` appends one row per `StepEvent` (cheap: a numpy row
write) and, at most ~25 times a second, asks `chart_series` for everything the
panels draw. Rates over a window come from the running totals in
`StepEvent.stats`, so a window is two subtractions, and the numbers the charts
show are the engine's own (no second bookkeeping that could drift from it).

Drafter statistics (the n-gram pool of lookahead decoding, the exit layer of
early exit...) come with each step's record (`StepEvent.drafter_stats`): a copy of
`Drafter.stats()` the engine took right after the step, of the stats type its
registry entry names, which says whose they are. Which of them are numbers to chart per
step is the registry's word, not ours: every field its spec's stats type marks
`stat(chart=True)` is a column of DRAFTER_COLUMNS (NaN where the drafter has no
such number), so a new drafter's numbers reach the rows, the exports and the
drafter panel without a change here. The run keeps the latest snapshot whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine import (
    ConfigError,
    CostModel,
    CostSnapshot,
    DrafterStats,
    RunStats,
    Stat,
    StepEvent,
    break_even_acceptance,
    drafter_spec,
    expected_tokens,
    stat_fields,
    stats_owner,
    stats_specs,
)

# One row per step. The "total_*" and rate columns are RunStats running totals
# after the step; the others belong to the step alone.
COLUMNS = (
    "step",
    "wall_s",
    "tokens",
    "k",
    "drafted",
    "accepted",
    "draft_s",
    "verify_s",
    "other_s",
    "total_tokens",
    "total_accepted",
    "total_tested",
    "tokens_per_s",
    "acceptance_rate",
    "predicted_speedup",
)
_COL = {name: i for i, name in enumerate(COLUMNS)}


@dataclass(frozen=True)
class DrafterColumn:
    """One charted drafter statistic as a column of the step rows."""

    name: str  # the column's name in the rows and the exports
    drafter: str  # the registry name of the drafter that reports it
    stat: Stat  # its metadata (stat.name: the field of the drafter's stats)
    stats: type = DrafterStats  # that drafter's stats type (DrafterSpec.stats)


# The exports' names from before drafter statistics were typed, kept so that files stay comparable.
# "steps" alone would read as a count of rows in a table of steps.
_EXPORT_NAMES = {("lookahead", "steps"): "pool_steps"}


def _drafter_columns() -> tuple[DrafterColumn, ...]:
    """Every statistic some registered drafter charts, in the registry's order; a name two drafters
    share is qualified by the drafter's ("toy_steps")."""
    charted = [(spec.name, s) for spec in stats_specs() for s in stat_fields(spec.stats) if s.chart]
    columns, taken = [], set(COLUMNS)
    for drafter, s in charted:
        name = _EXPORT_NAMES.get((drafter, s.name), s.name)
        if name in taken:
            name = f"{drafter.replace('-', '_')}_{s.name}"
        taken.add(name)
        columns.append(DrafterColumn(name, drafter, s, stats_owner(drafter).stats))
    return tuple(columns)


DRAFTER_STAT_COLUMNS = _drafter_columns()
DRAFTER_COLUMNS = tuple(c.name for c in DRAFTER_STAT_COLUMNS)
ALL_COLUMNS = COLUMNS + DRAFTER_COLUMNS
_COL.update({name: len(COLUMNS) + i for i, name in enumerate(DRAFTER_COLUMNS)})
INT_COLUMNS = frozenset(
    {"step", "tokens", "k", "drafted", "accepted", "total_tokens", "total_accepted", "total_tested", *DRAFTER_COLUMNS}
)
_NO_DRAFTER_ROW = (np.nan,) * len(DRAFTER_COLUMNS)

MAX_STEPS = 100_000  # per run; beyond this the oldest steps drop out of the charts and exports
WINDOW = 16  # steps in the rolling rates: long enough to smooth one-step noise, short enough to follow drift
THEORY_POINTS = 201
DEFAULT_K = 4  # drawn in the theory plot until a step has drafted something


@dataclass(frozen=True)
class DrafterView:
    """How the charts present a kind of drafter (EngineConfig.drafter's names)."""

    depth_label: str  # what the per-depth acceptance bars are: "head", "depth" or "position"
    tree: bool  # drafts trees: the draft panel shows tree nodes and the accepted length
    panel: str | None  # the drafter panel's content: the drafter's name, or None (no panel)


def drafter_view(kind: str | None, backend: str | None = None) -> DrafterView:
    """The presentation of drafter `kind`, from its registry spec (a chain's from its members'):
    the depth bars named by `DrafterSpec.depth_unit`, trees drawn as trees where it drafts them
    (on `backend` when given: both verify whole trees, `DrafterSpec.trees_on`), and the
    drafter panel where its spec charts statistics (lookahead and early exit: their own plots;
    others: their charted statistics over the steps). An unknown drafter is drawn as a chain."""
    try:
        spec = drafter_spec(kind or "none")
    except ConfigError:
        return DrafterView("position", False, None)
    tree = spec.trees if backend is None else spec.trees_on(backend)
    depth = spec.depth_unit if tree or not spec.trees else "position"
    columns = drafter_columns_of(kind)
    return DrafterView(depth, tree, columns[0].drafter if columns else None)


def drafter_row(stats: DrafterStats | None) -> tuple:
    """The DRAFTER_COLUMNS of one step from the drafter's statistics (`StepEvent.drafter_stats`): its
    stats type's charted fields, NaN for what it lacks and for other drafters' columns."""
    if stats is None:
        return _NO_DRAFTER_ROW
    kind = type(stats)
    return tuple(
        _number(getattr(stats, c.stat.name, None)) if c.stats is kind else np.nan for c in DRAFTER_STAT_COLUMNS
    )


def stats_text(kind: str | None, stats: DrafterStats | dict) -> str:
    """The statistics of drafter `kind` that are not charted, as "Label value unit" after the
    drafter's label ("Toy echo: Longest echo 7 tokens"), for a drafter with no words of its own here.
    `stats`: the record, or its `as_dict()`."""
    spec = stats_owner(kind)
    if spec is None:
        return ""
    values = stats.as_dict() if isinstance(stats, DrafterStats) else dict(stats)
    said = spec.stats.describe(values)
    if said:
        return f"{spec.label}: {said}"
    parts = []
    for s in stat_fields(spec.stats):
        value = values.get(s.name)
        if s.chart or isinstance(value, (bool, dict, list, tuple)) or value is None:
            continue
        shown = f"{value:.2f}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)
        parts.append(f"{s.label} {shown}" + (f" {s.unit}" if s.unit else ""))
    return f"{spec.label}: {', '.join(parts)}" if parts else ""


def drafter_columns_of(kind: str | None) -> tuple[DrafterColumn, ...]:
    """The columns drafter `kind` charts (none for an unknown drafter; a chain's: "chain")."""
    owner = stats_owner(kind)
    return tuple(c for c in DRAFTER_STAT_COLUMNS if owner is not None and c.drafter == owner.name)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return np.nan
    return float(value)


class StepBuffer:
    """A ring buffer of step rows whose contents are always one contiguous numpy view.

    Each row is written twice, at i and i + size, so the newest `count` rows are
    `data[start:start + count]` without a copy. It starts small and doubles up to
    `capacity`, so a short chat does not hold a 100k-row array.
    """

    def __init__(self, capacity: int = MAX_STEPS, initial: int = 256) -> None:
        self._capacity = capacity
        self._size = min(initial, capacity)
        self._data = np.zeros((2 * self._size, len(ALL_COLUMNS)))
        self._start = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, row) -> None:
        """One row: ALL_COLUMNS, or COLUMNS alone (the drafter's columns are then NaN)."""
        if len(row) == len(COLUMNS):
            row = tuple(row) + _NO_DRAFTER_ROW
        if self._count == self._size and self._size < self._capacity:
            self._grow()
        end = (self._start + self._count) % self._size
        self._data[end] = row
        self._data[end + self._size] = row
        if self._count < self._size:
            self._count += 1
        else:  # full: the oldest row drops out
            self._start = (self._start + 1) % self._size

    def view(self) -> np.ndarray:
        """Rows oldest first, shape (count, len(ALL_COLUMNS)); a view, valid until the next append."""
        return self._data[self._start : self._start + self._count]

    def column(self, name: str) -> np.ndarray:
        return self.view()[:, _COL[name]]

    def _grow(self) -> None:
        rows = self.view().copy()
        self._size = min(2 * self._size, self._capacity)
        self._data = np.zeros((2 * self._size, len(ALL_COLUMNS)))
        self._data[: len(rows)] = rows
        self._data[self._size : self._size + len(rows)] = rows
        self._start = 0


@dataclass
class Run:
    """One decoding run as the charts see it: its step rows, its latest totals and drafter stats."""

    steps: StepBuffer = field(default_factory=StepBuffer)
    stats: RunStats = field(default_factory=RunStats)
    finish_reason: str | None = None
    drafter_stats: DrafterStats | None = None  # the latest of the steps' StepEvent.drafter_stats, if any came

    def add(self, event: StepEvent) -> None:
        """One step, with the drafter's statistics it carries."""
        s = event.stats
        self.steps.append(
            (
                event.index,
                s.wall_s,
                len(event.tokens),
                event.k,
                event.drafted,
                event.accepted,
                event.draft_s,
                event.verify_s,
                event.other_s,
                s.tokens,
                s.accepted,
                s.tested,
                s.tokens_per_s,
                s.acceptance_rate,
                s.predicted_speedup,
                *drafter_row(event.drafter_stats),
            )
        )
        self.stats = s
        self.finish_reason = event.finish_reason
        if event.drafter_stats is not None:
            self.drafter_stats = event.drafter_stats

    def drafter_columns(self) -> tuple[str, ...]:
        """The DRAFTER_COLUMNS this run has numbers for (the others are all NaN)."""
        if not len(self.steps):
            return ()
        filled = np.isfinite(self.steps.view()[:, len(COLUMNS) :]).any(axis=0)
        return tuple(name for name, has in zip(DRAFTER_COLUMNS, filled) if has)

    def rows(self, columns: tuple[str, ...] | None = None) -> list[dict]:
        """The step rows as plain dicts (ints where the column counts things, None for a
        drafter number the step lacks), for exports: COLUMNS plus the run's drafter columns."""
        names = COLUMNS + self.drafter_columns() if columns is None else columns
        index = [_COL[name] for name in names]
        return [{name: _cell(name, row[i]) for name, i in zip(names, index)} for row in self.steps.view()]


def _cell(name: str, value: float):
    if not np.isfinite(value):
        return None
    return int(value) if name in INT_COLUMNS else round(float(value), 6)


def rolling_rate(numerator: np.ndarray, denominator: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """Change of one running total over the change of another across `window` steps; NaN where 0/0.

    The first `window` points measure from the start of the run, so the curve
    starts at the first step instead of after a warm-up gap.
    """
    num_before = np.zeros_like(numerator)
    den_before = np.zeros_like(denominator)
    num_before[window:] = numerator[:-window]
    den_before[window:] = denominator[:-window]
    d_num, d_den = numerator - num_before, denominator - den_before
    out = np.full(len(numerator), np.nan)
    np.divide(d_num, d_den, out=out, where=d_den > 0)
    return out


def accepted_histogram(accepted: np.ndarray, drafted: np.ndarray, a: float) -> dict:
    """Share of drafting steps that accepted j tokens, measured and as the geometric model predicts.

    The article's model accepts each draft token with probability a, independently,
    until the first rejection: P(j) = (1 - a) a^j for j < d and a^d for j = d, where
    d is what was drafted. A measured histogram heavier at 0 and at d than the
    prediction means acceptances come in streaks (easy and hard stretches of text).
    """
    mask = drafted > 0
    n = int(mask.sum())
    longest = int(drafted.max()) if len(drafted) else 0
    bins = np.arange(longest + 1, dtype=float)
    if n == 0:
        return {"bins": bins, "measured": np.zeros(len(bins)), "predicted": np.zeros(len(bins)), "steps": 0}
    measured = np.bincount(accepted[mask].astype(int), minlength=longest + 1)[: longest + 1] / n
    predicted = np.zeros(longest + 1)
    lengths, counts = np.unique(drafted[mask].astype(int), return_counts=True)
    for d, count in zip(lengths, counts):
        j = np.arange(d + 1)
        p = (1.0 - a) * a**j
        p[d] = a**d
        predicted[: d + 1] += count * p
    return {"bins": bins, "measured": measured, "predicted": predicted / n, "steps": n}


def depth_acceptance(run: Run) -> dict:
    """Per depth d = 1, 2, ...: steps that tested a draft token there, and steps that accepted it.

    For Medusa, depth d is head d's guess. Tree drafters report the counts in
    RunStats.depth_tested / depth_accepted; for a chain they follow from the
    steps: position j was tested when j tokens were drafted and the j - 1
    before it were accepted, and accepted when at least j were.
    """
    s = run.stats
    if s.depth_tested:
        tested = np.asarray(s.depth_tested, dtype=float)
        accepted = np.asarray(s.depth_accepted, dtype=float)[: len(tested)]
    elif len(run.steps):
        drafted, took = run.steps.column("drafted"), run.steps.column("accepted")
        positions = np.arange(1, int(drafted.max()) + 1 if len(drafted) else 1)
        tested = np.array([np.sum((drafted >= j) & (took >= j - 1)) for j in positions], dtype=float)
        accepted = np.array([np.sum(took >= j) for j in positions], dtype=float)
    else:
        tested = accepted = np.zeros(0)
    rate = np.full(len(tested), np.nan)
    np.divide(accepted, tested, out=rate, where=tested > 0)
    return {"depth": np.arange(1, len(tested) + 1), "tested": tested, "accepted": accepted, "rate": rate}


_last_curves: list = [None, None]  # [what they were computed for, the curves]: one model holds for many redraws


def _curves(costs: CostSnapshot | CostModel | None, k: int) -> dict:
    """theory_curves' part that depends on the cost model's numbers and k alone: 400 Python calls,
    done again only when one of them changes."""
    key = (k, None if costs is None else costs.snapshot())
    if _last_curves[0] == key:
        return _last_curves[1]
    a = np.linspace(0.0, 1.0, THEORY_POINTS)
    out = {
        "k": k,
        "a": a,
        "tokens_per_step": np.array([expected_tokens(x, k) for x in a]),
        "speedup": None,
        "break_even": None,
        "max_speedup": None,
    }
    if costs is not None:
        out["speedup"] = np.array([costs.speedup(x, k) for x in a])
        out["break_even"] = break_even_acceptance(costs, k)
        out["max_speedup"] = costs.speedup(1.0, k)
        out["verify_ratio"] = costs.verify_ratio(k + 1)
        out["draft_ratio"] = costs.draft_ratio()
    _last_curves[:] = [key, out]
    return out


def theory_curves(costs: CostSnapshot | CostModel | None, k: int, measured_a: float | None) -> dict:
    """E[tokens/step] and the predicted speedup against acceptance, and the break-even a, for draft length k."""
    out = dict(_curves(costs, k))
    if costs is not None:
        if measured_a is not None:
            out["predicted_at_measured"] = costs.speedup(measured_a, k)
    return out


def drafter_series(run: Run | None, kind: str | None) -> dict:
    """The drafter panel's numbers for the speculative run: per-step columns and the latest stats."""
    out = {"kind": kind, "stats": None, "step": np.zeros(0)}
    if run is None or not len(run.steps):
        return out
    out["stats"] = None if run.drafter_stats is None else run.drafter_stats.as_dict()  # the panels read plain data
    out["step"] = run.steps.column("step")
    for name in DRAFTER_COLUMNS:
        out[name] = run.steps.column(name)
    return out


def chart_series(
    runs: dict[str, Run], costs: CostSnapshot | CostModel | None, window: int = WINDOW, drafter: str | None = None
) -> dict:
    """Everything the panels draw, keyed by panel then by run label; `drafter` is the
    loaded drafter's kind (EngineConfig.drafter), which decides what the drafter panel shows."""
    throughput, acceptance, time_split = {}, {}, {}
    for label, run in runs.items():
        if not len(run.steps):
            continue
        col = run.steps.column
        throughput[label] = (col("wall_s"), rolling_rate(col("total_tokens"), col("wall_s"), window))
        if run.stats.tested:
            acceptance[label] = (col("step"), rolling_rate(col("total_accepted"), col("total_tested"), window))
        s = run.stats
        # "other" is the rest of the decoding time, the time between steps too: the bar then ends
        # at the run's decoding time, the number the side by side's verdict gives.
        time_split[label] = {
            "draft": s.draft_s,
            "verify": s.verify_s,
            "other": max(s.wall_s - s.draft_s - s.verify_s, 0.0),
        }

    spec = runs.get("speculative")
    depth = depth_acceptance(spec if spec is not None else Run())
    draft_length = {}
    histogram = accepted_histogram(np.zeros(0), np.zeros(0), 0.0)
    measured = None
    k = DEFAULT_K
    if spec is not None and len(spec.steps):
        col = spec.steps.column
        draft_length = {
            "k": (col("step"), col("k")),
            "drafted": (col("step"), col("drafted")),
            "accepted": (col("step"), col("accepted")),
        }
        drafted = col("drafted")
        histogram = accepted_histogram(col("accepted"), drafted, spec.stats.acceptance_rate)
        drafting = drafted > 0
        if drafting.any():
            k = int(col("k")[drafting][-1])  # the k of the latest step that drafted: what auto k settled on
            # Tokens per step over the drafting steps only: plain steps (k = 0) emit
            # one token by construction and would pull the point off the curve.
            measured = (spec.stats.acceptance_rate, float(col("tokens")[drafting].mean()))
    theory = theory_curves(costs, k, measured[0] if measured else None)
    theory["measured"] = measured
    vanilla = runs.get("vanilla")
    theory["measured_speedup"] = None
    if measured and vanilla is not None and vanilla.stats.tokens_per_s > 0 and spec.stats.tokens_per_s > 0:
        theory["measured_speedup"] = (measured[0], spec.stats.tokens_per_s / vanilla.stats.tokens_per_s)
    return {
        "throughput": throughput,
        "stats": {label: run.stats for label, run in runs.items() if len(run.steps)},
        "acceptance": acceptance,
        "accepted_histogram": histogram,
        "draft_length": draft_length,
        "depth": depth,
        "time_split": time_split,
        "theory": theory,
        "drafter": drafter_series(spec, drafter),
    }
