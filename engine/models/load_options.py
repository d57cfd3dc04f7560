"""The target's load options and the draft model's, kept apart and checked before anything loads.

--device, --dtype, --threads and --gpu-layers are the target's. A draft model has its
own (--draft-device, --draft-dtype, --draft-threads, --draft-gpu-layers); one left unset
follows the target's where it means something on the draft's backend: a PyTorch draft
takes the target's device and dtype, a llama.cpp draft its threads and GPU layers, and
never a dtype, since llama.cpp runs a GGUF file in the precision it was saved in. (The
draft used to get every target option, so `--dtype bfloat16` with a llama.cpp draft
failed after the target had loaded, which takes seconds to minutes.)

`check_load_options` refuses what would fail later, with a ConfigError that names the
option, before the first model loads; the context window (--n-ctx) stays shared, since
the draft must hold what the target holds.
"""

from __future__ import annotations

from engine.backends.hf.device import DTYPE_CHOICES, pick_device
from engine.errors import ConfigError, SpecDeckError
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
    return dict(device=config.device, dtype=config.dtype, n_ctx=config.n_ctx, threads=config.threads,
                gpu_layers=config.gpu_layers)  # fmt: skip


def draft_load_options(config) -> dict:
    """load_backend's options for the draft model: its own, else the target's where they apply."""
    on_llama = chosen_backend(config.draft, config.draft_backend) == LLAMA_CPP if config.draft else False
    return dict(
        device=_either(config.draft_device, config.device),
        dtype=_either(config.draft_dtype, "auto" if on_llama else config.dtype),
        n_ctx=config.n_ctx,
        threads=_either(config.draft_threads, config.threads),
        gpu_layers=_either(config.draft_gpu_layers, config.gpu_layers),
    )


def check_load_options(config, target_backend: str) -> None:
    """ConfigError, naming the option, for a load option that cannot work (see the module docstring)."""
    target_on = chosen_backend(config.target, target_backend)
    _check_dtype("--dtype", config.dtype, target_on, "the target", "--backend")
    _check_threads("--threads", config.threads)
    if config.draft is None:
        given = [name for name, value in _draft_options(config) if value is not None]
        if given:
            raise ConfigError(
                f"{given[0]} sets up a draft model, but none is loaded: give one with --draft, or drop {given[0]}."
            )
        return
    draft_on = chosen_backend(config.draft, config.draft_backend)
    if config.draft_dtype is not None:
        _check_dtype("--draft-dtype", config.draft_dtype, draft_on, "the draft model", "--draft-backend")
    _check_threads("--draft-threads", config.draft_threads)
    if config.draft_device is not None and draft_on != LLAMA_CPP:
        try:
            pick_device(config.draft_device)
        except ConfigError as error:
            raise ConfigError(f"--draft-device {config.draft_device}: {error}") from None


def _draft_options(config) -> list[tuple[str, object]]:
    return [("--draft-device", config.draft_device), ("--draft-dtype", config.draft_dtype),
            ("--draft-threads", config.draft_threads), ("--draft-gpu-layers", config.draft_gpu_layers)]  # fmt: skip


def _check_dtype(option: str, value: str, backend: str, model: str, backend_option: str) -> None:
    name = (value or "auto").strip().lower()
    if name not in DTYPE_CHOICES:
        raise ConfigError(f"{option} {value}: unknown dtype. Choose one of: {', '.join(DTYPE_CHOICES)}.")
    if backend == LLAMA_CPP and name != "auto":
        raise ConfigError(
            f"{option} {value}: {model} runs on llama.cpp, which runs a GGUF file in the precision it was "
            f"saved in. Leave {option} on auto, or load {model} with {backend_option} torch to choose one."
        )


def _check_threads(option: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{option} {value}: the number of CPU threads must be at least 1.")


def _either(own, target):
    return target if own is None else own

