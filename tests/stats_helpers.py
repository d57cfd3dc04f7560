"""Chi-square helpers for the losslessness tests."""

from __future__ import annotations

import numpy as np
from scipy.stats import chisquare


def three_token_law(transition, first: int) -> np.ndarray:
    """P(a, b, c) of a Markov chain's next three tokens after `first`, flat at index (a * V + b) * V + c."""
    p = np.asarray(transition, dtype=np.float64)
    return np.einsum("a,ab,bc->abc", p[first], p, p).reshape(-1)


def chi_square_pvalue(observed: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """p-value of `observed` counts against `probs`; sparse cells are pooled into one."""
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(probs, dtype=np.float64) * observed.sum()
    assert observed[expected == 0].sum() == 0, "a token with probability 0 was emitted"
    big = expected >= min_expected
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp *= obs.sum() / exp.sum()  # guard against float drift in the probabilities
    return float(chisquare(obs, exp).pvalue)


def first_two_tokens(engine, prompt: list[int], top_k: int, draws: int) -> tuple[float, int]:
    """Sample the first two tokens after `prompt` `draws` times (temperature 1, top-k `top_k`, seed = draw)
    with `engine`, and test them against the target's own law of those two tokens, computed from its
    logits: (the chi-square p-value, the drafted tokens accepted in all the draws)."""
    import torch

    from engine.core.sampling import SamplingConfig

    backend = engine.target

    def processed(ids):  # the target's top-k ids after `ids`, and their renormalized probabilities
        backend.prefill(ids[:-1])
        values, top = torch.topk(backend.forward([ids[-1]])[-1], top_k)
        backend.rollback(len(ids) - 1)
        return top.tolist(), torch.softmax(values, -1).tolist()

    cells = {}
    for a, pa in zip(*processed(prompt)):
        for b, pb in zip(*processed(prompt + [a])):
            cells[(a, b)] = pa * pb
    keys = list(cells)
    counts = np.zeros(len(keys))
    accepted = 0
    for seed in range(draws):
        result = engine.generate(prompt, SamplingConfig(temperature=1.0, top_k=top_k, max_tokens=2, seed=seed))
        counts[keys.index(tuple(result.tokens[:2]))] += 1
        accepted += result.stats.accepted
    return chi_square_pvalue(counts, np.array([cells[k] for k in keys])), accepted
