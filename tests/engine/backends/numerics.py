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


def run_alone(solo, call, tokens_before: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits and last_features of `call` (a BatchCall) run by itself on `solo` holding `tokens_before`."""
    solo.prefill(tokens_before)
    if call.masked:
        logits = solo.forward_masked(call.tokens, call.offsets, call.mask)
    else:
        logits = solo.forward(call.tokens)
    return logits, solo.last_features()


def assert_batch_matches_alone(owner, solo, calls: list, what: str = "") -> list[torch.Tensor]:
    """Run `calls` together (owner.forward_batch): each call's logits, greedy tokens and last
    features must be those of the same call run by itself on `solo` at the same tokens, and its
    sequence must end holding its tokens. Returns the batch's logits."""
    before = [list(call.slot.tokens) for call in calls]
    got = owner.forward_batch(calls)
    assert len(got) == len(calls)
    for i, (call, logits, tokens) in enumerate(zip(calls, got, before)):
        want, want_features = run_alone(solo, call, tokens)
        assert logits.shape == want.shape == (len(call.tokens), owner.vocab_size)
        assert_close(logits, want, f"{what} call {i}")
        assert torch.equal(logits.argmax(-1), want.argmax(-1)), f"{what} call {i}: another greedy token"
        assert_close(call.slot.last_features(), want_features, f"{what} call {i} features")
        assert call.slot.tokens == tokens + call.tokens
    return got
