"""What the forward-pass tests mean by "the same logits": equal up to float32 rounding."""

from __future__ import annotations

import torch

TOLERANCE = 1e-4  # of the largest |value|: float32 rounding, nothing more


def random_ids(n: int, seed: int) -> list[int]:
    """n token ids from the middle of a 49k vocabulary, the same for the same seed."""
    return [int(t) for t in torch.randint(100, 40000, (n,), generator=torch.Generator().manual_seed(seed))]


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal up to float32 rounding, relative to the largest value (logits or hidden states)."""
    scale = want.abs().max().item()
    diff = (got - want).abs().max().item()
    assert diff <= TOLERANCE * scale, f"{what}: max |diff| {diff:.3g} for values up to {scale:.3g}"
