"""Whether a server can decode `--parallel N` sequences together: refused before anything loads.

`check_parallel` refuses what cannot work (engine/batching.py `check_batchable`: 0, a
negative or non-integer N, a drafter that drafts for one sequence at a time) and an N
whose caches would not fit in memory, saying the largest N that would. Each of the N
sequences has a slot of its own on the target, and on the draft model when the drafter
is one, and each slot caches the whole context (n_ctx tokens): one copy of the weights
beside N KV caches of each model. The bytes are the pair doctor's estimate
(engine/models/doctor.py `estimate_memory`), compared with the memory free now where the
target will sit (system RAM, or the GPU it goes on), up to the doctor's MEMORY_FRACTION
of it: past that the system starts paging, or the GPU's allocator fails mid-reply.

Only N > 1 is checked here: one sequence is what every load allocates, and a load that
does not fit says so itself. A model whose files cannot be read is left to the load,
which says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ConfigError, SpecDeckError


@dataclass(frozen=True)
class SlotMemory:
    """What N sequences of a config take: `weights + N * per_slot` bytes where `free` bytes are free."""

    weights: int
    per_slot: int  # the KV caches of one sequence: the target's, and the draft model's
    n_ctx: int
    free: int
    where: str  # "in system RAM", "on cuda:0"
    models: str  # "the target" or "the target and the draft model"


def check_parallel(config) -> None:
    """ConfigError, before anything loads, for a --parallel this config cannot serve (see the module docstring)."""
    from engine.batching import check_batchable
    from engine.models.doctor import MEMORY_FRACTION, format_bytes

    n = config.parallel
    check_batchable(config.drafter, n)
    if n == 1:
        return
    memory = slot_memory(config)
    if memory is None:
        return
    budget = MEMORY_FRACTION * memory.free
    needed = memory.weights + n * memory.per_slot
    if needed <= budget:
        return
    fits = max(int((budget - memory.weights) // memory.per_slot), 0) if memory.per_slot else n
    said = (
        f"--parallel {n} needs about {format_bytes(needed)} {memory.where} ({format_bytes(memory.weights)} of "
        f"weights + {n} x {format_bytes(memory.per_slot)} of KV cache: {memory.n_ctx} tokens of context for "
        f"each sequence, on {memory.models}), more than {MEMORY_FRACTION:.0%} of the "
        f"{format_bytes(memory.free)} free now."
    )
    if fits >= 2:
        advice = f" At most {fits} sequences fit: serve with --parallel {fits}, or a shorter context (-c)."
    elif fits == 1:
        advice = " One sequence fits: serve with --parallel 1, or a shorter context (-c) for more."
    else:
        advice = " Not even one sequence fits: use a shorter context (-c), or free some memory."
    raise ConfigError(said + advice)


def slot_memory(config) -> SlotMemory | None:
    """The estimate `check_parallel` weighs; None when a model's files cannot be read or the free
    memory cannot be known."""
    from engine.config import target_backend
    from engine.models.doctor import available_memory_bytes, device_memory, estimate_memory
    from engine.models.locate import resolve
    from engine.models.metadata import read_metadata
    from engine.models.placement import LLAMA_CPP, model_placement

    try:
        target = resolve(config.target)
        metas = [read_metadata(target)]
        draft = getattr(config.drafter_options(), "draft", None) if config.drafter == "model" else None
        if draft:
            metas.append(read_metadata(resolve(draft)))
        backend = target_backend(config)
        runs_on = backend if backend != "auto" else (LLAMA_CPP if target.kind == "gguf" else "torch")
        on = model_placement(target, runs_on, config.device, config.gpu_layers)
        trained = metas[0].context_length or DEFAULT_CONTEXT
        # What the load uses when no context is given: llama.cpp's default, the trained context on PyTorch.
        n_ctx = config.n_ctx or (min(DEFAULT_CONTEXT, trained) if runs_on == LLAMA_CPP else trained)
        dtype = None if config.dtype == "auto" else config.dtype
        weights = per_slot = 0
        for meta in metas:
            meta_weights, kv = estimate_memory(meta, n_ctx, dtype if meta.ref.kind != "gguf" else None)
            weights, per_slot = weights + meta_weights, per_slot + kv
    except SpecDeckError:  # a bad dtype, a model that cannot be read: the load says it in its own words
        return None
    if on.on_gpu:
        memory = device_memory(on.device)
        free, where = (memory[0] if memory else None), f"on {on.device}"
    else:
        free, where = available_memory_bytes(), "in system RAM"
    if free is None:
        return None
    models = "the target and the draft model" if draft else "the target"
    return SlotMemory(weights, per_slot, n_ctx, free, where, models)


DEFAULT_CONTEXT = 4096  # llama.cpp's context when none is given (engine/backends/llama_cpp.py DEFAULT_CONTEXT)
