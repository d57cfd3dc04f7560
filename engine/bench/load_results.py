"""What a load test measured: speculative against plain decoding with B requests in flight.

The article's section 4: at B = 1 the verify forward's extra rows are nearly free, since the
weights are read once for any number of rows; as B grows the batch fills the forward, each
draft row costs what a real token costs, and speculation stops paying (the break-even B).
A `LoadSweep` holds the measured points of one pair (per batch size, context length and
mode), the curve the cost formula predicts from the measured T(rows), both break-evens,
and, with a draft model, what its cache costs in sequences that fit (failure mode 3).
Plain data: it travels over the wire as `to_dict` / `from_dict` and is what the CLI's
table, docs/benchmarks.md and the app's Load view draw from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

VANILLA = "vanilla"
AUTO = "auto"  # automatic k (engine/core/batch_k.py); a fixed k is the mode "k=N"


@dataclass(frozen=True)
class LoadPoint:
    """One batch size, one context length, one mode: the medians over the prompts run."""

    batch: int  # B: requests in flight at once
    context: int  # tokens of context each request decodes after
    mode: str  # VANILLA, AUTO or "k=N"
    aggregate_tps: float  # tokens per second over all requests together
    request_tps: float  # median tokens per second of one request (its tokens / its decoding time)
    ttft_s: float  # median time to first token
    mean_k: float = 0.0  # draft tokens per sequence per step (0 for vanilla; automatic k's choice)
    acceptance: float | None = None  # accepted / drafted over the point's steps (None: nothing drafted)
    mean_batch: float = 0.0  # sequences per step's forward, measured (below B while requests join and leave)
    tokens: int = 0  # tokens generated at this point, all requests


@dataclass(frozen=True)
class Memory:
    """Failure mode 3: how many sequences of `context` tokens fit `budget_bytes` with the weights
    loaded, with and without the draft model (its weights and its cache for every sequence)."""

    budget_bytes: int
    context: int
    weights_bytes: int  # the target's weights
    target_kv_bytes_per_sequence: int
    draft_bytes: int  # the draft model's weights (0 without one)
    draft_kv_bytes_per_sequence: int  # 0 without a draft model
    max_batch_plain: int  # largest B that fits without the draft
    max_batch_with_draft: int  # largest B that fits with it


@dataclass(frozen=True)
class LoadSweep:
    target: str
    drafter: str
    backend: str
    points: tuple[LoadPoint, ...]
    # The speedup the formula predicts from the measured T(rows), the drafter's cost and the
    # acceptance measured at B = 1, per B (automatic k's choice at each B): (B, speedup).
    predicted: tuple[tuple[int, float], ...] = ()
    break_even_measured: int | None = None  # smallest B whose automatic-k speedup is below 1 (None: none)
    break_even_predicted: int | None = None
    memory: Memory | None = None
    failure_mode: str = ""  # one sentence: which of the article's failure modes the numbers show
    verify_curve: tuple[tuple[int, float], ...] = ()  # T(rows) measured, seconds: (rows, seconds)
    notes: tuple[str, ...] = field(default_factory=tuple)
    # Added with the sweep (engine/bench/load_sweep.py); the fields above keep their meaning.
    break_even_mode: str = ""  # the mode both break-evens are for: the fixed k when swept, else AUTO
    # Per context: (context, measured break-even, predicted break-even), None where there is none.
    break_evens: tuple[tuple[int, int | None, int | None], ...] = ()
    # Every context's prediction: (context, B, mode, speedup), mode the fixed k's or AUTO.
    predicted_by_context: tuple[tuple[int, int, str, float], ...] = ()
    settings: dict = field(default_factory=dict)  # LoadSettings.to_dict(), plus the engine's n_ctx and k_max

    def point(self, batch: int, mode: str, context: int | None = None) -> LoadPoint | None:
        context = self.contexts[0] if context is None and self.contexts else context
        return next((p for p in self.points if (p.batch, p.mode, p.context) == (batch, mode, context)), None)

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(sorted({p.batch for p in self.points}))

    @property
    def contexts(self) -> tuple[int, ...]:
        return tuple(sorted({p.context for p in self.points}))

    @property
    def modes(self) -> tuple[str, ...]:
        seen = dict.fromkeys(p.mode for p in self.points)
        return tuple(seen)

    def speedup(self, batch: int, mode: str, context: int | None = None) -> float | None:
        """Measured aggregate tokens per second of `mode` over vanilla's at the same B and context."""
        point, plain = self.point(batch, mode, context), self.point(batch, VANILLA, context)
        if point is None or plain is None or plain.aggregate_tps <= 0:
            return None
        return point.aggregate_tps / plain.aggregate_tps

    def predicted_speedup(self, batch: int, mode: str, context: int | None = None) -> float | None:
        """What the formula predicted for `mode` at B = `batch` (and `context`; default the first)."""
        context = self.contexts[0] if context is None and self.contexts else context
        found = (s for c, b, m, s in self.predicted_by_context if (c, b, m) == (context, batch, mode))
        return next(found, None)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LoadSweep:
        memory = data.get("memory")
        return cls(
            target=str(data["target"]),
            drafter=str(data["drafter"]),
            backend=str(data["backend"]),
            points=tuple(LoadPoint(**p) for p in data["points"]),
            predicted=tuple((int(b), float(s)) for b, s in data.get("predicted", ())),
            break_even_measured=data.get("break_even_measured"),
            break_even_predicted=data.get("break_even_predicted"),
            memory=Memory(**memory) if memory else None,
            failure_mode=str(data.get("failure_mode", "")),
            verify_curve=tuple((int(n), float(s)) for n, s in data.get("verify_curve", ())),
            notes=tuple(data.get("notes", ())),
            break_even_mode=str(data.get("break_even_mode", "")),
            break_evens=tuple((int(c), m, p) for c, m, p in data.get("break_evens", ())),
            predicted_by_context=tuple(
                (int(c), int(b), str(m), float(s)) for c, b, m, s in data.get("predicted_by_context", ())
            ),
            settings=dict(data.get("settings", {})),
        )
