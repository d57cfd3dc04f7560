"""What the formula predicts from a load test's costs, where speculation stops paying, and why.

The prediction is engine/core/batch_k.py's goodput, for B copies of one request that is
accepted at the rate measured at the smallest B (a, per draft token tested):

    G(k_1..k_B) = sum_i E(a, k_i) / (sum_i (D + k_i d + rollback_i) + T(sum_i (k_i + 1)))
    speedup(B)  = G(the chosen k_i) / G(0, ..., 0)

with E(a, k) = (1 - a^(k+1)) / (1 - a), d and D the drafter's cost per token and per step,
and T(rows) the verify cost over the batch's total rows as the cost model holds it after the
runs (the batched steps' own timings, over the load-time curve measured out to
max(B) x (k_max + 1) rows). Automatic k's choice is `best_lengths`, the function the batched
step itself calls; a fixed k is k for every sequence. Where T is flat the draft rows are
free and G grows with k; where the batch has made T linear each row costs a token's time
and, accepted at a < 1, returns less: the fixed k's speedup falls below 1, automatic k
chooses no drafting.

The prediction is the decode steps' speedup. The measured aggregate also holds each request's
prefill, which costs every mode the same, so a measured speedup sits a little nearer 1 than the
predicted one, the more so the shorter the replies (--max-tokens).

The break-even B is the smallest B whose speedup is below 1: measured, from the points,
and predicted, from the formula (for automatic k, which never predicts a loss, the smallest
B at which it chooses to draft nothing). Both are for the fixed k when one was swept (it is
the mode that can lose), else for automatic k.
"""

from __future__ import annotations

import dataclasses

from engine.bench.load_report import size_text
from engine.bench.load_results import AUTO, VANILLA, LoadSweep, Memory
from engine.core.batch_k import best_lengths
from engine.core.costs import CostFormulas, expected_tokens
from engine.errors import ConfigError, SpecDeckError

LOW_ACCEPTANCE = 0.5  # below this, drafts are wrong more often than right: the article's failure mode 1
BARELY = 1.1  # a speedup below this at the smallest B, with low acceptance, is failure mode 1
STOPPED = 0.5  # automatic k drafting fewer tokens per step than this has, in effect, stopped


def predict(
    costs: CostFormulas, acceptance: float, batch: int, k_max: int, k: int | None = None
) -> tuple[float, float]:
    """(predicted speedup over plain decoding, mean draft length) of `batch` requests accepted at
    `acceptance`: automatic k's choice when `k` is None, else k drafts for each."""
    a = min(max(acceptance, 0.0), 1.0)
    longest = max(k_max, k or 0)
    curve = [(expected_tokens(a, j), a**j) for j in range(longest + 1)]  # E(k), P(all k kept)
    if k is None:
        ks = best_lengths([0] * batch, [curve[: k_max + 1]] * batch, [True] * batch, costs)
    else:
        ks = [k] * batch
    plain = _goodput(costs, [0] * batch, curve)
    return _goodput(costs, ks, curve) / plain, sum(ks) / batch


def _goodput(costs: CostFormulas, ks: list[int], curve) -> float:
    tokens = sum(curve[k][0] for k in ks)
    own = sum(costs.draft_time(k) + costs.rollback_time(curve[k][0], k, curve[k][1]) for k in ks)
    return tokens / max(own + costs.verify_time(sum(k + 1 for k in ks)), 1e-12)


def summarize(engine, points, curves: dict, acceptance: dict, settings, notes: list[str]) -> LoadSweep:
    """The LoadSweep of a finished sweep: its points, per context the prediction from that context's
    cost curve and measured acceptance, the break-evens, the draft's memory and the sentence."""
    k_max = engine.config.k_max
    fixed = f"k={settings.k}" if settings.k > 0 else None
    mode = fixed or AUTO
    sweep = LoadSweep(
        target=engine.target.info.name,
        drafter=_drafter_name(engine),
        backend=engine.target.info.backend,
        points=tuple(points),
        break_even_mode=mode,
    )
    predicted, break_evens = [], []
    for context in sorted(curves):
        a = acceptance.get(context)
        if a is None:
            notes.append(
                f"Context {context}: nothing was drafted at B = {settings.batches[0]}, so nothing is predicted."
            )
            break_evens.append((context, _measured_break_even(sweep, mode, context), None))
            continue
        stops = None
        for batch in settings.batches:
            auto, mean_k = predict(curves[context], a, batch, k_max)
            predicted.append((context, batch, AUTO, auto))
            stops = batch if stops is None and mean_k == 0 else stops
            if fixed:
                predicted.append((context, batch, fixed, predict(curves[context], a, batch, k_max, settings.k)[0]))
        if fixed:
            stops = next((b for c, b, m, s in predicted if (c, m) == (context, fixed) and s < 1.0), None)
        break_evens.append((context, _measured_break_even(sweep, mode, context), stops))
    first = min(curves)
    memory = memory_for(engine, settings.memory_budget_bytes, notes)
    sweep = dataclasses.replace(
        sweep,
        predicted=tuple((b, s) for c, b, m, s in predicted if (c, m) == (first, AUTO)),
        predicted_by_context=tuple(predicted),
        break_evens=tuple(break_evens),
        break_even_measured=break_evens[0][1],
        break_even_predicted=break_evens[0][2],
        memory=memory,
        verify_curve=curves[first].verify_s,
        settings={
            **settings.to_dict(),
            "n_ctx": engine.target.n_ctx,
            "k_max": k_max,
            "acceptance": [[c, a] for c, a in sorted(acceptance.items())],  # per context, at the smallest B
        },
    )
    return dataclasses.replace(sweep, failure_mode=failure_mode(sweep, acceptance.get(first)), notes=tuple(notes))


