"""What a benchmark measured, and how runs become per-prompt and per-kind numbers.

Speeds are decode speeds (generated tokens per second, prefill excluded), and
every aggregate is robust to the odd slow run: per prompt the median over
repeats; per kind the median of the prompts' medians for speeds and the
geometric mean of their speedups (a speedup is a ratio: 2x and 0.5x average to
1x, not 1.25x). Acceptance and tokens per target forward are pooled: summed
counts over every speculative run, then divided, as the engine computes them.

The predicted speedup of a run is the engine's own (`RunStats.predicted_speedup`):
the article's formula applied to the drafts the run made, with the acceptance
rate and draft/verify cost ratios measured in that run. Efficiency is measured
over predicted; the issue asks for at least 0.9.

Light (no torch): the engine server sends these records to the app as JSON.
Each has `to_dict()`, its fields as JSON-ready data (tuples as lists, no derived
numbers), and `from_dict()`, which gives back an equal record. `BenchReport.as_dict`
is the exported file's format (fields and derived numbers, `report.to_json`), and
`BenchReport.from_dict` reads that too: the derived numbers are recomputed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, fields

from engine.errors import ConfigError

FLOOR_LIMIT = 1.25  # vanilla time per token may be at most this multiple of the bandwidth floor
EFFICIENCY_LIMIT = 0.9  # measured speedup at least this share of the predicted one
MEMORY_MARGIN = 0.10  # speculative peak at most (vanilla peak + the draft's weights and cache) * 1.1
VANILLA, SPECULATIVE = "vanilla", "speculative"


class BenchmarkCancelled(Exception):
    """The user stopped the benchmark: not an error, so not a SpecDeckError."""


# -- plain data ---------------------------------------------------------------------------


def plain(value):
    """`value` as JSON has it: tuples (inside dicts and lists too) as lists."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def known_fields(cls, data: dict) -> dict:
    """The entries of `data` that are fields of the dataclass `cls`: derived numbers (as the
    exported file has them) and fields a newer engine added are left out."""
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def progress_to_dict(message: str, fraction: float, row: PromptSummary | None = None) -> dict:
    """What run_benchmark's and run_autotune's `progress(message, fraction)` was called with, as JSON;
    with `row`, a benchmark's row just measured (run_benchmark's `on_row`) rides along."""
    data = {"message": message, "fraction": fraction}
    if row is not None:
        data["row"] = row.to_dict()
    return data


def progress_from_dict(data: dict) -> tuple[str, float]:
    """(message, fraction) from `progress_to_dict`'s dict."""
    return str(data["message"]), float(data["fraction"])


@dataclass(frozen=True)
class BenchSettings:
    """How run_benchmark measures (the prompts and the engine's config are its other arguments)."""

    max_tokens: int = 128
    repeat: int = 3
    warmup: int = 1  # warm-up generations per mode (and per peer) before measuring
    peers: bool = False
    measure_bandwidth: bool = True
    llama_server: str | None = None  # a llama-server binary for the peers (None: found, or none)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"max tokens must be at least 1, got {self.max_tokens}.")
        if self.repeat < 1:
            raise ConfigError(f"repeat must be at least 1, got {self.repeat}.")
        if self.warmup < 0:
            raise ConfigError(f"warm-up must be 0 or more runs, got {self.warmup}.")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BenchSettings:
        return cls(**known_fields(cls, data))


