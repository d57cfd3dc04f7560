"""The decode loop on a model whose distributions the test controls."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from engine.api import collect
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.events import Source
from engine.core.sampling import SamplingConfig
from engine.drafters.ngram import NgramDrafter
from engine.errors import ConfigError, ContextOverflowError
from tests.factories.fake import MarkovBackend, MarkovDrafter, random_transition
from tests.stats_helpers import chi_square_pvalue, three_token_law


def run(backend, prompt, sampling, drafter=None, k=4):
    length = DraftLength(k) if drafter is not None else None
    return collect(list(decode_steps(backend, prompt, sampling, drafter=drafter, draft_length=length)))


def cycle_transition(vocab: int = 6) -> torch.Tensor:
    """Deterministic-ish chain a->b->c->...: greedy output repeats, so n-grams hit."""
    t = torch.full((vocab, vocab), 0.02)
    for i in range(vocab):
        t[i, (i + 1) % vocab] = 1.0
    return t / t.sum(dim=-1, keepdim=True)


def test_greedy_speculative_equals_vanilla_with_both_drafters():
    backend = MarkovBackend(random_transition(8, seed=3))
    sampling = SamplingConfig(max_tokens=40)
    vanilla = run(backend, [0, 1, 2], sampling)
    with_ngram = run(backend, [0, 1, 2], sampling, NgramDrafter())
    with_model = run(backend, [0, 1, 2], sampling, MarkovDrafter(random_transition(8, seed=4)))
    assert with_ngram.tokens == vanilla.tokens
    assert with_model.tokens == vanilla.tokens
    assert with_ngram.text == vanilla.text and len(vanilla.tokens) == 40


def test_draft_equal_to_target_accepts_every_token():
    transition = random_transition(8, seed=5)
    result = run(MarkovBackend(transition), [1], SamplingConfig(max_tokens=30), MarkovDrafter(transition), k=4)
    assert result.stats.drafted > 0
    assert result.stats.accepted == result.stats.drafted
    assert result.stats.tokens_per_step == pytest.approx(5.0, abs=0.5)  # k accepted + 1 bonus per forward
    sources = {info.source for info in result.token_infos}
    assert sources == {Source.ACCEPTED, Source.BONUS}


def test_rejected_drafts_are_rolled_back_from_the_cache():
    backend = MarkovBackend(random_transition(8, seed=6))
    result = run(backend, [0, 1], SamplingConfig(max_tokens=25), MarkovDrafter(random_transition(8, seed=7)))
    # committed text = prompt + reply; the cache holds all of it but the pending last token
    assert backend.tokens == [0, 1, *result.tokens][:-1] or result.finish_reason != "length"
    assert any(info.source is Source.RESAMPLED for info in result.token_infos)


def test_ngram_drafts_on_repetitive_text_and_cuts_forwards():
    backend = MarkovBackend(cycle_transition())
    result = run(backend, [0, 1, 2, 3, 4, 5, 0, 1], SamplingConfig(max_tokens=36), NgramDrafter(), k=6)
    assert result.stats.acceptance_rate > 0.9
    assert result.stats.steps <= 8  # 36 tokens in at most 8 forwards instead of 36


def test_eos_inside_an_accepted_block_ends_the_reply_there():
    t = cycle_transition(6)  # 0 1 2 3 4 5 0 ...; token 4 is EOS
    backend = MarkovBackend(t, eos=4)
    result = run(backend, [0, 1, 2, 3, 4, 5, 0, 1], SamplingConfig(max_tokens=50), NgramDrafter(), k=8)
    assert result.finish_reason == "stop"
    assert list(result.tokens) == [2, 3]  # EOS itself is not part of the reply
    assert result.events[-1].end_token.id == 4


def test_max_tokens_and_stop_strings_cut_inside_an_accepted_block():
    backend = MarkovBackend(cycle_transition(6))
    prompt = [0, 1, 2, 3, 4, 5, 0, 1]
    result = run(backend, prompt, SamplingConfig(max_tokens=5), NgramDrafter(), k=8)
    assert (len(result.tokens), result.finish_reason) == (5, "length")
    result = run(backend, prompt, SamplingConfig(max_tokens=50, stop=("ef",)), NgramDrafter(), k=8)
    assert (result.text, result.finish_reason) == ("cd", "stop_string")


def test_cancel_between_steps_then_generate_again():
    backend = MarkovBackend(random_transition(8, seed=8))
    sampling = SamplingConfig(max_tokens=60)
    cancel = threading.Event()
    events = []
    for event in decode_steps(backend, [0, 1], sampling, drafter=NgramDrafter(), cancel=cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert events[-1].finish_reason == "cancelled" and len(events) == 4
    again = run(backend, [0, 1], sampling, NgramDrafter())
    assert again.tokens == run(backend, [0, 1], sampling).tokens


def test_prompt_longer_than_context_is_refused_clearly():
    backend = MarkovBackend(random_transition(4, seed=0), n_ctx=8)
    with pytest.raises(ContextOverflowError, match="context window holds 8"):
        run(backend, [0] * 9, SamplingConfig())


def test_generation_stops_when_the_context_is_full():
    backend = MarkovBackend(random_transition(4, seed=0), n_ctx=12)
    result = run(backend, [0] * 8, SamplingConfig(max_tokens=100), NgramDrafter())
    assert result.finish_reason == "context"
    assert len(result.tokens) == 5  # fills positions 8..11 and emits one last token


@pytest.mark.parametrize("k", [-1, 33, "seven"])
def test_draft_length_out_of_range_is_refused(k):
    with pytest.raises(ConfigError, match="draft length"):
        DraftLength(k)


def test_sampling_through_the_loop_is_lossless():
    """Joint law of the first three reply tokens equals the target chain's, with drafts of length 2."""
    vocab, draws = 4, 40_000
    p_t = random_transition(vocab, seed=11, sharpness=1.0)
    q_t = random_transition(vocab, seed=12, sharpness=1.0)
    sampling = SamplingConfig(temperature=1.0, max_tokens=3)
    backend, drafter = MarkovBackend(p_t), MarkovDrafter(q_t)
    counts = np.zeros(vocab**3)
    for seed in range(draws):
        length = DraftLength(2)
        events = decode_steps(
            backend, [0], SamplingConfig(**{**sampling.__dict__, "seed": seed}), drafter=drafter, draft_length=length
        )
        a, b, c = collect(list(events)).tokens
        counts[(a * vocab + b) * vocab + c] += 1
    assert chi_square_pvalue(counts, three_token_law(p_t, 0)) > 1e-3


