"""float32 linear layers prepacked for oneDNN on the CPU: what makes a verify block, or a batch, cheap.

`torch.mm(x, W.t())` with more than one row of x is a GEMM, and the CPU GEMM copies W into
its blocked layout on every call. For a decode step that copy costs more than the
arithmetic: on the 2-core AVX2 machine a forward of the embedded model over 2 to 8 rows
cost 1.7-2.0x one row (one row is a GEMV, which reads W as it lies). That is the verify
cost T(k + 1) / T(1) of the article's speedup formula, and the cost of every sequence a
batch adds. Packing W once at load, into oneDNN's layout for a few rows
(`torch.ops.mkldnn._reorder_linear_weight`), and multiplying with
`torch.ops.mkldnn._linear_pointwise` removes the copy. Measured on the embedded model,
float32, 300 cached tokens, 2 threads, medians of 7 alternating forwards, the machine
otherwise idle (`python docs/bench/prepacked.py`, 2026-12-05; docs/benchmarks.md):

    rows           1        2        4        8        16      4 sequences of 1 row
    torch.mm    49.2 ms  84.4 ms  87.9 ms  102.3 ms  124.9 ms  100.5 ms
    prepacked   36.7 ms  41.0 ms  51.1 ms   59.2 ms   75.6 ms   59.8 ms

T(4) / T(1) went from 1.79 to 1.39, and one row is 1.3x faster too. A second effect: a
row's result no longer depends on how many rows run beside it (torch.mm's GEMV and GEMM
round differently in the last bits), so the first row of a verify block gets the logits a
one-row step would.

The packed copy is as large as the weights it packs, and the transformers modules keep
the originals (the benchmark's transformers peer runs them, Medusa training backpropagates
through the LM head). So `auto` packs only where it pays and fits: on the CPU, in float32
(bfloat16 packing needs AVX-512 or AVX-NE-CONVERT and has not run on this project's
machines; int8 weights have their own kernel), and when the copy takes at most half of
the memory still available. Otherwise the forward multiplies as before, and the load
line says which it does.
"""

from __future__ import annotations

import torch

PREPACK_CHOICES = ("auto", "off")  # TorchBackend(prepack=...): "auto" packs where it pays and fits
# oneDNN picks the packed layout for an expected row count: a verify block or a few sequences.
ROWS_HINT = 4
# The copy may take at most this share of the memory available when the model has loaded.
MEMORY_SHARE = 0.5

PACKED = "float32 weights prepacked for oneDNN"


class PackedLinear:
    """`native._Dense`'s interface (call, add, nbytes) over a oneDNN-packed copy of its weight.

    `weight` and `bias` stay the borrowed dense tensors (what nbytes and the transformers
    modules read); `packed` is the copy the forward multiplies with.
    """

    __slots__ = ("bias", "packed", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, ROWS_HINT)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def add(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + self(x)."""
        return self(x).add_(residual)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.weight, self.bias) if t is not None)


def why_not(choice: str, device: torch.device, dtype: torch.dtype, weights: str | None) -> str | None:
    """Why the linear layers are not packed (a phrase for the load line), or None when they
    may be, memory permitting (`fits`). `choice`: "auto" or "off"."""
    if choice not in PREPACK_CHOICES:
        raise ValueError(f"prepack must be one of {', '.join(PREPACK_CHOICES)}, got {choice!r}")
    if choice == "off":
        return "prepacking off"
    if device.type != "cpu" or dtype != torch.float32 or weights is not None:
        return ""  # nothing to say: packing is a float32 CPU matter
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return "this torch has no oneDNN"
    return None


def fits(extra_bytes: int) -> str | None:
    """None when a packed copy of `extra_bytes` takes at most MEMORY_SHARE of the memory
    available now (or the memory is unknown), else why not, for the load line."""
    from engine.models.doctor import available_memory_bytes  # the doctor imports backends

    available = available_memory_bytes()
    if available is None or extra_bytes <= MEMORY_SHARE * available:
        return None
    return f"not prepacked: the copy ({extra_bytes / 2**30:.1f} GiB) would take over half the memory left"
