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