def test_auto_k_falls_back_to_plain_when_verification_costs_like_sequential():
    linear = CostModel(verify_s={n: 0.01 * n for n in (1, 2, 4, 8, 16)})
    length = DraftLength("auto", k_max=8, probe_every=10)
    choices = []
    for step in range(200):
        k = length.choose(linear)
        choices.append(k)
        if k and step % 3:  # the drafter finds something to draft on two steps in three
            length.observe(tested=1, accepted=0)
    probes = [i for i, k in enumerate(choices) if k]
    assert choices[0] == 0 and len(probes) < 12  # plain, with rare probes
    assert probes[-1] - probes[-2] > probes[1] - probes[0]  # failed probes back off


def test_a_probe_waits_until_the_drafter_drafts():
    """An n-gram drafter with no match drafts nothing: the probe stays open at no cost."""
    linear = CostModel(verify_s={n: 0.01 * n for n in (1, 2, 4, 8, 16)})
    length = DraftLength("auto", k_max=8, probe_every=4)
    choices = [length.choose(linear) for _ in range(10)]  # nothing is ever drafted
    assert choices[:3] == [0, 0, 0] and all(k > 0 for k in choices[3:])
    for _ in range(6):
        length.observe(tested=4, accepted=4)  # drafts land: acceptance recovers
    assert length.choose(CostModel(verify_s={1: 0.01, 2: 0.011, 4: 0.012, 8: 0.014, 16: 0.02})) >= 4


def test_auto_k_drafts_long_when_verification_is_cheap_and_acceptance_high():
    flat = CostModel(verify_s={1: 0.010, 2: 0.0102, 4: 0.0105, 8: 0.011, 16: 0.013})
    length = DraftLength("auto", k_max=16)
    for _ in range(10):
        length.observe(tested=8, accepted=8)
    assert length.choose(flat) >= 8
    for _ in range(30):
        length.observe(tested=3, accepted=1)
    assert 0 < length.choose(flat) <= 3  # acceptance fell: shorter drafts, still worth it


def test_time_to_first_token_counts_the_prefill_and_the_first_step_only():
    backend = MarkovBackend(random_transition(8, seed=3))
    prefill = backend.prefill

    def slow_prefill(tokens):  # a long prompt, as the user waits for it
        time.sleep(0.05)
        return prefill(tokens)

    backend.prefill = slow_prefill
    events = list(
        decode_steps(
            backend, [0, 1, 2], SamplingConfig(max_tokens=20), drafter=NgramDrafter(), draft_length=DraftLength(4)
        )
    )
    first, last = events[0].stats, events[-1].stats
    assert events[0].tokens and first.prefill_s >= 0.05
    assert first.time_to_first_token_s == pytest.approx(first.prefill_s + first.wall_s)
    assert {event.stats.time_to_first_token_s for event in events} == {first.time_to_first_token_s}
    assert last.time_to_first_token_s < last.prefill_s + last.wall_s
    assert last.as_dict()["time_to_first_token_s"] == round(first.time_to_first_token_s, 4)


def test_the_predicted_speedup_charges_what_catching_the_draft_up_cost():
    """A draft model feeds itself the prompt at its first draft (Draft.catch_up_s): timed apart from
    drafting, so that k is not chosen on it, but the prediction a user compares with must count it."""
    from dataclasses import replace

    from tests.factories.fake import cycle_transition

    class CatchingUp(MarkovDrafter):
        def __init__(self, transition, catch_up_s):
            super().__init__(transition)
            self.catch_up_s, self.first = catch_up_s, True

        def propose(self, context, k, sampling, generator):
            seconds, self.first = (self.catch_up_s if self.first else 0.0), False
            time.sleep(seconds)  # the prefill of the prompt into its cache
            return replace(super().propose(context, k, sampling, generator), catch_up_s=seconds)

    class Slow(MarkovBackend):  # a forward of n rows takes 10 + n ms: a target worth drafting for
        def _forward(self, tokens, all_logits):
            time.sleep(0.010 + 0.001 * len(tokens))
            return super()._forward(tokens, all_logits)

    chain = cycle_transition(6, noise=0.0)
    predicted = []
    for catch_up_s in (0.0, 0.3):
        costs = CostModel(verify_s={1: 0.011, 2: 0.012, 5: 0.015})
        steps = list(
            decode_steps(
                Slow(chain),
                [0, 1],
                SamplingConfig(max_tokens=40),
                drafter=CatchingUp(chain, catch_up_s),
                draft_length=DraftLength(4),
                costs=costs,
            )
        )
        predicted.append(steps[-1].stats.predicted_speedup)
    # 40 tokens in 8 steps of 5 pay without it; 0.3 s, over 30 plain forwards, takes most of it.
    assert predicted[0] > 1.0 and predicted[1] < predicted[0] / 3
