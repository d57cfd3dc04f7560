"""Auto-tune: which drafter and draft length are fastest for this target on these prompts.

Every drafter the loaded target allows is tried with a few draft lengths k
(for tree drafters k is the node budget), greedy, on short replies: every
registered drafter whose spec's needs the target has and whose `ready` holds
(n-gram lookup and suffix decoding always; the loaded draft model; heads given
or shipped for the target; the model's own MTP layers; lookahead and early exit
where the target has their capabilities), and the suggested chains
(suffix+model, suffix+eagle, suffix+medusa) whose members are all allowed.
Plain decoding (k = 0) is measured once per prompt and is the baseline of
every candidate. A candidate's score is its decoding speedup as the benchmark
reports it for all prompts: the geometric mean over prompts of speculative
tokens/s over vanilla tokens/s on that prompt. The target loads once: each candidate's drafter is made on that same target
(engine/drafters/registry.py make_drafter) and closed after, so a second copy of
the target is never loaded; a chain's member that is the engine's own drafter
(its draft model) is that drafter, not a second copy.

The run time is bounded by the candidates: each runs every prompt once. A chain
is tried at k "auto" only (its members size their drafts as it decodes), so the
three suggested chains add at most three passes over the prompts.

    result = run_autotune(EngineConfig(), load_prompts(default_prompts_path()))
    print(format_autotune(result)); best = result.best_config

The records (settings, candidates, the result) and format_autotune are in
autotune_results.py, which loads no torch; they are re-exported here.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
from collections.abc import Callable

from engine.api import Engine, EngineConfig
from engine.bench.autotune_results import (  # noqa: F401
    CHAIN_KS,
    PLAIN,
    TREE_KS,
    AutotuneResult,
    AutotuneSettings,
    Candidate,
    CandidateResult,
    format_autotune,
)
from engine.bench.prompts import BenchPrompt, Turns
from engine.bench.results import BenchmarkCancelled, geometric_mean
from engine.bench.runner import check_context_room, encode_prompt, engine_for
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.drafters.base import forget_replies, measured_token_cost, share_costs
from engine.drafters.chain_spec import SUGGESTED, is_chain, member_names
from engine.drafters.registry import all_drafters, drafter_spec, make_drafter, node_budget
from engine.errors import ConfigError

# progress(message, fraction), as run_benchmark's: what is being done ("Plain decoding: fix-typos",
# "Preparing the ngram drafter", "ngram, k 4: fix-typos", "Done") and the share done, rising from 0.0
# to 1.0, last ("Done", 1.0). As JSON: engine.bench.results.progress_to_dict / progress_from_dict.
Progress = Callable[[str, float], None]
WARMUP_TOKENS = 8


def allowed_drafters(config: EngineConfig, target) -> tuple[str, ...]:
    """The drafters `target` (a loaded Backend) can serve with what `config` has, in the registry's
    order: each registered drafter whose spec's needs the target has and whose `ready` holds (with
    `config`'s options for the loaded drafter, else its defaults: heads given or shipped for this
    target, the model's own MTP layers, the loaded draft model, never a second one); then each
    suggested chain whose members are all among these, and the loaded drafter when it is another chain."""

    def options(name: str):
        return config.drafter_options() if name == config.drafter else None

    drafters = [
        spec.name
        for spec in all_drafters()
        if spec.name != PLAIN.drafter and spec.can_serve(target, options(spec.name))
    ]
    drafters += [chain for chain in SUGGESTED if all(member in drafters for member in member_names(chain))]
    if is_chain(config.drafter) and config.drafter not in drafters:
        if drafter_spec(config.drafter).can_serve(target, config.drafter_options()):
            drafters.append(config.drafter)
    return tuple(drafters)


def candidates_for(drafters: tuple[str, ...], backend: str = "torch") -> tuple[Candidate, ...]:
    """Each drafter with the draft lengths tried, or the node budgets where it drafts trees on `backend`;
    a chain at "auto" only."""
    found = []
    for d in drafters:
        budget = node_budget(d, backend)
        ks = ("auto",) if is_chain(d) else TREE_KS if budget else CHAIN_KS  # a chain sizes its drafts itself
        found += [Candidate(d, k, budget) for k in ks]
    return tuple(found)


def config_for(config: EngineConfig, candidate: Candidate, target_backend: str) -> EngineConfig:
    """`config` with the candidate's drafter and k; the target's backend pinned when "auto" would
    pick another one for this drafter (auto loads a GGUF on PyTorch only for torch drafters)."""
    changes: dict = {"k": candidate.k}  # "none", 0: plain decoding
    if drafter_spec(config.drafter).needs_torch and config.backend == "auto":
        changes["backend"] = target_backend
    # The candidate's own options when it is the loaded drafter, else its defaults (heads given
    # for one kind are not the other kind's; a draft model belongs to the model drafter only).
    chosen = config.with_drafter(candidate.drafter)
    if is_chain(candidate.drafter) and candidate.drafter != config.drafter:
        # A chain holds its members' options: the loaded drafter's (its draft model, its heads) carry over.
        names = {f.name for f in dataclasses.fields(chosen.options)}
        kept = {f.name: getattr(config.options, f.name) for f in dataclasses.fields(config.options) if f.name in names}
        chosen = dataclasses.replace(chosen, options=dataclasses.replace(chosen.options, **kept))
    return dataclasses.replace(chosen, **changes)


def run_autotune(
    config: EngineConfig,
    prompts: tuple[BenchPrompt, ...],
    settings: AutotuneSettings = AutotuneSettings(),
    *,
    engine: Engine | None = None,
    candidates: tuple[Candidate, ...] | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> AutotuneResult:
    """Load `config` (unless an `engine` is given, which stays open), try every candidate (by
    default all that the target allows), rank them. Raises BenchmarkCancelled when `cancel` is set.
    `progress(message, fraction)` as run_benchmark's: words and the share done, rising to ("Done", 1.0)."""
    if not prompts:
        raise ConfigError("Auto-tune needs at least one prompt.")
    report = progress or (lambda message, fraction: None)
    cancel = cancel or threading.Event()
    with engine_for(config, engine, report) as engine:
        if candidates is None:
            candidates = candidates_for(allowed_drafters(engine.config, engine.target), engine.target.info.backend)
        candidates = tuple(c for c in candidates if c != PLAIN)  # measured anyway, as the baseline
        if not candidates:
            raise ConfigError("Auto-tune needs at least one candidate drafter.")
        return _tune(engine, prompts, settings, candidates, report, cancel)


