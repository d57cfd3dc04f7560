"""int8 weight-only quantization for the native Llama path.

Each weight matrix W (out, in) becomes int8 values Q and one scale per output
channel (row): s_o = max_i |W_oi| / 127 and Q_oi = round(W_oi / s_o), so
W ~ Q * s[:, None] with an error of at most s_o / 2 per weight. Activations
stay in floating point; a matmul reads a quarter of the bytes of float32 and
half of bfloat16, which is what bounds a decode step on a CPU.

The matmul is `torch._weight_int8pack_mm(x, Q, s)` on a CPU where this torch
has it, for inputs of up to KERNEL_MAX_ROWS rows (decode and verify steps).
Its vectorised kernel (AVX512 / AVX2 / NEON) takes bfloat16 activations and
scales (float32 activations fall to a scalar loop, an order of magnitude slower), steps over
the input dimension 16 at a time without a tail and uses aligned loads, so it
is only used when the input width is a multiple of 16, with bfloat16
activations in an aligned contiguous buffer (float32 activations are rounded
to bfloat16 around it). Longer inputs (prefill), other devices (CUDA, MPS)
and odd widths convert Q to the activation dtype and multiply: about as fast
as float weights for long inputs, slower for a few rows; memory is saved
either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The CPU kernel is a GEMV at heart: its time grows in proportion to the rows of x, much
# faster than a dequantize-then-matmul's, which it beats up to about 16 rows (docs/benchmarks.md, "Measurements behind the code").
KERNEL_MAX_ROWS = 16
# Rows quantized at once: bounds the float32 temporaries for huge matrices.
_ROWS_PER_CHUNK = 4096
_KERNEL = getattr(torch, "_weight_int8pack_mm", None)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values (out, in), float32 scales (out,)) of a float weight, per output row."""
    rows = weight.shape[0]
    values = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = torch.empty(rows, dtype=torch.float32, device=weight.device)
    for start in range(0, rows, _ROWS_PER_CHUNK):
        chunk = weight[start : start + _ROWS_PER_CHUNK].float()
        scale = chunk.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        values[start : start + _ROWS_PER_CHUNK] = torch.round(chunk / scale[:, None]).clamp(-127, 127).to(torch.int8)
        scales[start : start + _ROWS_PER_CHUNK] = scale
    return values, scales


class Int8Linear(nn.Module):
    """y = x @ (Q * s)^T + b with int8 Q: a drop-in for a bias-optional nn.Linear."""

    def __init__(
        self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, compute_dtype: torch.dtype
    ) -> None:
        """From int8 values (out, in) and per-row scales (out,); see `quantize` to make them."""
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.compute_dtype = compute_dtype
        self.use_kernel = _KERNEL is not None and qweight.device.type == "cpu" and self.in_features % 16 == 0
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales.to(torch.bfloat16 if self.use_kernel else compute_dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().to(compute_dtype))

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None, compute_dtype: torch.dtype) -> Int8Linear:
        values, scales = quantize_rows(weight.detach())
        return cls(values, scales, bias, compute_dtype)

    def rows(self, start: int, stop: int) -> Int8Linear:
        """The map onto output rows start..stop-1, sharing this one's tensors (views)."""
        bias = None if self.bias is None else self.bias[start:stop]
        part = Int8Linear(self.qweight[start:stop], self.scales[start:stop], bias, self.compute_dtype)
        part.use_kernel = self.use_kernel
        return part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if self.use_kernel and rows <= KERNEL_MAX_ROWS and not (torch.is_grad_enabled() and x.requires_grad):
            flat = x.reshape(rows, self.in_features)
            if flat.dtype != torch.bfloat16:
                flat = flat.to(torch.bfloat16)
            elif flat.data_ptr() % 64 or not flat.is_contiguous():
                flat = flat.clone(memory_format=torch.contiguous_format)  # the kernel's loads need alignment
            out = _KERNEL(flat, self.qweight, self.scales).view(*x.shape[:-1], self.out_features)
            if out.dtype != x.dtype:
                out = out.to(x.dtype)
        else:  # dequantize, then an ordinary matmul (differentiable, any device)
            out = F.linear(x, self.qweight.to(x.dtype)) * self.scales.to(x.dtype)
        return out if self.bias is None else out + self.bias

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (out, in), built on each access: for code that
        reads an LM head's shape or values, not for the hot path."""
        return self.qweight.to(self.compute_dtype) * self.scales.to(self.compute_dtype)[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.use_kernel}"


class Int8Embedding(nn.Module):
    """Rows of an int8 matrix with per-row scales: an embedding table that can
    also serve as a tied LM head (`as_linear`), so tied weights stay one copy."""

    def __init__(self, linear: Int8Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        q = self.linear
        rows = q.qweight[ids].to(q.compute_dtype)  # (..., hidden)
        return rows * q.scales[ids].to(q.compute_dtype).unsqueeze(-1)
