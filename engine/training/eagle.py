"""Training an EAGLE head on the frozen target's cached features.

Notation as in engine/heads/eagle.py: the window's tokens x_0 .. x_{T-1}, the
target's final features f_t and greedy tokens y_t = argmax p_t (the target's
guess of x_{t+1}) come from the feature cache (features.py). Pair t is
(f_t, x_{t+1}) at position t; the head's output g_{t+1} should be f_{t+1}.

Two passes, as decoding uses the head (the second is EAGLE-3's "training-time
test", here exact for depth 2; `unroll`, which EAGLE-3's training (eagle3.py) runs
deeper):

    pass 1, depth 1:  g_{t+1} = head(e(x_{t+1}), f_t + noise), causal over the pairs
    pass 2, depth 2:  g'_{t+2} = head(e(x_{t+2}), g_{t+1}), each row attending to
                      the pass-1 rows at positions <= t (true features, as the
                      committed pairs are while drafting) and to itself
    pass d:           row t pairs e(x_{t+d}) with its own pass d-1 guess, at position
                      t + d - 1, attending to the pass-1 rows at positions <= t and
                      to row t of passes 2..d: its ancestors in a draft tree

Each pass's loss is the Medusa features objective (loss.py): the squared error
to f in the LM head's logit metric over the target's logit variance, plus
TOKEN_WEIGHT x cross-entropy of LM(g) to the target's greedy token on a few
random positions. Depth 2 weighs DEPTH_DECAY. Gaussian noise (NOISE x the
features' RMS) on pass 1's input features stands for the errors of guessed
features, as EAGLE's uniform noise does.

The reported "head" numbers are per depth: top-1 agreement of LM(g) with the
target's greedy token at depth 1 and at depth 2.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from engine.heads.eagle import EagleConfig, EagleHead
from engine.training.loss import TOKEN_ROWS, TOKEN_WEIGHT
from engine.training.records import DEFAULT_DRAFT_VOCAB  # noqa: F401 - ids the shipped head may propose

DEPTHS = 2
DEPTH_DECAY = 0.5
NOISE = 0.05


def make_head(target, base_model: str, seed: int) -> EagleHead:
    """A fresh head shaped like one of the target's layers (float32 weights, on the target's device),
    initialised from `seed` alone (the global RNG is left as it was)."""
    config = EagleConfig.for_target(target.model.config.get_text_config(), base_model=base_model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = EagleHead(config)
    return head.to(target.device)


def draft_vocabulary(tokens: torch.Tensor, size: int, vocab_size: int, always: Sequence[int] = ()) -> torch.Tensor:
    """The `size` ids most frequent in `tokens` (ties by id), plus `always` (EOS...), most frequent first."""
    counts = torch.bincount(tokens.flatten().long(), minlength=vocab_size)[:vocab_size].double()
    for token in always:
        if 0 <= token < vocab_size:
            counts[token] = float("inf")
    order = torch.argsort(-counts, stable=True)
    return order[: min(size, vocab_size)].clone()


def eagle_losses(
    head: EagleHead,
    target,
    ids: torch.Tensor,
    features: torch.Tensor,
    labels: torch.Tensor,
    metric: torch.Tensor,
    scale: float,
    generator: torch.Generator | None,
    train: bool,
    token_rows: int = TOKEN_ROWS,
) -> tuple[list[float], list[float]]:
    """Loss and top-1 agreement per depth on windows `ids` (B, T) with cached features (B, T, H)
    and greedy labels (B, T); with `train`, backward() on their weighted sum. Without a
    generator every position goes into the token term (validation)."""
    B, T, H = features.shape
    device = features.device
    dtype = next(head.parameters()).dtype
    features = features.to(dtype)
    embeds = target.embed(ids.to(device)).to(dtype)  # (B, T, H): e(x_t)
    cos, sin = (t.to(dtype) for t in target.rope(torch.arange(T, device=device)))  # (T, dim)
    inputs = features[:, : T - 1]
    if train and NOISE:
        rms = inputs.detach().pow(2).mean().sqrt()
        noise = torch.randn(inputs.shape, generator=generator, device="cpu").to(device=device, dtype=dtype)
        inputs = inputs + NOISE * rms * noise

    g1, g2 = unroll(head, embeds, inputs, cos, sin, DEPTHS)  # g_{t+1}, g'_{t+2}

    total = features.new_zeros((), dtype=torch.float32)
    losses, accuracy = [], []
    for depth, guess in ((1, g1), (2, g2)):
        truth = features[:, depth:]  # f_{t+depth}
        error = (guess.float() - truth.float()) @ metric
        regression = error.pow(2).sum(-1).mean() / scale
        flat = guess.reshape(-1, H)
        greedy = labels[:, depth:].reshape(-1).to(device)  # the target's token after t + depth
        rows = (
            torch.randperm(flat.shape[0], generator=generator)[:token_rows].to(device)
            if generator is not None
            else torch.arange(flat.shape[0], device=device)
        )
        logits = target.logits(flat[rows])
        token = F.cross_entropy(logits, greedy[rows])
        loss = regression + TOKEN_WEIGHT * token
        total = total + DEPTH_DECAY ** (depth - 1) * loss
        losses.append(float(loss.detach()))
        accuracy.append(float((logits.detach().argmax(-1) == greedy[rows]).float().mean()))
    if train:
        total.backward()
    return losses, accuracy


def unroll(
    head, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, depths: int
) -> list[torch.Tensor]:
    """The head's guesses at depths 1..`depths` over windows (the module docstring's passes): `embeds`
    (B, T, H) are e(x_t), `hidden` (B, T-1, H) what pair t carries at depth 1 (f_t, or EAGLE-3's
    fc(a_t)); cos/sin (T, dim) for positions 0..T-1. Guess d is (B, T-d, H), row t predicting
    x_{t+d+1}. `head` has inputs / qkv / finish (EagleHead, Eagle3Head)."""
    T, device = embeds.shape[1], embeds.device
    keys, values, guesses = [], [], []
    for depth in range(1, depths + 1):
        n = T - depth  # rows t = 0..T-1-depth, at positions t + depth - 1
        x, residual = head.inputs(embeds[:, depth:], hidden[:, :n])
        q, k, v = head.qkv(x, cos[depth - 1 : depth - 1 + n], sin[depth - 1 : depth - 1 + n])
        keys.append(k)
        values.append(v)
        # Pass 1's rows up to t (causal), then row t of every later pass (the diagonal of each).
        mask = torch.cat(
            [torch.ones(n, T - 1, dtype=torch.bool, device=device).tril()]
            + [torch.eye(n, T - j, dtype=torch.bool, device=device) for j in range(2, depth + 1)],
            dim=1,
        )
        out = _attend(head, q, torch.cat(keys, dim=1), torch.cat(values, dim=1), mask)
        hidden = head.finish(residual, out)
        guesses.append(hidden)
    return guesses


def _attend(head: EagleHead, q, k, v, mask: torch.Tensor) -> torch.Tensor:
    """Attention of q (B, n, heads, dim) over k, v (B, m, kv_heads, dim) with mask (n, m)."""
    groups = head.config.num_heads // head.config.num_kv_heads
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).flatten(-2)  # (B, n, heads * dim)