def _tune(engine: Engine, prompts, settings, candidates, report, cancel) -> AutotuneResult:
    first_ids = {}
    for prompt in prompts:
        first_ids[prompt.id] = encode_prompt(engine, prompt)
        check_context_room(engine, prompt, len(first_ids[prompt.id]), settings.max_tokens)
    greedy = SamplingConfig(max_tokens=settings.max_tokens)
    warm = SamplingConfig(max_tokens=min(WARMUP_TOKENS, settings.max_tokens))
    total = sum(p.turns for p in prompts) * (1 + len(candidates))
    done = 0

    def step(what: str) -> None:
        _check(cancel)
        report(what, 0.1 + 0.9 * done / total)

    # ---- the baseline: plain decoding, once per prompt (a conversation turn by turn) ----------
    if settings.warmup:
        step("Warming up plain decoding")
        engine.generate(first_ids[prompts[0].id], warm, speculative=False, cancel=cancel)
    vanilla, asked = [], []  # asked: (the turn, its token ids, whether it starts a conversation)
    turns = Turns()
    for prompt in prompts:
        replies: list[str] = []
        for index in range(prompt.turns):
            turn, _ = turns.get(prompt, index, replies)
            turn_ids = first_ids[prompt.id] if index == 0 else encode_prompt(engine, turn)
            step(f"Plain decoding: {turn.id}")
            engine.clear_prompt_caches()  # see below
            vanilla.append(engine.generate(turn_ids, greedy, speculative=False, cancel=cancel))
            asked.append((turn, turn_ids, index == 0))
            replies.append(vanilla[-1].text)
            done += 1

    # ---- every candidate on every prompt, on the same target ---------------------------------
    results = []
    by_drafter = {}
    for candidate in candidates:
        by_drafter.setdefault(candidate.drafter, []).append(candidate)
    for kind, group in by_drafter.items():
        step(f"Preparing the {kind} drafter")
        drafter, made = _drafter(engine, kind)  # made: what to close after (never the engine's own drafter)
        try:
            costs = CostModel(verify_s=dict(engine.costs.verify_s))
            if engine.config.measure_costs and drafter is not None:
                costs.draft_s_per_token = measured_token_cost(drafter) or 0.0
            for candidate in group:
                tuned = Engine(
                    engine.target, drafter, config_for(engine.config, candidate, engine.target.info.backend), costs
                )
                if settings.warmup:
                    step(f"Warming up {candidate.label}")
                    tuned.generate(asked[0][1], warm, cancel=cancel)
                runs = []
                for turn, turn_ids, starts in asked:
                    step(f"{candidate.label}: {turn.id}")
                    if starts and drafter is not None:
                        forget_replies(drafter)  # each conversation meets the drafter afresh, as in the benchmark
                    # Every run reads its prompt from empty caches: a prefix the last run left (its
                    # reply's keys and values, computed one token or one draft at a time) changes the
                    # rounding, and 11 of 24 greedy replies differed from plain decoding's for it.
                    tuned.clear_prompt_caches()
                    runs.append(tuned.generate(turn_ids, greedy, cancel=cancel))
                    done += 1
                _check(cancel)
                results.append(_score(candidate, runs, vanilla))
        finally:
            for each in made:
                each.close()
            if engine.drafter is not None and hasattr(engine.drafter, "costs"):
                share_costs(engine.drafter, engine.costs)  # the engine's own drafter: back on the engine's cost model
    report("Done", 1.0)
    baseline = CandidateResult(
        PLAIN, 1.0, statistics.median(r.stats.tokens_per_s for r in vanilla), 0.0, 1.0, len(vanilla), len(vanilla)
    )
    ranked = tuple(sorted([*results, baseline], key=lambda r: r.speedup, reverse=True))
    best = ranked[0].candidate
    return AutotuneResult(
        ranked=ranked,
        vanilla_tps=baseline.tokens_per_s,
        best_config=config_for(engine.config, best, engine.target.info.backend),
        prompts=len(vanilla),
        max_tokens=settings.max_tokens,
    )


