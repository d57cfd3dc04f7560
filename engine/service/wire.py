"""What the engine reports, as JSON and back: the engine server's wire format.

Every record the desktop app draws from travels through here: a step
(`StepEvent` with its tokens, its running `RunStats`, and the copies the engine
took beside it: the drafter's statistics, tagged with the drafter they belong
to and rebuilt as its registry entry's stats type, and the `CostSnapshot`), a finished reply
(`GenerationResult`, rebuilt on the client from its steps, as `collect` builds
it in process), a comparison and its divergence, the loaded model (`ModelInfo`),
its cost snapshot, sampling settings. Decoding a record gives one equal to what the
engine made: floats go through JSON's shortest repr, which Python reads back
exactly, so the token colours (source, p, q) and every chart drawn from a stream
equal those of an in-process run.

Records travel as JSON written by orjson (`dumps`): the values the standard
library's `json.dumps` would write, in a tenth of its time, which every step of
every stream pays on a machine whose cores all decode.

Light: no torch, no llama.cpp, no Qt.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import MISSING, asdict, fields
from typing import Any

import orjson

from engine.backends.info import ModelInfo
from engine.core.costs import CostSnapshot
from engine.core.events import Comparison, Divergence, GenerationResult, RunStats, Source, StepEvent, TokenInfo, collect
from engine.core.sampling_config import SamplingConfig
from engine.drafters.registry import stats_owner, stats_specs

# A client refuses a server that speaks another version: fields may mean other things.
# 2: a batch holds the steps themselves (each with its run, tagged drafter statistics and cost
# snapshot), where 1 held {"run", "step", "drafter_stats", "costs"} items.
WIRE_VERSION = 2


# -- JSON -------------------------------------------------------------------------------------

_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(value: Any) -> bytes:
    """Compact JSON. Floats are written as their shortest digits, which read back exactly; a
    non-finite float (JSON has none) is written as null. Integers past 64 bits, which orjson
    refuses, go through the standard library."""
    try:
        return orjson.dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), default=_plain).encode()


def _plain(value: Any) -> Any:
    """What orjson writes of a record inside a drafter's statistics, for the standard library."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def loads(data: bytes | str) -> Any:
    """Raises ValueError (orjson.JSONDecodeError is one) for text that is not JSON."""
    return orjson.loads(data)


def batch(items: list[bytes]) -> bytes:
    """A batch of encoded step items (batches.py) as one encoded event, `{"steps": [...]}`."""
    return b'{"steps":[' + b",".join(items) + b"]}"


# -- tokens and steps ---------------------------------------------------------------------


def token_to_dict(token: TokenInfo) -> dict:
    return {
        "id": token.id,
        "text": token.text,
        "source": token.source.value,
        "p": token.p,
        "q": token.q,
        "top_ids": list(token.top_ids),
        "top_logits": list(token.top_logits),
    }


_SOURCES = {source.value: source for source in Source}  # a dict look-up: Source(value) takes 1-2 us a token


def token_from_dict(data: dict) -> TokenInfo:
    p, q = data["p"], data.get("q")
    return TokenInfo(
        id=int(data["id"]),
        text=data["text"],
        source=_SOURCES.get(data["source"]) or Source(data["source"]),
        p=float("nan") if p is None else float(p),  # a NaN travels as null (`dumps`)
        q=None if q is None else float(q),
        top_ids=tuple(map(int, data.get("top_ids", ()))),
        top_logits=tuple(map(float, data.get("top_logits", ()))),
    )


_STATS_NAMES = tuple(f.name for f in fields(RunStats))
_STATS_FIELDS = set(_STATS_NAMES)
_TUPLE_FIELDS = ("depth_tested", "depth_accepted", "notes")


def stats_to_dict(stats: RunStats) -> dict:
    """Every field as measured (unlike `RunStats.as_dict`, which rounds for reports and adds derived numbers).
    Field by field, not `asdict`, which deep-copies each value: this runs for every step on the wire."""
    data = {name: getattr(stats, name) for name in _STATS_NAMES}
    for name in _TUPLE_FIELDS:
        data[name] = list(data[name])
    return data


