"""The verification rule is lossless: emitted tokens are distributed exactly as p.

Each test draws 40,000 times with a fixed seed and compares the frequencies of
the emitted token with the processed target distribution by a chi-square test.
`test_broken_rule_fails` shows the same harness rejects a rule that is wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.core.verify as verify
from engine.core.events import Source
from engine.core.sampling import SamplingConfig, make_generator, probabilities
from engine.errors import ConfigError
from tests.stats_helpers import chi_square_pvalue

DRAWS = 40_000  # enough to catch a wrong residual at p < 1e-6 (the broken-rule tests), in a third of the time


def random_logits(vocab: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(vocab, generator=make_generator(seed)) * scale


def emitted_counts(p: torch.Tensor, q: torch.Tensor | None, draft_token: int | None, seed: int) -> np.ndarray:
    """Run one-token verification DRAWS times: draft x ~ q (or the fixed point-mass token)."""
    gen = make_generator(seed)
    vocab = p.shape[-1]
    if q is not None:
        drafts = torch.multinomial(q, DRAWS, replacement=True, generator=gen).tolist()
        q_rows = q[None, :]
    else:
        drafts = [draft_token] * DRAWS
        q_rows = None
    p_rows = torch.stack([p, p])  # row 1 (bonus) is only used when the draft is accepted
    counts = np.zeros(vocab, dtype=np.int64)
    for x in drafts:
        verdict = verify.verify_sampled(p_rows, q_rows, [x], gen)
        counts[x if verdict.accepted else verdict.token] += 1
    return counts


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.7, top_k=12),
        SamplingConfig(temperature=1.3, top_p=0.8),
        SamplingConfig(temperature=0.9, top_k=20, top_p=0.9),
        SamplingConfig(temperature=1.0, min_p=0.1),
    ],
    ids=["t1", "t0.7-topk12", "t1.3-topp0.8", "t0.9-topk20-topp0.9", "t1-minp0.1"],
)
def test_rejection_rule_matches_target_distribution(config):
    p = probabilities(random_logits(32, seed=1), config)
    q = probabilities(random_logits(32, seed=2), config)
    counts = emitted_counts(p, q, None, seed=3)
    assert chi_square_pvalue(counts, p.numpy()) > 1e-3


@pytest.mark.parametrize("which", ["likely", "unlikely"])
def test_point_mass_rule_matches_target_distribution(which):
    config = SamplingConfig(temperature=0.8, top_k=16)
    p = probabilities(random_logits(32, seed=4), config)
    ranked = torch.argsort(p, descending=True)
    draft_token = int(ranked[0] if which == "likely" else ranked[10])
    counts = emitted_counts(p, None, draft_token, seed=5)
    assert chi_square_pvalue(counts, p.numpy()) > 1e-3


def test_broken_rule_fails(monkeypatch):
    """Resampling from p instead of norm(max(0, p - q)) over-weights what q likes: the test catches it."""
    p = probabilities(random_logits(32, seed=1), SamplingConfig(temperature=1.0))
    q = probabilities(random_logits(32, seed=2), SamplingConfig(temperature=1.0))
    monkeypatch.setattr(verify, "residual_distribution", lambda p_row, q_row: p_row)
    counts = emitted_counts(p, q, None, seed=3)
    assert chi_square_pvalue(counts, p.numpy()) < 1e-6


def test_broken_point_mass_rule_fails(monkeypatch):
    p = probabilities(random_logits(32, seed=4), SamplingConfig(temperature=0.8, top_k=16))
    draft_token = int(torch.argsort(p, descending=True)[3])
    monkeypatch.setattr(verify, "residual_distribution", lambda p_row, q_row: p_row)
    counts = emitted_counts(p, None, draft_token, seed=5)
    assert chi_square_pvalue(counts, p.numpy()) < 1e-6


def test_real_model_distributions_are_preserved(default_llama):
    """p and q are the embedded model's next-token distributions after two different prompts."""
    target = default_llama
    config = SamplingConfig(temperature=1.0, top_k=40, top_p=0.98)
    p_ids = target.tokenize("Once upon a time, there was a")
    target.prefill(p_ids[:-1])
    p_logits = target.forward(p_ids[-1:])[0]
    target.rollback(0)
    q_ids = target.tokenize("My favourite city in Europe is")
    target.prefill(q_ids[:-1])
    q_logits = target.forward(q_ids[-1:])[0]
    target.rollback(0)
    p = probabilities(p_logits, config)
    q = probabilities(q_logits, config)
    assert (p > 0).sum() > 5 and (q > 0).sum() > 5 and not torch.allclose(p, q)
    # Keep only the tokens either distribution can produce (the rest have p = q = 0):
    # the same distributions, re-indexed, so the draws stay quick.
    support = ((p > 0) | (q > 0)).nonzero().flatten()
    p, q = p[support], q[support]
    counts = emitted_counts(p, q, None, seed=7)
    assert chi_square_pvalue(counts, p.numpy()) > 1e-3
    point_counts = emitted_counts(p, None, int(q.argmax()), seed=8)
    assert chi_square_pvalue(point_counts, p.numpy()) > 1e-3


def test_all_accepted_gives_bonus_from_next_row():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    verdict = verify.verify_sampled(p, None, [1], make_generator(0))
    assert (verdict.accepted, verdict.token, verdict.source) == (1, 2, Source.BONUS)


def test_greedy_rule_keeps_drafts_while_they_match_argmax():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    verdict = verify.verify_greedy(logits, [1, 2])  # 1 matches row 0; 2 does not match row 1 (argmax 0)
    assert (verdict.accepted, verdict.token, verdict.source) == (1, 0, Source.RESAMPLED)
    verdict = verify.verify_greedy(logits, [1, 0])
    assert (verdict.accepted, verdict.token, verdict.source) == (2, 2, Source.BONUS)
    verdict = verify.verify_greedy(logits[:1], [])
    assert (verdict.accepted, verdict.token, verdict.source) == (0, 1, Source.PLAIN)


def test_sampling_processing_applies_top_k_and_top_p():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    p = probabilities(logits, SamplingConfig(temperature=1.0, top_k=3))
    assert (p[3:] == 0).all() and torch.isclose(p.sum(), torch.tensor(1.0))
    p = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.5))
    assert p[0] == 1.0  # the top token alone holds 64% of the mass
    p = probabilities(logits, SamplingConfig(temperature=0.0))
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_min_p_keeps_tokens_at_least_that_fraction_as_likely_as_the_best():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = probabilities(logits, SamplingConfig(temperature=1.0, min_p=0.25))  # keeps p >= 0.125
    assert p.tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    with pytest.raises(ConfigError, match="min-p must be in"):
        SamplingConfig(temperature=1.0, min_p=1.0)
