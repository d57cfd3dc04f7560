"""The load test: B requests in flight at once, plain against speculative, per batch size and context.

    sweep = run_load_sweep(engine, load_prompts(default_prompts_path()), LoadSettings(batches=(1, 4, 16)))
    print(format_load(sweep))        # engine/bench/load_report.py

The article's section 4 says speculation is cheap only while the target's forward has
room: at B = 1 the k draft rows ride on a forward that reads the weights anyway, but a
batch fills the forward, each draft row then costs what a real token costs, and drafting
stops paying (its section 6: "B <= 8, ideally B = 1"). This measures where that happens
on the loaded pair, as a server meets it.

Closed loop, as a server's steady load: B requests run together (engine/batching.py,
one target forward per step over all of them), and each time one ends the next prompt of
the set joins, until the run's requests are done (`LoadSettings.requests`; by default
enough that the batch is full for most of the run). Every request is greedy unless told
otherwise and has its own seed. Per (context, B, mode) the point holds the aggregate
tokens per second (all tokens over the run's wall time, prefills included, as a server's
users see it; the median over `repeat` runs), each request's own tokens per second and
its time to first token from the moment it joined (medians over all requests), and
what the steps drafted and accepted. The modes run interleaved, run after run, their
order turning from one point to the next, so a busy spell of the machine hits them alike.

After each context's runs the engine's cost model holds T(rows) as the batched steps
measured it; engine/bench/load_predict.py turns that, the drafter's cost and the
acceptance measured at the smallest B into the predicted speedup per B and the break-evens.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.backends.capabilities import Slots, has
from engine.bench.load_contexts import median_length, prompt_ids, room_needed
from engine.bench.load_predict import summarize
from engine.bench.load_results import AUTO, VANILLA, LoadPoint, LoadSweep
from engine.bench.load_settings import LoadSettings
from engine.bench.prompts import BenchPrompt
from engine.bench.results import BenchmarkCancelled
from engine.core.costs import CostSnapshot
from engine.core.draft_length import DraftLength, curve_sizes, measure_verify_curve
from engine.core.events import StepEvent
from engine.core.sampling import SamplingConfig
from engine.drafters.base import forget_replies
from engine.errors import ConfigError

Progress = Callable[[str, float], None]  # (what is being done, share done 0..1), last ("Done", 1.0)
WARMUP_TOKENS = 16


def run_load_sweep(
    engine,
    prompts: tuple[BenchPrompt, ...],
    settings: LoadSettings = LoadSettings(),
    *,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> LoadSweep:
    """Measure every (context, B, mode) of `settings` on `engine`, which must hold max(B) sequences at
    once (loaded with parallel = max(B)) and have a drafter. Raises BenchmarkCancelled when `cancel`
    is set (checked between steps). `progress(message, fraction)` as run_benchmark's."""
    settings.check()
    if not prompts:
        raise ConfigError("The load test needs at least one prompt.")
    if engine.drafter is None:
        raise ConfigError(
            "The load test compares plain and speculative decoding, so it needs a drafter: "
            "choose n-gram lookup or a draft model."
        )
    target = engine.target
    most = max(settings.batches)
    holds = getattr(target, "max_slots", 1) if has(target, Slots) else 1
    if most > holds:
        raise ConfigError(
            f"{target.info.name} was loaded for {holds} sequence{'s' if holds != 1 else ''} at once and the load "
            f"test's largest batch is {most}: load it with parallel {most} (the CLI does)."
        )
    report = progress or (lambda message, fraction: None)
    cancel = cancel or threading.Event()
    k_max = engine.config.k_max
    notes: list[str] = []
    contexts = []
    for context in settings.contexts or (None,):
        if context is not None and room_needed(context, settings.max_tokens, k_max) > target.n_ctx:
            notes.append(
                f"Context {context} left out: with {settings.max_tokens} tokens of reply it needs "
                f"{room_needed(context, settings.max_tokens, k_max)} tokens of window and each sequence holds "
                f"{target.n_ctx} (load with a larger -c)."
            )
        else:
            contexts.append(context)
    if not contexts:
        raise ConfigError(" ".join(notes) or "No context length fits.")

    total = len(contexts) * len(settings.batches) * len(settings.modes) * settings.repeat
    done = 0
    points: list[LoadPoint] = []
    curves: dict[int, CostSnapshot] = {}
    acceptance: dict[int, float | None] = {}
    extension: dict[int, float] | None = None
    for context in contexts:
        report(f"Preparing the prompts{'' if context is None else f' at {context} tokens'}", done / total)
        ids = prompt_ids(engine, prompts, context, settings.requests or 2 * most)
        _check_room(target, prompts, ids, settings.max_tokens, k_max)
        label = context if context is not None else median_length(ids[: len(prompts)])
        warm = min(2, most)  # two requests at once: the batched forward's first call is not measured either
        for _ in range(settings.warmup):
            for mode in settings.modes:
                _check(cancel)
                report(f"Context {label}: warming up ({mode})", done / total)
                short = dataclasses.replace(settings, max_tokens=WARMUP_TOKENS)
                _run(engine, ids[:warm], warm, mode, short, cancel, warm)
        for index, batch in enumerate(settings.batches):
            runs: dict[str, list[_Run]] = {mode: [] for mode in settings.modes}
            for repeat in range(settings.repeat):
                for mode in _turn(settings.modes, index + repeat):
                    _check(cancel)
                    report(f"Context {label}, B = {batch}, {mode} (run {repeat + 1}/{settings.repeat})", done / total)
                    requests = settings.requests or max(len(prompts), 2 * batch)
                    runs[mode].append(_run(engine, ids, batch, mode, settings, cancel, requests))
                    done += 1
            points += [_point(label, batch, mode, runs[mode]) for mode in settings.modes]
            if batch == settings.batches[0]:
                drafting = [r for mode in settings.modes if mode != VANILLA for r in runs[mode]]
                tested = sum(r.tested for r in drafting)
                acceptance[label] = sum(r.accepted for r in drafting) / tested if tested else None
        if extension is None:  # once: the rows past what the load timed, out to max(B) x (k_max + 1)
            report("Measuring the verify cost of a full batch's rows", done / total)
            extension = _extension(engine, most, k_max)
        curves[label] = _with(engine.costs.snapshot(), extension)
    report("Predicting from the measured costs", 1.0)
    sweep = summarize(engine, points, curves, acceptance, settings, notes)
    report("Done", 1.0)
    return sweep


