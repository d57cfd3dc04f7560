"""GPU layers of a llama.cpp model: "auto" (the default) or a count, resolved in one place.

"auto" offloads no layer (0), on every build. llama.cpp's own tools offload every layer on a
build that can (a CUDA, Metal, Vulkan... build that found a device: `llama_supports_gpu_offload`),
and so did SpecDeck, but SpecDeck's use of an offloaded model (batched verify logits, rollback,
recurrent-state checkpoints) has never run on a GPU, only on a faked build: a default must be a
path that has run. Offload is opt-in until a recorded GPU run shows it correct and faster
(issue 40), and the load line says so on a build that could offload. A number is taken as it
is: -1 (or "all") every layer, 0 none, n the first n. A CPU-only build runs every layer on the
CPU whatever was asked.

Light: llama_cpp is imported only when `llama_cpp_offloads` is called (tests replace it
to fake a GPU build).
"""

from __future__ import annotations

from engine.errors import ConfigError

AUTO = "auto"
ALL = -1  # llama.cpp's "every layer"
UNVERIFIED = "not yet verified on a GPU"


def llama_cpp_offloads() -> bool:
    """Whether the installed llama-cpp-python can put layers on a GPU (False without llama_cpp)."""
    try:
        import llama_cpp
    except ImportError:
        return False
    return bool(llama_cpp.llama_supports_gpu_offload())


def parse_gpu_layers(value, option: str = "--gpu-layers") -> int | str:
    """ "auto", or the count `value` spells (an int, its digits, "all" for -1); a ConfigError
    naming `option` for anything else."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word == AUTO:
            return AUTO
        if word == "all":
            return ALL
        if word.lstrip("+-").isdigit() and word.isascii():
            value = int(word)
    if isinstance(value, bool) or not isinstance(value, int) or value < ALL:
        raise ConfigError(
            f"{option} {value}: give auto (none: offload is opt-in), "
            "-1 or all (every layer), 0 (none) or a number of layers."
        )
    return value


def resolve_gpu_layers(value, option: str = "--gpu-layers") -> int:
    """The count llama.cpp gets: "auto" made 0 (the module docstring), a count as given."""
    parsed = parse_gpu_layers(value, option)
    return 0 if parsed == AUTO else parsed


def is_auto(value) -> bool:
    """Whether `value` leaves the GPU layers to "auto" (False for a value parse_gpu_layers refuses)."""
    return isinstance(value, str) and value.strip().lower() == AUTO


def describe_offload(n_gpu_layers: int, n_layers: int, offloads: bool, auto: bool = False) -> str:
    """Where a llama.cpp model's layers go, for people: "all 30 layers on the GPU (opt-in, ...)";
    `auto`: the count was "auto"'s, so a build that could offload says how to ask for it."""
    if not offloads:
        return "on the CPU: this llama.cpp build has no GPU offload"
    if n_gpu_layers == 0:
        if auto:
            return f"on the CPU: GPU offload is opt-in (--gpu-layers all or a count; {UNVERIFIED})"
        return "on the CPU (GPU layers 0)"
    if n_gpu_layers < 0 or n_gpu_layers >= n_layers:
        return f"all {n_layers} layers on the GPU (opt-in, {UNVERIFIED})"
    return f"{n_gpu_layers} of {n_layers} layers on the GPU, the rest on the CPU (opt-in, {UNVERIFIED})"