def _measured_break_even(sweep: LoadSweep, mode: str, context: int) -> int | None:
    for batch in sweep.batches:
        speedup = sweep.speedup(batch, mode, context)
        if speedup is not None and speedup < 1.0:
            return batch
    return None


def _drafter_name(engine) -> str:
    draft = getattr(engine.drafter, "backend", None)
    name = engine.config.drafter or getattr(engine.drafter, "name", "")
    return f"{name} ({draft.info.name})" if draft is not None else name


# -- failure mode 3: the draft model's memory ------------------------------------------------------


def plan_memory(
    budget: int, context: int, weights: int, target_kv: int, draft_bytes: int = 0, draft_kv: int = 0
) -> Memory:
    """How many sequences of `context` tokens fit `budget` bytes beside the weights, without and
    with the draft model (its weights once, its cache per sequence)."""
    plain = (budget - weights) // target_kv if target_kv > 0 else 0
    with_draft = (budget - weights - draft_bytes) // (target_kv + draft_kv) if target_kv + draft_kv > 0 else 0
    return Memory(
        budget_bytes=budget,
        context=context,
        weights_bytes=weights,
        target_kv_bytes_per_sequence=target_kv,
        draft_bytes=draft_bytes,
        draft_kv_bytes_per_sequence=draft_kv,
        max_batch_plain=max(0, plain),
        max_batch_with_draft=max(0, with_draft),
    )


def memory_for(engine, budget: int, notes: list[str]) -> Memory | None:
    """With a draft model: the Memory of `budget` bytes (0: what the machine had free before these
    models loaded, that is free now plus their weights) for sequences of the slots' whole window
    (each slot holds its n_ctx, as the backends allocate it). None without one, or when the
    models' sizes cannot be read (said in `notes`)."""
    draft = getattr(engine.drafter, "backend", None)
    if draft is None:
        return None
    from engine.models.doctor import available_memory_bytes

    target, n_ctx = engine.target, engine.target.n_ctx
    target_kv, draft_kv = kv_bytes(target.info, n_ctx), kv_bytes(draft.info, n_ctx)
    if not target_kv:
        notes.append("The draft's memory is left out: the target's cache size could not be read from its files.")
        return None
    weights, draft_bytes = target.info.weight_bytes, draft.info.weight_bytes
    if not budget:
        budget = (available_memory_bytes() or 0) + weights + draft_bytes
    return plan_memory(budget, n_ctx, weights, target_kv, draft_bytes, draft_kv)


def kv_bytes(info, tokens: int) -> int:
    """KV cache bytes of `tokens` tokens of a loaded model (engine/models/doctor.py's estimate, in
    the dtype it runs in); 0 when its files cannot be read."""
    from engine.models.doctor import estimate_memory
    from engine.models.locate import resolve
    from engine.models.metadata import read_metadata

    try:
        dtype = info.dtype if info.backend == "torch" else None
        return estimate_memory(read_metadata(resolve(info.path)), tokens, dtype)[1]
    except (SpecDeckError, OSError, ValueError, KeyError):
        return 0


