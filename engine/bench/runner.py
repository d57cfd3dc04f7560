"""Run a benchmark: every prompt vanilla and speculative, repeated, on one loaded engine.

One `Engine` serves both modes, as in `Engine.compare`: vanilla is the same
decode loop with no drafter (k = 0), so the two differ in nothing but drafting.
Order per repeat: for each prompt, vanilla then speculative, so that slow
phases of a busy machine hit both modes alike. Before the measured runs, each
mode is warmed up on the first prompt (caches, thread pools, the cost model).

A conversation (a prompt with follow-ups) runs turn by turn, each turn a row of
the report: the context of turn t+1 is turn t's context, the vanilla reply and
the next follow-up, so both modes decode the same tokens at every turn (in
greedy float32 the speculative reply is the same anyway). The drafter forgets
what it learnt at each conversation's first turn only: what it keeps from
earlier turns is what a user's chat gives it. Contexts are built in the first
repeat and reused after, so every repeat measures the same prompts.

Each run starts a new resident-memory peak and reads it at the end (see
system.py). Peers, when asked for, run last, on the same prompt token ids
(every turn's, in order).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Callable

from engine.api import Engine, EngineConfig
from engine.bench import system
from engine.bench.peers import PeerSpec, default_peers, run_peers
from engine.bench.prompts import BenchPrompt, Turns
from engine.bench.results import (
    SPECULATIVE,
    VANILLA,
    BenchmarkCancelled,
    BenchReport,
    BenchSettings,
    FloorCheck,
    PromptSummary,
    RunRecord,
    memory_check,
    summarize,
    summarize_prompt,
)
from engine.core.divergence import first_divergence, rounding_bound
from engine.core.sampling import SamplingConfig
from engine.drafters.base import forget_replies
from engine.errors import ConfigError, SpecDeckError

# progress(message, fraction): what is being done, in words ("Loading the models", "Warming up",
# "Repeat 1/3: fix-typos, speculative", "Peer ...", "Done"), and the share of the run done, rising
# from 0.0 to 1.0; the last call is ("Done", 1.0). As JSON: results.progress_to_dict / progress_from_dict.
Progress = Callable[[str, float], None]
WARMUP_TOKENS = 16
REPLY_FRAMING_TOKENS = 8  # what a chat template adds around a message in the context (role markers, ends)


def run_benchmark(
    config: EngineConfig,
    prompts: tuple[BenchPrompt, ...],
    settings: BenchSettings = BenchSettings(),
    *,
    engine: Engine | None = None,
    peers: list[PeerSpec] | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    prompts_source: str = "",
    on_row: Callable[[PromptSummary], None] | None = None,
) -> BenchReport:
    """Load `config` (unless an `engine` is given, which stays open), measure, report.

    `peers` overrides the default peers (those matching the backend), which run
    only when `settings.peers` is set. Raises BenchmarkCancelled when `cancel` is set.
    `progress(message, fraction)` is called on this thread as the run goes: a message in
    words and the share of the run done (rising from 0.0 to 1.0), last ("Done", 1.0);
    `results.progress_to_dict` / `progress_from_dict` carry it as JSON.
    `on_row(PromptSummary)` is called as each prompt (each turn of a conversation) has run in both
    modes, with its row so far (the repeats done until then): a view can draw the rows as they come.
    """
    if not prompts:
        raise ConfigError("The benchmark needs at least one prompt.")
    report = progress or (lambda message, fraction: None)
    cancel = cancel or threading.Event()
    with engine_for(config, engine, report) as engine:
        return _measure(engine, prompts, settings, peers, report, cancel, prompts_source, on_row)


@contextlib.contextmanager
def engine_for(config: EngineConfig, engine: Engine | None, report):
    """`engine` as it is (it stays open), or one loaded from `config` (the first tenth of the
    progress) and closed afterwards."""
    if engine is not None:
        yield engine
        return
    report("Loading the models", 0.0)
    engine = Engine.load(config, progress=lambda message, fraction: report(message, 0.1 * fraction))
    try:
        yield engine
    finally:
        engine.close()


def _measure(engine, prompts, settings, peer_specs, report, cancel, prompts_source, on_row=None) -> BenchReport:
    if engine.drafter is None:
        raise ConfigError(
            "The benchmark compares vanilla and speculative decoding, so it needs a drafter: "
            "choose n-gram lookup or a draft model."
        )
    ids = {}
    for prompt in prompts:
        ids[prompt.id] = encode_prompt(engine, prompt)
        check_context_room(engine, prompt, len(ids[prompt.id]), settings.max_tokens)

    report("Measuring the memory bandwidth", 0.1)
    bandwidth = system.copy_bandwidth(*_bandwidth_device(engine)) if settings.measure_bandwidth else None

    greedy = SamplingConfig(max_tokens=settings.max_tokens)
    warm = SamplingConfig(max_tokens=min(WARMUP_TOKENS, settings.max_tokens))
    for _ in range(settings.warmup):
        for speculative in (False, True):
            _check(cancel)
            report("Warming up", 0.12)
            engine.generate(ids[prompts[0].id], warm, speculative=speculative, cancel=cancel)

    with_peers = settings.peers or peer_specs is not None
    ours_end = 0.7 if with_peers else 1.0
    total = settings.repeat * sum(p.turns for p in prompts) * 2
    per_run = system.reset_peak_rss()
    bound = rounding_bound(engine.target.info)
    turns = Turns()
    runs: list[RunRecord] = []
    done = 0
    for repeat in range(settings.repeat):
        for prompt in prompts:
            replies: list[str] = []
            for index in range(prompt.turns):
                asked, new = turns.get(prompt, index, replies)
                if new and asked.id not in ids:  # a later turn (the first is the prompt's own, encoded above)
                    ids[asked.id] = ids[prompt.id] if index == 0 else encode_prompt(engine, asked)
                vanilla = None
                for mode in (VANILLA, SPECULATIVE):
                    _check(cancel)
                    report(
                        f"Repeat {repeat + 1}/{settings.repeat}: {asked.id}, {mode}",
                        0.15 + (ours_end - 0.15) * done / total,
                    )
                    system.reset_peak_rss()
                    if mode == SPECULATIVE and index == 0:
                        forget_replies(engine.drafter)  # each conversation meets the drafter afresh
                    result = engine.generate(ids[asked.id], greedy, speculative=mode == SPECULATIVE, cancel=cancel)
                    peak = system.peak_rss_bytes()
                    _check(cancel)
                    identical = divergence = None
                    if mode == VANILLA:
                        vanilla = result
                    else:
                        identical = result.tokens == vanilla.tokens
                        if not identical:
                            divergence = first_divergence(result, vanilla, bound).as_dict()
                    runs.append(_record(asked, mode, repeat, result, peak, identical, divergence))
                    done += 1
                replies.append(vanilla.text)
                if on_row is not None:
                    on_row(summarize_prompt([r for r in runs if r.prompt_id == asked.id]))
    asked_prompts = turns.rows(prompts)

    prompt_summaries, kinds, overall = summarize(runs)
    floor = None
    if bandwidth is not None:
        floor = FloorCheck(
            weight_bytes=engine.target.info.weight_bytes,
            bandwidth_bytes_per_s=bandwidth.bytes_per_s,
            threads=bandwidth.threads,
            device=bandwidth.device,
            floor_s=system.floor_s_per_token(engine.target.info.weight_bytes, bandwidth),
            vanilla_s=_median([p.vanilla_s_per_token for p in prompt_summaries]),
        )
    memory = memory_check(runs, draft_memory_bytes(engine), per_run)

    peer_results = ()
    if with_peers:
        specs = peer_specs if peer_specs is not None else default_peers(engine, settings.llama_server)
        reference = {r.prompt_id: (r.text, r.token_ids) for r in runs if r.mode == VANILLA and r.repeat == 0}
        peer_results = run_peers(
            specs,
            asked_prompts,
            ids,
            reference,
            settings.max_tokens,
            settings.repeat,
            warmup=min(settings.warmup, 1),
            progress=lambda message, fraction: report(message, ours_end + (1 - ours_end) * fraction),
            cancel=cancel,
        )
    report("Done", 1.0)
    return BenchReport(
        settings=_describe(engine, settings, asked_prompts, prompts_source, bandwidth),
        prompts=prompt_summaries,
        kinds=kinds,
        overall=overall,
        floor=floor,
        memory=memory,
        peers=peer_results,
        runs=tuple(runs),
    )


def encode_prompt(engine, prompt: BenchPrompt) -> list[int]:
    """The prompt's token ids in its chat template; a ConfigError that names the prompt otherwise."""
    try:
        return engine.prompt_ids(list(prompt.messages))
    except SpecDeckError as error:
        raise ConfigError(f"Prompt {prompt.id!r}: {error}") from error


