"""GPU layers of a llama.cpp model: "auto" (the default) or a count, resolved in one place.

"auto" offloads every layer (-1) when this llama-cpp-python build can offload to a GPU
(llama.cpp's `llama_supports_gpu_offload`: a CUDA, Metal, Vulkan... build that found a
device) and none (0) otherwise, which is what llama.cpp's own tools do. A number is taken
as it is: -1 (or "all") every layer, 0 none, n the first n. A CPU-only build runs every
layer on the CPU whatever was asked.

Light: llama_cpp is imported only when `llama_cpp_offloads` is called (tests replace it
to fake a GPU build).
"""

from __future__ import annotations

from engine.errors import ConfigError

AUTO = "auto"
ALL = -1  # llama.cpp's "every layer"


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
            f"{option} {value}: give auto (every layer on a GPU build, none otherwise), "
            "-1 or all (every layer), 0 (none) or a number of layers."
        )
    return value


def resolve_gpu_layers(value, option: str = "--gpu-layers") -> int:
    """The count llama.cpp gets: "auto" made -1 on a build that offloads and 0 on one that does not."""
    parsed = parse_gpu_layers(value, option)
    if parsed == AUTO:
        return ALL if llama_cpp_offloads() else 0
    return parsed


def describe_offload(n_gpu_layers: int, n_layers: int, offloads: bool) -> str:
    """Where a llama.cpp model's layers go, for people: "all 30 layers on the GPU"."""
    if not offloads:
        return "on the CPU: this llama.cpp build has no GPU offload"
    if n_gpu_layers == 0:
        return "on the CPU (GPU layers 0)"
    if n_gpu_layers < 0 or n_gpu_layers >= n_layers:
        return f"all {n_layers} layers on the GPU"
    return f"{n_gpu_layers} of {n_layers} layers on the GPU, the rest on the CPU"