@dataclass(frozen=True)
class RunRecord:
    """One generation of one prompt in one mode."""

    prompt_id: str
    kind: str
    mode: str  # VANILLA | SPECULATIVE
    repeat: int  # 0-based
    tokens: int
    wall_s: float  # decode loop time, prefill excluded
    prefill_s: float
    steps: int  # target forwards
    drafted: int
    accepted: int
    tested: int
    predicted_speedup: float
    finish_reason: str
    peak_rss_bytes: int | None
    identical: bool | None = None  # speculative runs: same tokens as the vanilla run of this repeat
    divergence: dict | None = None  # speculative runs that differ: where and whether rounding explains it
    text: str = field(default="", repr=False)
    token_ids: tuple[int, ...] = field(default=(), repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        return plain(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> RunRecord:
        values = known_fields(cls, data)
        values["token_ids"] = tuple(values.get("token_ids", ()))
        return cls(**values)


@dataclass(frozen=True)
class PromptSummary:
    id: str
    kind: str
    repeats: int
    tokens: int  # median tokens a speculative run generated
    vanilla_tps: float  # median over repeats
    speculative_tps: float
    speedup: float  # speculative_tps / vanilla_tps
    predicted_speedup: float  # median over repeats
    accepted: int  # totals over the speculative runs, for pooling
    tested: int
    drafted: int
    spec_tokens: int
    spec_steps: int
    identical: bool  # every repeat's speculative output equals its vanilla output
    divergence: dict | None  # the first difference found, if any
    vanilla_text: str = field(repr=False)
    speculative_text: str = field(repr=False)

    @property
    def acceptance(self) -> float:
        """Accepted / tested: the formula's per-token a."""
        return self.accepted / self.tested if self.tested else 0.0

    @property
    def draft_acceptance(self) -> float:
        """Accepted / drafted: vLLM's and llama.cpp's draft acceptance rate."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.spec_tokens / self.spec_steps if self.spec_steps else 0.0

    @property
    def efficiency(self) -> float:
        return self.speedup / self.predicted_speedup if self.predicted_speedup > 0 else 0.0

    @property
    def vanilla_s_per_token(self) -> float:
        return 1.0 / self.vanilla_tps if self.vanilla_tps > 0 else 0.0

    def to_dict(self) -> dict:
        return plain(asdict(self))

    @classmethod
    def from_dict(cls, data: dict) -> PromptSummary:
        return cls(**known_fields(cls, data))


@dataclass(frozen=True)
class GroupSummary:
    """The prompts of one kind, or all of them ("all")."""

    name: str
    prompts: int
    vanilla_tps: float  # median of the prompts' medians
    speculative_tps: float
    speedup: float  # geometric mean of the prompts' speedups
    predicted_speedup: float  # geometric mean
    acceptance: float  # pooled, accepted / tested
    draft_acceptance: float  # pooled, accepted / drafted
    tokens_per_forward: float  # pooled
    identical: int  # prompts whose outputs were identical in every repeat

    @property
    def efficiency(self) -> float:
        return self.speedup / self.predicted_speedup if self.predicted_speedup > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GroupSummary:
        return cls(**known_fields(cls, data))


@dataclass(frozen=True)
class FloorCheck:
    """Vanilla decoding against the memory-bandwidth floor."""

    weight_bytes: int
    bandwidth_bytes_per_s: float
    threads: int | None
    device: str
    floor_s: float  # per token
    vanilla_s: float  # per token: median of the prompts' median vanilla times
    limit: float = FLOOR_LIMIT

    @property
    def ratio(self) -> float:
        return self.vanilla_s / self.floor_s if self.floor_s > 0 else math.inf

    @property
    def ok(self) -> bool:
        return self.ratio <= self.limit

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> FloorCheck:
        return cls(**known_fields(cls, data))


@dataclass(frozen=True)
class MemoryCheck:
    vanilla_peak_bytes: int | None  # highest peak of any vanilla run
    speculative_peak_bytes: int | None
    draft_bytes: int  # the draft's own weights and cache (0 for a drafter without a model)
    per_run: bool  # each run had its own peak; False: peaks since the process started
    margin: float = MEMORY_MARGIN

    @property
    def limit_bytes(self) -> int | None:
        if self.vanilla_peak_bytes is None:
            return None
        return round((self.vanilla_peak_bytes + self.draft_bytes) * (1 + self.margin))

    @property
    def ok(self) -> bool | None:
        limit = self.limit_bytes
        if limit is None or self.speculative_peak_bytes is None:
            return None
        return self.speculative_peak_bytes <= limit

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MemoryCheck:
        return cls(**known_fields(cls, data))


@dataclass(frozen=True)
class PeerPromptResult:
    prompt_id: str
    kind: str
    tokens: int  # median generated tokens
    tokens_per_s: float  # median decode speed over repeats
    identical: bool | None  # output equals our vanilla greedy output (None: nothing to compare)
    text: str = field(repr=False)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PeerPromptResult:
        return cls(**known_fields(cls, data))


@dataclass(frozen=True)
class PeerResult:
    """Another system, run in this process on the same model file: a row of the report, or a failure."""

    name: str
    mode: str  # what it should be compared with: VANILLA or SPECULATIVE
    prompts: tuple[PeerPromptResult, ...] = ()
    error: str | None = None  # why it failed; None when it ran

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tokens_per_s(self) -> float:
        speeds = [p.tokens_per_s for p in self.prompts]
        return statistics.median(speeds) if speeds else 0.0

    @property
    def identical(self) -> int:
        return sum(1 for p in self.prompts if p.identical)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "mode": self.mode,
            "prompts": [p.to_dict() for p in self.prompts],
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: dict) -> PeerResult:
        return cls(
            data["name"],
            data["mode"],
            tuple(PeerPromptResult.from_dict(p) for p in data.get("prompts", ())),
            data.get("error"),
        )


@dataclass(frozen=True)
class BenchReport:
    settings: dict  # what ran: models, drafter, k, backend, max tokens, repeats, prompts file...
    prompts: tuple[PromptSummary, ...]
    kinds: tuple[GroupSummary, ...]
    overall: GroupSummary
    floor: FloorCheck | None
    memory: MemoryCheck
    peers: tuple[PeerResult, ...] = ()
    runs: tuple[RunRecord, ...] = field(default=(), repr=False)

    @property
    def efficiency_ok(self) -> bool:
        return self.overall.efficiency >= EFFICIENCY_LIMIT

    def as_dict(self) -> dict:
        """Everything, JSON-ready: the summaries with their derived numbers, and every run."""

        def with_derived(obj, *names) -> dict:
            data = asdict(obj)
            data.update({name: getattr(obj, name) for name in names})
            return data

        def peer(p: PeerResult) -> dict:
            return {**asdict(p), "ok": p.ok, "tokens_per_s": p.tokens_per_s, "identical": p.identical}

        return {
            "settings": self.settings,
            "prompts": [
                with_derived(p, "acceptance", "draft_acceptance", "tokens_per_forward", "efficiency")
                for p in self.prompts
            ],
            "kinds": [with_derived(k, "efficiency") for k in self.kinds],
            "overall": with_derived(self.overall, "efficiency"),
            "efficiency": {"value": self.overall.efficiency, "limit": EFFICIENCY_LIMIT, "ok": self.efficiency_ok},
            "floor": with_derived(self.floor, "ratio", "ok") if self.floor else None,
            "memory": with_derived(self.memory, "limit_bytes", "ok"),
            "peers": [peer(p) for p in self.peers],
            "runs": [{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in self.runs],
        }

    def to_dict(self) -> dict:
        """The fields, JSON-ready; smaller than `as_dict` (no derived numbers), for the wire."""
        return {
            "settings": plain(self.settings),
            "prompts": [p.to_dict() for p in self.prompts],
            "kinds": [k.to_dict() for k in self.kinds],
            "overall": self.overall.to_dict(),
            "floor": self.floor.to_dict() if self.floor else None,
            "memory": self.memory.to_dict(),
            "peers": [p.to_dict() for p in self.peers],
            "runs": [r.to_dict() for r in self.runs],
        }

    @classmethod
    def from_dict(cls, data: dict) -> BenchReport:
        """The report `to_dict` wrote, or one read from an exported file (`as_dict`, `write_json`)."""
        return cls(
            settings=dict(data["settings"]),
            prompts=tuple(PromptSummary.from_dict(p) for p in data["prompts"]),
            kinds=tuple(GroupSummary.from_dict(k) for k in data["kinds"]),
            overall=GroupSummary.from_dict(data["overall"]),
            floor=FloorCheck.from_dict(data["floor"]) if data.get("floor") else None,
            memory=MemoryCheck.from_dict(data["memory"]),
            peers=tuple(PeerResult.from_dict(p) for p in data.get("peers", ())),
            runs=tuple(RunRecord.from_dict(r) for r in data.get("runs", ())),
        )


# -- aggregation -------------------------------------------------------------------------


def geometric_mean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def summarize_prompt(runs: list[RunRecord]) -> PromptSummary:
    """One prompt's runs (both modes, every repeat) -> its summary."""
    vanilla = [r for r in runs if r.mode == VANILLA]
    spec = [r for r in runs if r.mode == SPECULATIVE]
    if not vanilla or not spec:
        raise ValueError("a prompt summary needs at least one vanilla and one speculative run")
    vanilla_tps = statistics.median(r.tokens_per_s for r in vanilla)
    spec_tps = statistics.median(r.tokens_per_s for r in spec)
    differing = [r for r in spec if r.identical is False]
    return PromptSummary(
        id=spec[0].prompt_id,
        kind=spec[0].kind,
        repeats=len(spec),
        tokens=round(statistics.median(r.tokens for r in spec)),
        vanilla_tps=vanilla_tps,
        speculative_tps=spec_tps,
        speedup=spec_tps / vanilla_tps if vanilla_tps > 0 else 0.0,
        predicted_speedup=statistics.median(r.predicted_speedup for r in spec),
        accepted=sum(r.accepted for r in spec),
        tested=sum(r.tested for r in spec),
        drafted=sum(r.drafted for r in spec),
        spec_tokens=sum(r.tokens for r in spec),
        spec_steps=sum(r.steps for r in spec),
        identical=not differing,
        divergence=differing[0].divergence if differing else None,
        vanilla_text=vanilla[0].text,
        speculative_text=spec[0].text,
    )


def summarize_group(name: str, prompts: list[PromptSummary]) -> GroupSummary:
    if not prompts:
        raise ValueError(f"no prompts in group {name!r}")
    tested = sum(p.tested for p in prompts)
    drafted = sum(p.drafted for p in prompts)
    steps = sum(p.spec_steps for p in prompts)
    return GroupSummary(
        name=name,
        prompts=len(prompts),
        vanilla_tps=statistics.median(p.vanilla_tps for p in prompts),
        speculative_tps=statistics.median(p.speculative_tps for p in prompts),
        speedup=geometric_mean(p.speedup for p in prompts),
        predicted_speedup=geometric_mean(p.predicted_speedup for p in prompts),
        acceptance=sum(p.accepted for p in prompts) / tested if tested else 0.0,
        draft_acceptance=sum(p.accepted for p in prompts) / drafted if drafted else 0.0,
        tokens_per_forward=sum(p.spec_tokens for p in prompts) / steps if steps else 0.0,
        identical=sum(1 for p in prompts if p.identical),
    )


def summarize(runs: list[RunRecord]) -> tuple[tuple[PromptSummary, ...], tuple[GroupSummary, ...], GroupSummary]:
    """Per prompt (in the order first run), per kind (in order of first appearance), and overall."""
    by_prompt: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_prompt.setdefault(run.prompt_id, []).append(run)
    prompts = tuple(summarize_prompt(group) for group in by_prompt.values())
    kinds: dict[str, list[PromptSummary]] = {}
    for prompt in prompts:
        kinds.setdefault(prompt.kind, []).append(prompt)
    groups = tuple(summarize_group(kind, members) for kind, members in kinds.items())
    return prompts, groups, summarize_group("all", list(prompts))


def report_so_far(rows) -> BenchReport:
    """The rows measured so far (PromptSummary, as run_benchmark's `on_row` gives them) as a report a
    view can draw while the run goes on: per kind and overall from these rows; no checks yet."""
    rows = tuple(rows)
    kinds: dict[str, list[PromptSummary]] = {}
    for row in rows:
        kinds.setdefault(row.kind, []).append(row)
    return BenchReport(
        settings={},
        prompts=rows,
        kinds=tuple(summarize_group(k, m) for k, m in kinds.items()),
        overall=summarize_group("all", list(rows)),
        floor=None,
        memory=MemoryCheck(None, None, 0, True),
    )


def memory_check(runs: list[RunRecord], draft_bytes: int, per_run: bool) -> MemoryCheck:
    def peak(mode: str) -> int | None:
        peaks = [r.peak_rss_bytes for r in runs if r.mode == mode and r.peak_rss_bytes is not None]
        return max(peaks) if peaks else None

    return MemoryCheck(peak(VANILLA), peak(SPECULATIVE), draft_bytes, per_run)