def check_context_room(engine, prompt: BenchPrompt, first: int, max_tokens: int) -> None:
    """Refuse, before anything is measured, a conversation whose last turn cannot fit the context:
    the first turn's `first` tokens, each follow-up, each earlier reply at up to `max_tokens`, and
    the last reply (every message with room for what the chat template puts around it)."""
    if not prompt.follow_ups:
        return
    framing = REPLY_FRAMING_TOKENS
    messages = first + sum(len(engine.target.tokenize(m["content"])) + framing for m in prompt.follow_ups)
    needed = messages + prompt.turns * (max_tokens + framing)
    if needed > engine.target.n_ctx:
        raise ConfigError(
            f"Conversation {prompt.id!r} needs up to {needed} tokens of context by its turn {prompt.turns} "
            f"({messages} of messages, {prompt.turns} replies of up to {max_tokens} tokens) but the "
            f"context holds {engine.target.n_ctx}: load the model with a larger context, lower max tokens, "
            "or leave out the multi-turn kind."
        )


def _check(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise BenchmarkCancelled("The benchmark was cancelled.")


def _record(prompt, mode, repeat, result, peak, identical, divergence) -> RunRecord:
    s = result.stats
    return RunRecord(
        prompt_id=prompt.id,
        kind=prompt.kind,
        mode=mode,
        repeat=repeat,
        tokens=s.tokens,
        wall_s=s.wall_s,
        prefill_s=s.prefill_s,
        steps=s.steps,
        drafted=s.drafted,
        accepted=s.accepted,
        tested=s.tested,
        predicted_speedup=s.predicted_speedup if mode == SPECULATIVE else 1.0,
        finish_reason=result.finish_reason,
        peak_rss_bytes=peak,
        identical=identical,
        divergence=divergence,
        text=result.text,
        token_ids=tuple(result.tokens),
    )


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _bandwidth_device(engine) -> tuple[str, int | None]:
    """Where the target's weights are read from, and with how many CPU threads."""
    info = engine.target.info
    if info.backend == "llama.cpp":
        from engine.backends.llama_cpp import default_threads

        # With GPU layers part of the weights live on the GPU: the CPU floor is then an approximation.
        return "cpu", engine.config.threads or default_threads()
    if info.device == "cpu":
        import torch

        return "cpu", torch.get_num_threads()
    return info.device, None


def draft_memory_bytes(engine) -> int:
    """The draft's own weights and KV cache (full context); for a drafter without a model of its
    own, the weights of the torch modules it holds (Medusa heads), 0 for n-gram lookup."""
    drafter = engine.drafter
    backend = getattr(drafter, "backend", None)
    if backend is None:
        import torch

        modules = [value for value in vars(drafter).values() if isinstance(value, torch.nn.Module)]
        return sum(p.numel() * p.element_size() for module in modules for p in module.parameters())
    weights = backend.info.weight_bytes
    try:
        from engine.models.doctor import estimate_memory
        from engine.models.locate import resolve
        from engine.models.metadata import read_metadata

        dtype = backend.info.dtype if backend.info.backend == "torch" else None
        _, cache = estimate_memory(read_metadata(resolve(backend.info.path)), backend.n_ctx, dtype)
    except (SpecDeckError, OSError, ValueError, KeyError):
        cache = 0  # metadata we cannot read: count the weights only
    return weights + cache


def _describe(engine, settings: BenchSettings, prompts, prompts_source: str, bandwidth) -> dict:
    config, info = engine.config, engine.target.info
    draft = getattr(engine.drafter, "backend", None)
    kinds: dict[str, int] = {}
    for prompt in prompts:
        kinds[prompt.kind] = kinds.get(prompt.kind, 0) + 1
    return {
        "target": {
            "name": info.name,
            "path": info.path,
            "backend": info.backend,
            "dtype": info.dtype,
            "device": info.device,
            "weight_bytes": info.weight_bytes,
            "n_params": info.n_params,
            "forward": info.forward,
        },
        "draft": (
            {
                "name": draft.info.name,
                "path": draft.info.path,
                "backend": draft.info.backend,
                "dtype": draft.info.dtype,
                "weight_bytes": draft.info.weight_bytes,
            }
            if draft
            else None
        ),
        "drafter": config.drafter if config.draft is None else "model",
        "drafter_name": getattr(engine.drafter, "name", ""),
        "k": config.k,
        "k_max": config.k_max,
        "threads": bandwidth.threads if bandwidth else config.threads,
        "max_tokens": settings.max_tokens,
        "repeat": settings.repeat,
        "warmup": settings.warmup,
        "greedy": True,
        "prompts_file": prompts_source,
        "prompts": len(prompts),
        "kinds": kinds,
    }
