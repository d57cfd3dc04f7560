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

import math
from dataclasses import dataclass

import torch

from engine.errors import ConfigError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off; else keep tokens at least min_p times as likely as the most likely one
    seed: int = 0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Infinite temperature passes `>= 0` and flattens p into uniform noise; NaN fails every
        # comparison. Both are typing mistakes, so say the range instead of sampling noise.
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise ConfigError(
                f"temperature must be 0 (greedy) or a finite positive number (0.7 is typical), got {self.temperature}."
            )
        if self.top_k < 0:
            raise ConfigError(f"top-k must be 0 (off) or a positive number of tokens, got {self.top_k}.")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}; use 1 to turn it off.")
        if not (math.isfinite(self.min_p) and 0.0 <= self.min_p < 1.0):
            raise ConfigError(f"min-p must be in [0, 1), got {self.min_p}; use 0 to turn it off (0.05 is typical).")
        if self.max_tokens < 1:
            raise ConfigError(f"max tokens must be at least 1, got {self.max_tokens}.")
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must not be empty.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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


def token_probability(logits_row: torch.Tensor, token: int) -> float:
    """Unprocessed softmax probability of `token` (what a user reads as p(x) in greedy mode)."""
    row = logits_row.float()
    return float(torch.exp(row[token] - torch.logsumexp(row, dim=-1)))