def stats_from_dict(data: dict) -> RunStats:
    # Fields a newer server added are left out rather than refused: a chart needs only what it knows.
    known = {name: value for name, value in data.items() if name in _STATS_FIELDS}
    for name in _TUPLE_FIELDS:
        if name in known:
            known[name] = tuple(known[name])
    return RunStats(**known)


def step_to_dict(step: StepEvent) -> dict:
    return {
        "index": step.index,
        "tokens": [token_to_dict(t) for t in step.tokens],
        "text": step.text,
        "k": step.k,
        "drafted": step.drafted,
        "accepted": step.accepted,
        "draft_s": step.draft_s,
        "verify_s": step.verify_s,
        "other_s": step.other_s,
        "stats": stats_to_dict(step.stats),
        "finish_reason": step.finish_reason,
        "end_token": None if step.end_token is None else token_to_dict(step.end_token),
        "stop_tokens": [token_to_dict(t) for t in step.stop_tokens],
        "batch": step.batch,
        "run": step.run,
        "drafter_stats": drafter_stats_to_dict(step.drafter_stats),
        "costs": None if step.costs is None else costs_to_dict(step.costs),
    }


def step_from_dict(data: dict) -> StepEvent:
    end = data.get("end_token")
    return StepEvent(
        index=int(data["index"]),
        tokens=tuple(token_from_dict(t) for t in data["tokens"]),
        text=data["text"],
        k=int(data["k"]),
        drafted=int(data["drafted"]),
        accepted=int(data["accepted"]),
        draft_s=float(data["draft_s"]),
        verify_s=float(data["verify_s"]),
        other_s=float(data["other_s"]),
        stats=stats_from_dict(data["stats"]),
        finish_reason=data.get("finish_reason"),
        end_token=None if end is None else token_from_dict(end),
        stop_tokens=tuple(token_from_dict(t) for t in data.get("stop_tokens", ())),  # absent from older servers
        batch=int(data.get("batch", 1)),  # absent from older servers, which ran one sequence at a time
        run=data.get("run"),
        drafter_stats=drafter_stats_from_dict(data.get("drafter_stats")),
        costs=None if data.get("costs") is None else costs_from_dict(data["costs"]),
    )


# -- a drafter's statistics -----------------------------------------------------------------
# On the wire {"drafter": the registry name whose stats type it is, field: value, ...}, each field as
# the record holds it (a nested record as an object, orjson writes dataclasses itself); read back as
# that entry's stats type (`stats_owner(name).stats`), nested records and tuples rebuilt.

_stats_names: dict[type, str | None] = {}  # stats type -> the first registry entry that reports it
_UNSEEN = object()
_readers: dict[str, tuple] = {}  # registry name -> (its stats type, fields read as they are, (field, rebuild)...)


def stats_name(stats: Any) -> str | None:
    """The registry entry whose stats type `stats` is (a chain's: "chain"); None for another type."""
    kind = type(stats)
    name = _stats_names.get(kind, _UNSEEN)
    if name is _UNSEEN:  # a drafter registered since the last look (a test's toy drafter)
        for spec in stats_specs():
            _stats_names.setdefault(spec.stats, spec.name)
        name = _stats_names.setdefault(kind, None)  # None: no drafter's, said once, not looked for every step
    return name


def drafter_stats_to_dict(stats: Any) -> dict | None:
    """None for none, or for statistics of no registered drafter's type (they cannot be read back)."""
    if stats is None:
        return None
    name = stats_name(stats)
    if name is None:
        return None
    data = {"drafter": name}
    for f in fields(stats):
        data[f.name] = getattr(stats, f.name)
    return data


def drafter_stats_from_dict(data: dict | None):
    """The DrafterStats `drafter_stats_to_dict` wrote, or None (no statistics, or an unknown drafter's).
    Every step of a reply pays this on the client: what to do with each field is worked out once
    per drafter."""
    if not data:
        return None
    name = data.get("drafter")
    reader = _readers.get(name)
    if reader is None:
        spec = stats_owner(name)
        if spec is None:
            return None
        reader = _readers[name] = _stats_reader(spec.stats)
    kind, plain, rebuilt = reader
    values = {f: data[f] for f in plain if f in data}
    for f, read in rebuilt:
        if f in data:
            value = data[f]
            values[f] = value if value is None else read(value)
    return kind(**values)


