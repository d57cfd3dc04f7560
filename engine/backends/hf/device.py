"""Choosing the torch device and dtype a model runs on.

"auto" picks the fastest thing this machine has: a CUDA GPU, then Apple's MPS,
then the CPU. The dtype follows the device: bfloat16 where the hardware does
bf16 math natively (every CUDA GPU since Ampere, x86 CPUs with AVX512-BF16 or
AMX), float32 elsewhere. Without bf16 instructions torch pays every row of a bf16 matmul
in full, so a verify block of k + 1 rows or a batch costs nearly k + 1 steps, where
float32's prepacked matmul (packed.py) pays little for more rows. One row alone is faster
in bf16 there (half the bytes to read: 25 against 37 ms for the embedded model on the
2-core AVX2 machine), but speculative decoding is made of multi-row forwards
(docs/benchmarks.md, "Many requests at once").

"int8" asks for int8 weights (engine/backends/hf/quantize.py) with the device's automatic
dtype for everything else: `pick_dtype` returns that compute dtype and
`weight_format` says "int8".
"""

from __future__ import annotations

import functools
import platform

import torch

from engine.errors import ConfigError

DEVICES = ("cuda", "mps", "cpu")

# Accepted spellings of each dtype a user may ask for.
_DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# Weight formats that are not a torch dtype: they compute in the automatic dtype.
_WEIGHT_FORMATS = {"int8": "int8"}
DTYPE_CHOICES = ("auto", *_DTYPE_NAMES, *_WEIGHT_FORMATS)  # what a dtype option accepts


def available_devices() -> list[str]:
    """Devices torch can use here, fastest first; "cpu" is always last."""
    found = []
    if torch.cuda.is_available():
        found.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    found.append("cpu")
    return found


def pick_device(override: str = "auto") -> str:
    """The device to run on: `override` if it is available, else the fastest one."""
    choice = (override or "auto").strip().lower()
    found = available_devices()
    if choice == "auto":
        return found[0]
    if choice not in DEVICES:
        raise ConfigError(f"Unknown device {override!r}. Choose one of: auto, {', '.join(DEVICES)}.")
    if choice not in found:
        raise ConfigError(
            f"The device {choice!r} is not available on this machine "
            f"(available: {', '.join(found)}). Use 'auto' or one of those."
        )
    return choice


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware.

    Linux x86: the avx512_bf16 or amx_bf16 flag in /proc/cpuinfo; without one,
    torch converts bf16 to float32 around every op and is slower than float32.
    Other systems answer False. On Apple Silicon the model runs on MPS anyway,
    and M1 lacks the Arm BF16 extension; we have not measured torch's CPU bf16
    kernels on M2+ or on Arm Linux, so float32 is the safe default there.
    """
    if platform.system() != "Linux":
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def pick_dtype(device: str, override: str = "auto") -> torch.dtype:
    """The dtype to load weights in on `device`: `override`, or the fastest safe one."""
    choice = (override or "auto").strip().lower()
    if choice != "auto" and choice not in _WEIGHT_FORMATS:
        try:
            return _DTYPE_NAMES[choice]
        except KeyError:
            raise ConfigError(
                f"Unknown dtype {override!r}. Choose one of: auto, float32 (fp32), bfloat16 (bf16), "
                "float16 (fp16), int8 (int8 weights)."
            ) from None
    if device == "cuda":
        # Pre-Ampere GPUs emulate bf16; float16 is their fast half type.
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


def weight_format(override: str = "auto") -> str | None:
    """The weight format `override` asks for: "int8", or None for float weights in pick_dtype's dtype."""
    return _WEIGHT_FORMATS.get((override or "auto").strip().lower())


def dtype_name(dtype: torch.dtype) -> str:
    """The dtype's name as shown to users: torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")