@dataclass
class _Run:
    """One closed-loop run of one (B, mode): its totals, and each request's own numbers."""

    wall_s: float = 0.0
    tokens: int = 0
    request_tps: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    step_batches: list[int] = field(default_factory=list)  # sequences in each step's forward
    k_asked: list[int] = field(default_factory=list)  # each sequence's k in each step
    drafted: int = 0
    accepted: int = 0
    tested: int = 0


def _run(engine, ids: list[list[int]], batch: int, mode: str, settings: LoadSettings, cancel, requests: int) -> _Run:
    """Keep `batch` requests in flight until `requests` have run (request i asks ids[i]); what it measured."""
    engine.clear_prompt_caches()  # each run starts as the first after loading: no prompt cached
    speculative = mode != VANILLA
    k = "auto" if mode == AUTO else (int(mode.removeprefix("k=")) if speculative else 0)
    queue = list(range(requests))[::-1]
    joined: dict[int, float] = {}
    first: dict[int, float] = {}
    run = _Run()
    together = engine.batch(batch)
    begin = time.perf_counter()
    try:
        while queue or together.sequences:
            while queue and not together.full:
                i = queue.pop()
                sampling = SamplingConfig(max_tokens=settings.max_tokens, temperature=settings.temperature, seed=i)
                length = DraftLength(k, engine.config.k_max) if speculative else None
                sequence = together.join(
                    ids[i % len(ids)], sampling, speculative=speculative, draft_length=length, cancel=cancel, tag=i
                )
                forget_replies(sequence.drafter)  # a request drafts from its own text, not an earlier reply
                joined[i] = time.perf_counter()
            outcomes = together.step()
            now = time.perf_counter()
            sizes = [0]
            for sequence, outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
                _count(run, sequence, outcome, joined, first, now)
                if outcome.finish_reason != "cancelled" and outcome.stats.steps:
                    sizes.append(outcome.batch)
            if max(sizes):
                run.step_batches.append(max(sizes))
            _check(cancel)
        run.wall_s = time.perf_counter() - begin
    finally:
        together.close()
    return run


