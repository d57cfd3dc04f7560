"""The load options checked before anything loads: `check_load_options` refuses what would fail
later, with a ConfigError that names the option, before the first model loads (see load_options.py
for which options are whose); the context window (--n-ctx) stays shared, since the draft must hold
what the target holds.

Apart from load_options.py since it reads the config (its compile choices, whether the drafter
is a chain with the model drafter in it), which the drafter registry, below it, cannot import.
"""

from __future__ import annotations

from engine.backends.gpu_layers import parse_gpu_layers
from engine.backends.hf.device import DTYPE_CHOICES, pick_device
from engine.config import COMPILES
from engine.drafters.chain_spec import member_names
from engine.errors import ConfigError
from engine.models.load_options import LLAMA_CPP, chosen_backend


def check_load_options(config, target_backend: str) -> None:
    """ConfigError, naming the option, for a load option that cannot work (see the module docstring)."""
    target_on = chosen_backend(config.target, target_backend)
    _check_dtype("--dtype", config.dtype, target_on, "the target", "--backend")
    _check_threads("--threads", config.threads)
    parse_gpu_layers(config.gpu_layers, "--gpu-layers")
    _check_compile(config.compile, target_on)
    options = config.drafter_options()  # a draft option without the model drafter is refused here
    if "model" not in member_names(config.drafter):  # the model drafter, or a chain with it ("suffix+model")
        return
    if not options.draft:
        given = [name for name, value in _draft_options(options) if value is not None]
        if given:
            raise ConfigError(
                f"{given[0]} sets up a draft model, but none is loaded: give one with --draft, or drop {given[0]}."
            )
        return
    draft_on = chosen_backend(options.draft, options.backend)
    if options.dtype is not None:
        _check_dtype("--draft-dtype", options.dtype, draft_on, "the draft model", "--draft-backend")
    _check_threads("--draft-threads", options.threads)
    if options.gpu_layers is not None:
        parse_gpu_layers(options.gpu_layers, "--draft-gpu-layers")
    if options.device is not None and draft_on != LLAMA_CPP:
        try:
            pick_device(options.device)
        except ConfigError as error:
            raise ConfigError(f"--draft-device {options.device}: {error}") from None


def _draft_options(options) -> list[tuple[str, object]]:
    return [
        ("--draft-device", options.device),
        ("--draft-dtype", options.dtype),
        ("--draft-threads", options.threads),
        ("--draft-gpu-layers", options.gpu_layers),
    ]


def _check_dtype(option: str, value: str, backend: str, model: str, backend_option: str) -> None:
    name = (value or "auto").strip().lower()
    if name not in DTYPE_CHOICES:
        raise ConfigError(f"{option} {value}: unknown dtype. Choose one of: {', '.join(DTYPE_CHOICES)}.")
    if backend == LLAMA_CPP and name != "auto":
        raise ConfigError(
            f"{option} {value}: {model} runs on llama.cpp, which runs a GGUF file in the precision it was "
            f"saved in. Leave {option} on auto, or load {model} with {backend_option} torch to choose one."
        )


def _check_compile(value: str, backend: str) -> None:
    if value not in COMPILES:
        raise ConfigError(f"--compile {value}: choose one of {', '.join(COMPILES)}.")
    if value == "on" and backend == LLAMA_CPP:
        raise ConfigError(
            "--compile on asks for the PyTorch backend's static-shape forward, but the target runs on "
            "llama.cpp: drop --compile, or load the target with --backend torch."
        )


def _check_threads(option: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{option} {value}: the number of CPU threads must be at least 1.")