def _drafter(engine: Engine, kind: str):
    """(drafter, the drafters made here, to close after): the engine's own when it is of this kind,
    else a new one on its target; a chain of new members and the engine's own drafter where it is one."""
    own = engine.drafter if engine.drafter is not None else None
    if kind == engine.config.drafter and own is not None:
        return own, []
    if not is_chain(kind):
        made = _made_drafter(engine, kind)
        return made, [made] if made is not None else []
    from engine.drafters.chain import ChainDrafter

    members, made = [], []
    try:
        for name in member_names(kind):
            if name == engine.config.drafter and own is not None:
                members.append((name, own))  # the loaded draft model: never a second copy
            else:
                made.append(_made_drafter(engine, name))
                members.append((name, made[-1]))
        return ChainDrafter(members), made
    except BaseException:
        for each in made:
            each.close()
        raise


def _made_drafter(engine: Engine, kind: str):
    if drafter_spec(kind).loads_model:  # never a second model beside the loaded pair
        raise ConfigError(f"The {kind} drafter's model is not loaded: choose it in the model pair to tune it.")
    return make_drafter(engine.target, engine.config.with_drafter(kind))


def _score(candidate: Candidate, runs, vanilla) -> CandidateResult:
    speedups = [_ratio(s.stats.tokens_per_s, v.stats.tokens_per_s) for s, v in zip(runs, vanilla)]
    accepted = sum(r.stats.accepted for r in runs)
    tested = sum(r.stats.tested for r in runs)
    drafted = sum(r.stats.drafted for r in runs)
    tokens = sum(r.stats.tokens for r in runs)
    steps = sum(r.stats.steps for r in runs)
    return CandidateResult(
        candidate=candidate,
        speedup=geometric_mean(speedups),  # the benchmark's decoding speedup over prompts
        tokens_per_s=statistics.median(r.stats.tokens_per_s for r in runs),
        acceptance=accepted / tested if tested else 0.0,
        tokens_per_forward=tokens / steps if steps else 0.0,
        identical=sum(s.tokens == v.tokens for s, v in zip(runs, vanilla)),
        prompts=len(runs),
        draft_acceptance=accepted / drafted if drafted else 0.0,
    )


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _check(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise BenchmarkCancelled("Auto-tune was cancelled.")