def _count(run: _Run, sequence, event: StepEvent, joined: dict, first: dict, now: float) -> None:
    """One sequence's event: its first token's time, its k; its totals once it has ended."""
    tag = sequence.tag
    if tag not in first and event.stats.tokens:
        first[tag] = now
        run.ttft_s.append(now - joined[tag])
    run.k_asked.append(event.k)
    if sequence.ended:
        s = event.stats
        run.tokens += s.tokens
        run.drafted += s.drafted
        run.accepted += s.accepted
        run.tested += s.tested
        if s.wall_s > 0:
            run.request_tps.append(s.tokens / s.wall_s)


def _point(context: int, batch: int, mode: str, runs: list[_Run]) -> LoadPoint:
    drafted = sum(r.drafted for r in runs)
    steps = [b for r in runs for b in r.step_batches]
    asked = [k for r in runs for k in r.k_asked]
    return LoadPoint(
        batch=batch,
        context=context,
        mode=mode,
        aggregate_tps=_median([r.tokens / r.wall_s for r in runs if r.wall_s > 0]),
        request_tps=_median([t for r in runs for t in r.request_tps]),
        ttft_s=_median([t for r in runs for t in r.ttft_s]),
        mean_k=sum(asked) / len(asked) if asked and mode != VANILLA else 0.0,
        acceptance=sum(r.accepted for r in runs) / drafted if drafted else None,
        mean_batch=sum(steps) / len(steps) if steps else 0.0,
        tokens=sum(r.tokens for r in runs),
    )


def _check_room(target, prompts, ids, max_tokens: int, k_max: int) -> None:
    for i, tokens in enumerate(ids):
        prompt = prompts[i % len(prompts)]
        if room_needed(len(tokens), max_tokens, k_max) > target.n_ctx:
            raise ConfigError(
                f"Prompt {prompt.id!r} is {len(tokens)} tokens long: with {max_tokens} tokens of reply it does not "
                f"fit the {target.n_ctx} tokens each sequence holds; load with a larger -c or lower --max-tokens."
            )


def _extension(engine, most: int, k_max: int) -> dict[int, float]:
    """T(rows) for the row counts past the cost model's largest, up to most x (k_max + 1): what a
    full batch drafting k_max each runs (the load times these only up to its time budget)."""
    known = max(engine.costs.verify_s, default=0)
    sizes = tuple(n for n in curve_sizes(most, k_max) if n > known)
    if not sizes:
        return {}
    return measure_verify_curve(engine.target, sizes, repeats=2, budget_s=10.0)


def _with(snapshot: CostSnapshot, extension: dict[int, float]) -> CostSnapshot:
    """The cost model's curve with the extension's sizes added, made non-decreasing the way timing
    noise allows: each T(n) is the least of T(m) for m >= n. A busy machine only ever makes a forward
    slower, so of two sizes timed out of order the cheaper one tells the truth; a T(1) that a busy
    spell inflated during the runs, above a T(17) timed at load, made the formula predict a speedup
    larger than the tokens a step can accept."""
    curve = dict(snapshot.verify_s)
    for n, seconds in extension.items():
        curve.setdefault(n, seconds)
    rising, least = [], float("inf")
    for n in sorted(curve, reverse=True):
        least = min(least, curve[n])
        rising.append((n, least))
    return dataclasses.replace(snapshot, verify_s=tuple(reversed(rising)))


def _turn(modes: tuple[str, ...], shift: int) -> tuple[str, ...]:
    """`modes` rotated by `shift`: each mode runs first at some points, so whatever the first run after
    a change of B pays (a new slot's first allocation, a cold cache) is not always the same mode's."""
    shift %= len(modes)
    return modes[shift:] + modes[:shift]


def _check(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise BenchmarkCancelled("The load test was cancelled.")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
