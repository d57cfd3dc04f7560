"""The benchmark on a remote server (llama-server, vLLM, SGLang): `specdeck-cli bench --server URL`.

The same prompts, modes, repeats and report as a local benchmark: each prompt's
vanilla run (the server's vanilla twin, or the server told not to draft) and its
speculative run, greedy, timed by the server where it says (llama-server's
`timings`), else from the first streamed token to the last. What a server cannot
report stays out: no memory peaks, no bandwidth floor, no predicted speedup (no
cost model). The token-for-token check compares text, as the server sends no ids.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine.bench.prompts import BenchPrompt, Turns
from engine.bench.results import (
    SPECULATIVE,
    VANILLA,
    BenchmarkCancelled,
    BenchReport,
    BenchSettings,
    RunRecord,
    memory_check,
    summarize,
)
from engine.core.sampling_config import SamplingConfig
from engine.remote.base import RemoteEngine

WARMUP_TOKENS = 8


def run_remote_benchmark(
    remote: RemoteEngine,
    prompts: tuple[BenchPrompt, ...],
    settings: BenchSettings,
    *,
    prompts_source: str | None = None,
    progress: Callable[[str, float], None] | None = None,
    cancel: threading.Event | None = None,
) -> BenchReport:
    report = progress or (lambda message, fraction: None)
    pair = remote.pair or remote.connect()
    remote.ensure_vanilla()
    pair = remote.pair or pair  # with the vanilla twin it started, if it did
    greedy = SamplingConfig(max_tokens=settings.max_tokens)
    for _ in range(settings.warmup):
        for speculative in (False, True):
            _check(cancel)
            report("Warming up", 0.02)
            remote.generate(
                list(prompts[0].messages), SamplingConfig(max_tokens=WARMUP_TOKENS), speculative=speculative
            )
    runs: list[RunRecord] = []
    turns = Turns()  # a conversation turn by turn, as run_benchmark runs it (runner.py)
    total, done = settings.repeat * sum(p.turns for p in prompts) * 2, 0
    for repeat in range(settings.repeat):
        for prompt in prompts:
            replies: list[str] = []
            for index in range(prompt.turns):
                asked, _ = turns.get(prompt, index, replies)
                vanilla_text = None
                for mode in (VANILLA, SPECULATIVE):
                    _check(cancel)
                    report(f"Repeat {repeat + 1}/{settings.repeat}: {asked.id}, {mode}", 0.05 + 0.95 * done / total)
                    result = remote.generate(
                        list(asked.messages), greedy, speculative=mode == SPECULATIVE, cancel=cancel
                    )
                    _check(cancel)
                    s = result.stats
                    identical = None if mode == VANILLA else result.text == vanilla_text
                    vanilla_text = result.text if mode == VANILLA else vanilla_text
                    runs.append(
                        RunRecord(
                            prompt_id=asked.id,
                            kind=asked.kind,
                            mode=mode,
                            repeat=repeat,
                            tokens=s.tokens,
                            wall_s=s.wall_s,
                            prefill_s=s.prefill_s,
                            steps=s.steps,
                            drafted=s.drafted,
                            accepted=s.accepted,
                            tested=s.tested,
                            predicted_speedup=1.0,
                            finish_reason=result.finish_reason,
                            peak_rss_bytes=None,
                            identical=identical,
                            text=result.text,
                        )
                    )
                    done += 1
                replies.append(vanilla_text)
    prompt_summaries, kinds, overall = summarize(runs)
    counts: dict[str, int] = {}
    for prompt in turns.rows(prompts):
        counts[prompt.kind] = counts.get(prompt.kind, 0) + 1
    report("Done", 1.0)
    described = {
        "target": {
            "name": pair.model,
            "path": pair.url,
            "backend": pair.kind,
            "dtype": "as served",
            "device": "remote",
            "weight_bytes": None,
            "n_params": None,
        },
        "draft": None,
        "drafter": pair.speculation or "none",
        "drafter_name": pair.speculation,
        "k": "the server's",
        "k_max": None,
        "threads": None,
        "max_tokens": settings.max_tokens,
        "repeat": settings.repeat,
        "warmup": settings.warmup,
        "greedy": True,
        "prompts_file": prompts_source,
        "prompts": len(turns.rows(prompts)),
        "kinds": counts,
        "server": pair.describe(),
        "vanilla_url": pair.vanilla_url,
        "notes": list(pair.notes),
    }
    return BenchReport(
        settings=described,
        prompts=prompt_summaries,
        kinds=kinds,
        overall=overall,
        floor=None,
        memory=memory_check(runs, 0, False),
        runs=tuple(runs),
    )


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise BenchmarkCancelled("The benchmark was cancelled.")
