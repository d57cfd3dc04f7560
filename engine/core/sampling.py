"""Turning logits into the distribution that tokens are drawn from.

Speculative sampling is lossless only if the target distribution p and the draft
distribution q go through *the same* processing (temperature, then top-k, then
top-p, then min-p, in transformers' order) before the rejection rule compares
them: the output is then distributed exactly as the processed p. Both the verifier and the model drafter call
`probabilities` with one `SamplingConfig`, so they cannot drift apart.

Temperature 0 means greedy: `probabilities` returns a one-hot distribution on the
argmax, so every rule below stays well defined.

All randomness goes through an explicit `torch.Generator` made by `make_generator`;
no function here touches a global seed.
"""

from __future__ import annotations

import torch

from engine.core.sampling_config import SamplingConfig  # noqa: F401 - re-exported: callers pass it here


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    return generator


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Processed distribution for each row of `logits` (..., V) -> (..., V), float32."""
    logits = logits.float()
    if config.greedy:
        one_hot = torch.zeros_like(logits)
        one_hot.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        return one_hot
    logits = logits / config.temperature
    vocab = logits.shape[-1]
    if 0 < config.top_k < vocab:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p < 1.0:
        probs = _nucleus(probs, config.top_p)
    if config.min_p > 0.0:
        kept = probs * (probs >= config.min_p * probs.amax(dim=-1, keepdim=True))  # the top token always stays
        probs = kept / kept.sum(dim=-1, keepdim=True)
    return probs


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p  # the first token is always kept
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a distribution (V,)."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def draw(
    logits_row: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
) -> tuple[int, torch.Tensor | None, float]:
    """A drafter's next token from its logits (V,): (token, q, q(token)). Greedy: the argmax, no q
    (verified as a point mass) and its raw softmax probability for display; sampled: drawn from
    q, the row processed like the target's, which the rejection rule needs."""
    if sampling.greedy:
        token = int(logits_row.argmax())
        return token, None, token_probability(logits_row, token)
    q = probabilities(logits_row, sampling)
    token = sample(q, generator)
    return token, q, float(q[token])


def token_probability(logits_row: torch.Tensor, token: int) -> float:
    """Unprocessed softmax probability of `token` (what a user reads as p(x) in greedy mode)."""
    row = logits_row.float()
    return float(torch.exp(row[token] - torch.logsumexp(row, dim=-1)))
