"""The target's load options and the draft model's, kept apart.

--device, --dtype, --threads and --gpu-layers are the target's. A draft model has its
own (--draft-device, --draft-dtype, --draft-threads, --draft-gpu-layers); one left unset
follows the target's where it means something on the draft's backend: a PyTorch draft
takes the target's device and dtype, a llama.cpp draft its threads and GPU layers, and
never a dtype, since llama.cpp runs a GGUF file in the precision it was saved in. (The
draft used to get every target option, so `--dtype bfloat16` with a llama.cpp draft
failed after the target had loaded, which takes seconds to minutes.)

What would fail later is refused before the first model loads by load_checks.py, which
reads the config; this module reads only its fields, so the drafter registry, below the
config, builds a drafter's load options from it (`make_drafter`).
"""

from __future__ import annotations

from engine.errors import SpecDeckError
from engine.models.locate import resolve

LLAMA_CPP = "llama.cpp"


def chosen_backend(spec: str, backend: str) -> str:
    """The backend `spec` loads on: as asked, else llama.cpp for a GGUF file and PyTorch otherwise
    (a spec that cannot be resolved counts as PyTorch; loading it says what is missing)."""
    if backend != "auto":
        return backend
    try:
        return LLAMA_CPP if resolve(spec).kind == "gguf" else "torch"
    except SpecDeckError:
        return "torch"


def target_load_options(config) -> dict:
    """load_backend's options for the target (an EngineConfig)."""
    return dict(
        device=config.device,
        dtype=config.dtype,
        n_ctx=config.n_ctx,
        threads=config.threads,
        gpu_layers=config.gpu_layers,
        compile=config.compile,
        slots=config.parallel,
    )


def draft_load_options(options, target: dict) -> dict:
    """load_backend's options for the draft model (the model drafter's `options`): its own, else
    the target's (`target_load_options`) where they apply."""
    on_llama = chosen_backend(options.draft, options.backend) == LLAMA_CPP if options.draft else False
    return dict(
        device=_either(options.device, target["device"]),
        dtype=_either(options.dtype, "auto" if on_llama else target["dtype"]),
        n_ctx=target["n_ctx"],
        threads=_either(options.threads, target["threads"]),
        gpu_layers=_either(options.gpu_layers, target["gpu_layers"]),
        compile=target["compile"],  # a PyTorch draft's one-row steps are what CUDA graphs speed up most
        slots=target["slots"],  # a draft model drafts for every sequence of the batch
    )


def _either(own, target):
    return target if own is None else own