def check_fits(config, settings) -> None:
    """Refuse, before loading, a largest B whose caches (each sequence holds the whole context window,
    the draft model's too) cannot fit the memory budget beside the weights, with the B that would.
    A budget of 0 (not known) checks nothing; sizes that cannot be read neither: the load says."""
    if not settings.memory_budget_bytes:
        return
    from engine.models.doctor import estimate_memory
    from engine.models.locate import resolve
    from engine.models.metadata import read_metadata

    try:
        meta = read_metadata(resolve(config.target))
        n_ctx = config.n_ctx or min(meta.context_length or 4096, 4096)
        dtype = None if config.dtype == "auto" else config.dtype
        weights, target_kv = estimate_memory(meta, n_ctx, dtype)
        draft_weights = draft_kv = 0
        draft = getattr(config.options, "draft", None)
        if draft:
            draft_weights, draft_kv = estimate_memory(read_metadata(resolve(draft)), n_ctx, dtype)
    except (SpecDeckError, OSError, ValueError, KeyError, TypeError):
        return  # sizes that cannot be read: the load itself says what does not fit
    memory = plan_memory(settings.memory_budget_bytes, n_ctx, weights, target_kv, draft_weights, draft_kv)
    most, fits = max(settings.batches), memory.max_batch_with_draft
    if most > fits:
        with_draft = " and the draft model's" if draft else ""
        raise ConfigError(
            f"A batch of {most} needs {most} sequences of {n_ctx} tokens, and the weights{with_draft} and "
            f"caches of only {fits} fit {size_text(settings.memory_budget_bytes)}: keep B at {max(fits, 1)} or "
            "below, load a smaller context (-c), or give a larger --memory-budget."
        )


# -- the sentence ---------------------------------------------------------------------------------


def failure_mode(sweep: LoadSweep, acceptance: float | None) -> str:
    """One plain sentence, for someone who never read the article: which of its failure modes the
    numbers show at the first context (and the draft's memory where it costs sequences)."""
    batches, context = sweep.batches, (sweep.contexts or (None,))[0]
    drafting = [m for m in sweep.modes if m != VANILLA]
    if not batches or not drafting:
        return ""
    first, last = batches[0], batches[-1]
    # the mode that drafts whatever the costs say (the fixed k when swept): automatic k that chose not
    # to draft runs at about 1x and says nothing about whether drafts pay
    at_first = sweep.speedup(first, sweep.break_even_mode or drafting[0], context) or 0.0
    where = f"B = {first}" if first > 1 else "B = 1, one request at a time"
    if acceptance is not None and acceptance < LOW_ACCEPTANCE and at_first < BARELY:
        outcome = "lost" if at_first < 1.0 else "barely paid"
        said = (
            f"The target rejected most drafts (it accepted {acceptance:.0%} of the draft tokens it checked), so "
            f"speculation {outcome} even at {where} ({at_first:.2f}x plain decoding): the drafter guesses wrong "
            "too often to pay for itself (failure mode 1, low acceptance)"
        )
    elif at_first < 1.0:
        accepted = (
            f", though the target accepted {acceptance:.0%} of the draft tokens it checked," if acceptance else ""
        )
        said = (
            f"Speculation lost even at {where} ({at_first:.2f}x plain decoding){accepted} because on this machine "
            "the forward that checks the draft tokens costs about what running them one by one would, so the "
            "drafts are never free (failure mode 2, a busy processor)"
        )
    elif sweep.break_even_measured is not None:
        b, mode = sweep.break_even_measured, sweep.break_even_mode
        loss = sweep.speedup(b, mode, context) or 0.0
        drafting_what = "automatic k" if mode == AUTO else f"drafting {mode.removeprefix('k=')} tokens a step"
        said = (
            f"At B = {b} the verify forward is no longer free: the batch already keeps the processor busy, so each "
            f"draft token costs about what a real token costs and {drafting_what} ran at {loss:.2f}x plain "
            "decoding (failure mode 2, a saturated batch)"
        )
        auto = sweep.point(b, AUTO, context)
        if auto is not None and mode != AUTO:
            said += (
                "; automatic k stopped drafting there"
                if auto.mean_k < STOPPED
                else f"; automatic k still drafted {auto.mean_k:.1f} tokens a step there"
            )
    else:
        top = max((sweep.speedup(last, m, context) or 0.0) for m in drafting)
        said = (
            f"Speculation paid at every batch size measured, up to B = {last} ({top:.2f}x plain decoding there): "
            "the verify forward still had room for the draft tokens, so none of the article's failure modes shows"
        )
    memory = sweep.memory
    if memory is not None and memory.max_batch_with_draft < memory.max_batch_plain:
        said += (
            f"; the draft model's weights and cache leave room for {memory.max_batch_with_draft} sequences of "
            f"{memory.context} tokens instead of {memory.max_batch_plain} in {size_text(memory.budget_bytes)} "
            "(failure mode 3, draft memory)"
        )
    return said + "."