def _stats_reader(kind: type) -> tuple:
    """(kind, the fields JSON gives as they are, (field, how to rebuild it) for tuples and nested records)."""
    hints = typing.get_type_hints(kind)
    plain, rebuilt = [], []
    for f in fields(kind):
        read = _reader(hints.get(f.name))
        if read is None:
            plain.append(f.name)
        else:
            rebuilt.append((f.name, read))
    return kind, tuple(plain), tuple(rebuilt)


def _reader(hint):
    """How to rebuild a value of type `hint` from JSON; None: as it is."""
    if dataclasses.is_dataclass(hint):
        return lambda value: hint(**value)
    if hint is tuple or typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        inner = args[0] if args and dataclasses.is_dataclass(args[0]) else None
        if inner is not None:
            return lambda value: tuple(inner(**v) for v in value)
        return tuple
    return None


# -- results --------------------------------------------------------------------------------


def result_from_steps(steps: list[StepEvent]) -> GenerationResult:
    """The reply the steps make, exactly as `Engine.generate` collects it in process."""
    return collect(steps)


def divergence_to_dict(divergence: Divergence | None) -> dict | None:
    return None if divergence is None else asdict(divergence)


def divergence_from_dict(data: dict | None) -> Divergence | None:
    return None if data is None else Divergence(**data)


def comparison_from_runs(vanilla: list[StepEvent], speculative: list[StepEvent], divergence: dict | None) -> Comparison:
    return Comparison(collect(vanilla), collect(speculative), divergence_from_dict(divergence))


# -- the loaded model, its costs, the sampling ------------------------------------------------


def model_info_to_dict(info: ModelInfo) -> dict:
    return asdict(info)


def model_info_from_dict(data: dict) -> ModelInfo:
    """The ModelInfo `model_info_to_dict` wrote; a field with a default may be missing (an older server)."""
    return ModelInfo(**{f.name: data[f.name] for f in fields(ModelInfo) if f.name in data or f.default is MISSING})


def costs_to_dict(costs: CostSnapshot) -> dict:
    """A cost snapshot (`CostModel.snapshot()`); orjson writes its (n, seconds) pairs as arrays."""
    return {
        "verify_s": costs.verify_s,
        "draft_s_per_token": costs.draft_s_per_token,
        "draft_fixed_s": costs.draft_fixed_s,
        "window": costs.window,
        "replays": costs.replays,
        "rollback_fixed_s": costs.rollback_fixed_s,
    }


_last_costs: tuple = (None, None)  # (the last cost dict read, its snapshot): many steps leave the costs as they were


def costs_from_dict(data: dict) -> CostSnapshot:
    """The CostSnapshot `costs_to_dict` wrote; the one read before when nothing changed since."""
    global _last_costs
    last, snapshot = _last_costs
    if data == last:
        return snapshot
    snapshot = CostSnapshot(
        verify_s=tuple(sorted((int(n), float(s)) for n, s in data["verify_s"])),
        draft_s_per_token=float(data["draft_s_per_token"]),
        draft_fixed_s=float(data.get("draft_fixed_s", 0.0)),
        window=int(data["window"]),
        replays=bool(data.get("replays", False)),  # absent from an engine older than the rollback term
        rollback_fixed_s=float(data.get("rollback_fixed_s", 0.0)),
    )
    _last_costs = (data, snapshot)
    return snapshot


def sampling_to_dict(sampling: SamplingConfig) -> dict:
    data = asdict(sampling)
    data["stop"] = list(sampling.stop)
    return data


def sampling_from_dict(data: dict[str, Any]) -> SamplingConfig:
    """Raises ConfigError (with the setting's range) for a bad value, TypeError for an unknown field."""
    values = dict(data)
    if "stop" in values:
        values["stop"] = tuple(values["stop"])
    return SamplingConfig(**values)
