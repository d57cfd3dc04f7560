"""Ten seconds that rank discovered drafters by measured speed, on request (`--measure`, the dialog's button).

The files say what can serve a target; only a run says what pays on this machine. `measure`
loads the target once, on the backend it runs on, and runs plain decoding and then each
candidate on the same prompts (the benchmark's, short replies), greedy, each for an equal slice
of the budget: decoding tokens/s over plain decoding's is the candidate's speedup. A reply
is never cut, so a slow machine runs over the budget by up to one reply per candidate.
As auto-tune does (engine/bench/autotune.py), each drafter is made on the one loaded target
with the registry's `make_drafter` and closed after; here a draft model is loaded too, since
the point is to compare models that are not loaded yet. Loads are not counted in the budget;
the target's verify costs and each drafter's token cost are measured as a load measures them, so
that automatic k sizes the drafts as it will for the user.

Candidates that would move the target to another backend (a GGUF's heads need PyTorch) are
not measured: that is a second load of the whole target, dequantized; they keep their place
by the prior, and their note says so.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from engine.models.discovery import Candidate, Discovery

MEASURE_BUDGET_S = 10.0
WARMUP_TOKENS = 4
MAX_TOKENS = 48  # per reply, as auto-tune's: short replies, so that each slice holds several


def measure(
    found: Discovery,
    budget_s: float = MEASURE_BUDGET_S,
    *,
    progress: Callable[[str, float], None] | None = None,
    cancel: threading.Event | None = None,
) -> Discovery:
    """`found` with each candidate that runs on its target's backend measured (tokens/s, speedup over
    plain decoding) and ranked by speedup, the others after by their prior. Raises the load's own
    error when the target cannot load."""
    from engine.api import Engine
    from engine.config import EngineConfig
    from engine.drafters.registry import drafter_spec

    report = progress or (lambda message, fraction: None)
    cancel = cancel or threading.Event()
    runnable = [c for c in found.candidates if found.backend == "torch" or not drafter_spec(c.drafter).needs_torch]
    slice_s = budget_s / (len(runnable) + 1)
    report(f"Loading {found.target}", 0.0)
    # The verify costs measured at load, as a user's load measures them: automatic k reads them.
    base = EngineConfig(target=found.target_spec, drafter="none", backend=found.backend, n_ctx=2048)
    engine = Engine.load(base)
    measured: dict[int, Candidate] = {}
    try:
        prompts = _prompts(engine)
        _run(engine, prompts[:1], None, WARMUP_TOKENS)  # the first run pays one-time costs
        report("Plain decoding", 0.05)
        tokens, spent = _run(engine, prompts, slice_s)
        vanilla_tps = tokens / spent if spent > 0 else 0.0
        for index, c in enumerate(runnable):
            if cancel.is_set():
                break
            report(f"Measuring {c.name}", 0.1 + 0.9 * index / max(len(runnable), 1))
            measured[id(c)], took = _candidate(engine, base, c, prompts, slice_s, vanilla_tps)
            spent += took
    finally:
        engine.close()
    report("Done", 1.0)
    untried = "not measured: it runs the target on PyTorch (a second load, dequantized from the GGUF); check it with Auto-tune"
    result = [measured.get(id(c)) or dataclasses.replace(c, note=untried) for c in found.candidates]
    ranked = sorted(result, key=lambda c: (c.speedup is None, -(c.speedup or 0.0), -c.score))
    return dataclasses.replace(
        found, candidates=tuple(ranked), vanilla_tokens_per_s=round(vanilla_tps, 2), measured_s=round(spent, 2)
    )


def _prompts(engine) -> list[list[int]]:
    """The benchmark's single-turn prompts, a prompt that reuses its text and an open one in turn:
    lookup drafters shine on the first kind only."""
    from engine.bench.prompts import default_prompts_path, load_prompts
    from engine.bench.runner import encode_prompt

    reuse, open_ = (load_prompts(default_prompts_path(), (kind,)) for kind in ("reuse", "open"))
    mixed = [p for pair in zip(reuse, open_) for p in pair]
    return [encode_prompt(engine, p) for p in mixed]


def _candidate(engine, base, c: Candidate, prompts, slice_s: float, vanilla_tps: float) -> tuple[Candidate, float]:
    """(the candidate with its measurement or why there is none, seconds of generation)."""
    from engine.api import Engine
    from engine.core.draft_length import CostModel
    from engine.drafters.base import measured_token_cost
    from engine.drafters.registry import make_drafter
    from engine.errors import SpecDeckError

    config = base.with_drafter(c.drafter, **({c.option: c.spec} if c.option else {}))
    drafter = None
    try:
        drafter = make_drafter(engine.target, config)
        costs = CostModel(verify_s=dict(engine.costs.verify_s))  # as auto-tune's: the drafter's own cost beside
        costs.draft_s_per_token = (measured_token_cost(drafter) or 0.0) if drafter is not None else 0.0
        tuned = Engine(engine.target, drafter, config, costs)
        tokens, took = _run(tuned, prompts, slice_s)
    except Exception as error:  # noqa: BLE001 - one candidate that fails must not hide the others' measurements
        said = str(error) if isinstance(error, SpecDeckError) else f"{type(error).__name__}: {error}"
        return dataclasses.replace(c, note=f"could not run: {said}"), 0.0
    finally:
        if drafter is not None:
            drafter.close()
    tps = tokens / took if took > 0 else 0.0
    speedup = tps / vanilla_tps if vanilla_tps > 0 else 0.0
    return dataclasses.replace(c, tokens_per_s=round(tps, 2), speedup=round(speedup, 3)), took


def _run(engine, prompts: list[list[int]], seconds: float | None, max_tokens: int = MAX_TOKENS) -> tuple[int, float]:
    """(tokens, decoding seconds) of short greedy replies to `prompts` in turn, each from empty caches
    and a drafter that forgot earlier replies, until `seconds` have passed (prefills included; a
    reply is never cut, so that each counts whole); None: one reply."""
    from engine.core.sampling_config import SamplingConfig
    from engine.drafters.base import forget_replies

    sampling = SamplingConfig(max_tokens=max_tokens)
    tokens, wall, turn = 0, 0.0, 0
    start = time.perf_counter()
    while turn == 0 or (seconds is not None and time.perf_counter() - start < seconds):
        engine.clear_prompt_caches()
        forget_replies(engine.drafter)
        prompt = prompts[turn % len(prompts)]
        result = engine.generate(prompt, sampling, speculative=engine.drafter is not None)
        tokens, wall, turn = tokens + result.stats.tokens, wall + result.stats.wall_s, turn + 1
    return tokens, wall
