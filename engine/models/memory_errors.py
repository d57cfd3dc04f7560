"""Running out of memory, however it is reported, as one error that says what to do.

A failed allocation reaches us in many shapes: `torch.OutOfMemoryError` (CUDA),
a plain RuntimeError ("MPS backend out of memory", "DefaultCPUAllocator: can't
allocate memory", oneDNN's "could not create a primitive"), `std::bad_alloc`
through a C++ binding, Python's MemoryError (numpy's "Unable to allocate"),
an OSError with errno ENOMEM from a failed mmap, and llama.cpp's log lines
("failed to allocate", "unable to allocate"). Often it is wrapped in another
exception by transformers, so the whole chain of causes is searched.

`is_allocation_failure` recognises all of them; `out_of_memory` builds the
OutOfMemoryError a user reads: what failed, how much memory the model needs (the
pair doctor's estimate, `doctor.estimate_memory`) and what to try, never a smaller
dtype the model already has.
"""

from __future__ import annotations

import errno
import gc
import os
from dataclasses import replace

from engine.errors import OutOfMemoryError, SpecDeckError

# Lower-case pieces of the messages allocators write when they fail.
_ALLOCATION_MESSAGES = (
    "out of memory",  # CUDA, MPS, HIP, XPU
    "can't allocate memory",  # c10's DefaultCPUAllocator
    "cannot allocate memory",  # strerror(ENOMEM): mmap, malloc through the OS
    "could not create a primitive",  # oneDNN, when it cannot allocate its scratch
    "bad_alloc",  # std::bad_alloc through pybind11 or a C++ exception message
    "failed to allocate",  # ggml / llama.cpp buffers
    "unable to allocate",  # numpy, llama.cpp
    "not enough memory",
)
_FLOAT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def is_allocation_failure(error: BaseException | None, said: str = "") -> bool:
    """True when `error`, or an exception it was raised from, is a failed allocation;
    `said` is extra text the library logged (llama.cpp's last errors), searched too."""
    if said and _names_allocation(said):
        return True
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (MemoryError, OutOfMemoryError)) or type(error).__name__ == "OutOfMemoryError":
            return True  # torch.OutOfMemoryError without importing torch here
        if isinstance(error, OSError) and error.errno == errno.ENOMEM:
            return True
        if _names_allocation(str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


def unexplained_allocation_failure(error: BaseException) -> bool:
    """A failed allocation that no SpecDeck error explains yet: the ones to turn into
    `out_of_memory`. (Our own errors already say what happened, whatever words they quote.)"""
    return not isinstance(error, SpecDeckError) and is_allocation_failure(error)


def release_frames(error: BaseException) -> None:
    """Drop the tracebacks of `error` and its causes, then collect: the frames of a failed
    load still hold what it allocated (a mapped file, half the tensors), which would leave
    no room to read the model's header for the estimate, or for anything else."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__
    gc.collect()


def _names_allocation(text: str) -> bool:
    lower = text.lower()
    return any(piece in lower for piece in _ALLOCATION_MESSAGES)


def out_of_memory(
    doing: str,
    *,
    path: str,
    backend: str,
    dtype: str | None,
    device: str,
    n_ctx: int | None = None,
    first_try: str | None = None,
    said: str = "",
    weight_bytes: int | None = None,
) -> OutOfMemoryError:
    """The error for an allocation that failed while `doing` ("load X", "run X on 300
    tokens"), for the model at `path` on `backend` ("torch" / "llama.cpp") in `dtype`
    ("float32", "bfloat16", "int8 (weights) / float32", "Q4_1"...; None: as stored) on
    `device`; `first_try` is advice that belongs to what failed ("a shorter prompt"),
    `said` what the library logged about it; `weight_bytes` what a loaded model's weights
    take, said when its files cannot be read for the full estimate."""
    meta = _metadata(path)
    if dtype is None:
        dtype = meta.dtype if meta is not None else "as stored"
    if meta is not None:
        needs = _needs(meta, backend, dtype, n_ctx)
    elif weight_bytes:
        from engine.models.doctor import format_bytes

        needs = f" Its weights alone take {format_bytes(weight_bytes)}, and its KV cache grows with the context."
    else:
        needs = _on_disk(path)
    tries = ([first_try] if first_try else []) + _what_to_try(path, backend, dtype, device)
    where = (f"on {device}" if dtype == "as stored" else f"{dtype} on {device}") + (
        f"; {backend}: {said}" if said else ""
    )
    return OutOfMemoryError(f"Not enough memory to {doing} ({where}).{needs} Try {_join(tries)}.")


def model_out_of_memory(
    doing: str, info, n_ctx: int | None = None, first_try: str | None = None, said: str = ""
) -> OutOfMemoryError:
    """`out_of_memory` for a loaded model, from its `ModelInfo`."""
    return out_of_memory(
        doing,
        path=info.path,
        backend=info.backend,
        dtype=info.dtype,
        device=info.device,
        n_ctx=n_ctx,
        first_try=first_try,
        said=said,
        weight_bytes=info.weight_bytes,
    )


def _metadata(path: str):
    """The model's metadata (metadata.ModelMeta), or None when its files cannot be read,
    which must never hide the out-of-memory error."""
    try:
        from engine.models.locate import resolve
        from engine.models.metadata import read_metadata

        return read_metadata(resolve(path))
    except Exception:  # noqa: BLE001 - an estimate is a bonus; the error itself must come out
        return None


def _needs(meta, backend: str, dtype: str, n_ctx: int | None) -> str:
    """' X needs about N (...); M is free now.' from the pair doctor's estimate."""
    from engine.models.doctor import available_memory_bytes, estimate_memory, format_bytes

    context = n_ctx or min(meta.context_length or 4096, 4096)
    if meta.ref.kind == "gguf" and backend == "torch":
        # transformers unpacks a GGUF into dense weights: estimate it as a folder of that dtype.
        meta = replace(meta, ref=replace(meta.ref, kind="hf"))
    compute = dtype.rsplit("/", 1)[-1].strip()  # "int8 (weights) / float32" computes in float32
    try:
        weights, kv = estimate_memory(
            meta, context, compute if meta.ref.kind == "hf" and compute in _FLOAT_BYTES else None
        )
    except Exception:  # noqa: BLE001 - as above
        return ""
    if dtype.startswith("int8"):
        weights = meta.n_params  # one byte per weight (the linear layers; close enough)
    text = (
        f" {meta.ref.name} needs about {format_bytes(weights + kv)} ({format_bytes(weights)} of weights "
        f"+ {format_bytes(kv)} of KV cache at {context} tokens of context)"
    )
    free = available_memory_bytes()
    text += f"; {format_bytes(free)} is free now" if free is not None else ""
    limit = _address_space_limit()
    if limit is not None:  # what a ulimit -v allows, which free memory does not show
        text += f", but this process may map only {format_bytes(limit)} (ulimit -v)"
    return text + "."


def _address_space_limit() -> int | None:
    try:
        import resource  # not on Windows
    except ImportError:
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def _on_disk(path: str) -> str:
    """' Its weights take N on disk...' when the model's header cannot be read (too little
    memory even for that, say): a lower bound is better than nothing."""
    from engine.models.doctor import format_bytes

    try:
        if os.path.isdir(path):
            size = sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith((".safetensors", ".bin", ".gguf")))
        else:
            size = os.path.getsize(path)
    except OSError:
        return ""
    return f" Its weights take {format_bytes(size)} on disk, and running it takes more than that." if size else ""


def _what_to_try(path: str, backend: str, dtype: str, device: str) -> list[str]:
    tries = []
    if backend == "torch":
        if dtype == "float32":
            tries.append("a smaller dtype (bfloat16, or int8 weights)")
        elif dtype in ("bfloat16", "float16"):
            tries.append("int8 weights (dtype int8)")
        if path.lower().endswith(".gguf") or os.path.isfile(path):  # a file is a GGUF; Ollama's blobs lack the ending
            tries.append("the llama.cpp backend (it runs the GGUF file quantized, not unpacked)")
        else:
            tries.append("a quantized GGUF of the model on the llama.cpp backend")
        if device in ("cuda", "mps") or device.startswith("cuda:"):
            tries.append("the CPU (device cpu)")
    else:
        if dtype != "as stored" and not dtype.upper().startswith(("Q2", "Q3", "Q4", "IQ", "TQ")):
            tries.append("a more quantized GGUF of the model (Q4_K_M or Q4_0)")
        if "gpu" in device:
            tries.append("fewer layers on the GPU")
    tries += ["a shorter context", "closing other programs", "a smaller model"]
    return tries


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]
