"""What automatic k is charged for a draft model: its decodes, not its catching up.

The clock is fake: each forward advances it by a cost the test sets (a call's
overhead plus a cost per token), so the timings the cost model learns are exact
and nothing here depends on how busy the machine is.
"""

from __future__ import annotations

import types

import pytest
import torch

from engine.core import decode, draft_length
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength, measure_draft_cost
from engine.drafters import model as model_drafter
from engine.drafters.model import ModelDrafter
from engine.core.sampling import SamplingConfig
from engine.api import collect
from tests.factories.fake import LETTERS, MarkovBackend

VOCAB = 8
TARGET_CALL_S, TARGET_TOKEN_S = 1.0, 0.01  # verification nearly flat in n (a GPU, or a small torch model)
DRAFT_CALL_S, DRAFT_TOKEN_S = 0.1, 0.02  # a one-token decode 0.12 s; a prefill of 200 tokens 4.1 s


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class TimedMarkovBackend(MarkovBackend):
    """A MarkovBackend whose every forward costs `call_s + token_s * len(tokens)` fake seconds."""

    def __init__(self, transition, clock: FakeClock, call_s: float, token_s: float, n_ctx: int = 1024) -> None:
        super().__init__(transition, n_ctx=n_ctx)
        self.clock, self.call_s, self.token_s = clock, call_s, token_s

    def _forward(self, tokens, all_logits):
        self.clock.now += self.call_s + self.token_s * len(tokens)
        return super()._forward(tokens, all_logits)

    def tokenize(self, text, special=False):  # any text (the cost measurement's filler), folded into the vocabulary
        return [LETTERS.index(c) % VOCAB for c in text.lower() if c in LETTERS]


def near_cycle(vocab: int = VOCAB) -> torch.Tensor:
    """a -> b -> c ... with a little noise: greedy follows the cycle, drafts always land."""
    t = torch.full((vocab, vocab), 0.01)
    for i in range(vocab):
        t[i, (i + 1) % vocab] = 1.0
    return t / t.sum(dim=-1, keepdim=True)


@pytest.fixture
def clock(monkeypatch):
    clock = FakeClock()
    fake_time = types.SimpleNamespace(perf_counter=clock.perf_counter)
    for module in (decode, model_drafter, draft_length):
        monkeypatch.setattr(module, "time", fake_time)
    return clock


def pair(clock):
    transition = near_cycle()
    target = TimedMarkovBackend(transition, clock, TARGET_CALL_S, TARGET_TOKEN_S)
    draft = TimedMarkovBackend(transition, clock, DRAFT_CALL_S, DRAFT_TOKEN_S)
    return target, ModelDrafter(draft, VOCAB)


def flat_costs() -> CostModel:
    return CostModel(verify_s={n: TARGET_CALL_S + TARGET_TOKEN_S * n for n in (1, 2, 4, 8, 16, 33)})


def test_catching_up_a_long_prompt_is_not_charged_as_drafting(clock):
    """The first step feeds the draft model the whole 200-token prompt. Charged per drafted
    token, that made drafting look ~10x dearer than verifying, automatic k went to 0 and
    stayed there (probes back off); charged apart, k stays up and nearly every step drafts."""
    target, drafter = pair(clock)
    prompt = [i % VOCAB for i in range(200)]
    costs = flat_costs()  # draft_s_per_token unknown (0) until the loop times a draft
    sampling = SamplingConfig(max_tokens=64)
    result = collect(list(decode_steps(target, prompt, sampling, drafter=drafter,
                                       draft_length=DraftLength("auto"), costs=costs)))  # fmt: skip
    one_decode = DRAFT_CALL_S + DRAFT_TOKEN_S
    assert costs.draft_s_per_token == pytest.approx(one_decode, rel=0.1)
    assert result.stats.drafted >= 48  # most of the 64 tokens came as accepted drafts
    assert result.stats.steps <= 16
    plain = collect(list(decode_steps(target, prompt, sampling)))
    assert result.tokens == plain.tokens  # greedy output unchanged


def test_a_probe_after_plain_steps_catches_up_in_one_prefill_timed_apart(clock):
    target, drafter = pair(clock)
    context = [i % VOCAB for i in range(40)]
    first = drafter.propose(context, 3, SamplingConfig(), torch.Generator())
    assert drafter.backend.forward_calls == [39, 1, 1, 1]  # the gap, then one decode per draft token
    assert first.catch_up_s == pytest.approx(DRAFT_CALL_S + DRAFT_TOKEN_S * 39)

    drafter.backend.forward_calls.clear()
    context += [*first.tokens, 3]  # all three kept, then the target's token: two to feed, no gap
    second = drafter.propose(context, 3, SamplingConfig(), torch.Generator())
    assert drafter.backend.forward_calls == [2, 1, 1]
    assert second.catch_up_s == 0.0


def test_draft_cost_is_one_decode_and_leaves_the_cache_as_it_was(clock):
    backend = TimedMarkovBackend(near_cycle(), clock, DRAFT_CALL_S, DRAFT_TOKEN_S)
    backend.prefill([1, 2, 3])
    assert measure_draft_cost(backend) == pytest.approx(DRAFT_CALL_S + DRAFT_TOKEN_S)
    assert backend.tokens == [1, 2, 3]


def test_auto_k_drafts_after_a_probe_that_caught_up_when_acceptance_is_high():
    """Plain steps, then a probe whose drafted tokens all land: with the draft charged its
    decodes only (c_d ~ 0.12 against flat verification) automatic k goes up, not back to 0."""
    costs = flat_costs()
    length = DraftLength("auto", k_max=16, probe_every=4)
    costs.draft_s_per_token = DRAFT_CALL_S + DRAFT_TOKEN_S
    for _ in range(5):
        length.observe(tested=4, accepted=4)
    assert length.choose(costs) >= 4


def test_loading_a_draft_model_measures_its_token_cost(tmp_path):
    """Before the loop has timed a draft the cost model knows what one draft token costs, so
    the first choice of k is not made as if drafting were free."""
    from engine.api import Engine, EngineConfig
    from tests.factories.hf_models import make_tiny_llama

    target = make_tiny_llama(tmp_path / "target", seed=0, n_layers=2)
    draft = make_tiny_llama(tmp_path / "draft", seed=1, n_layers=1)
    engine = Engine.load(EngineConfig(target=target, backend="torch").with_drafter("model", draft=draft, backend="torch"))
    try:
        assert engine.costs.draft_s_per_token > 0
        assert engine.drafter.backend.tokens == []  # the measurement left the draft's cache empty
    finally:
        engine.close()


def test_one_slow_draft_step_does_not_stop_drafting(clock):
    """Another process takes the CPU during one draft step (60 fake seconds, ~500 decodes): the
    cost model's medians ignore it, where an exponential average made drafting look dearer
    than verifying and automatic k decoded plainly, probing ever more rarely."""
    target, drafter = pair(clock)
    draft_model = drafter.backend
    forward = draft_model._forward
    calls = []

    def slowed_once(tokens, all_logits):
        calls.append(len(tokens))
        if len(calls) == 8:
            clock.now += 60.0
        return forward(tokens, all_logits)

    draft_model._forward = slowed_once
    costs = flat_costs()
    costs.draft_s_per_token = DRAFT_CALL_S + DRAFT_TOKEN_S  # as measured at load
    prompt = [i % VOCAB for i in range(20)]
    result = collect(list(decode_steps(target, prompt, SamplingConfig(max_tokens=96), drafter=drafter,
                                       draft_length=DraftLength("auto"), costs=costs)))  # fmt: skip
    assert result.stats.drafted >= 80 and result.stats.steps <= 24
    assert costs.draft_s_per_token == pytest.approx(DRAFT_CALL_S + DRAFT_TOKEN_S, rel=0.1)


def test_costs_follow_a_lasting_change_but_not_a_spike():
    costs = flat_costs()
    t6 = costs.verify_time(6)
    costs.observe_verify(6, 50 * t6)  # one forward slowed by something else
    assert costs.verify_time(6) == pytest.approx(t6)
    for _ in range(4):
        costs.observe_verify(6, 2 * t6)  # the context grew: every forward is slower now
    assert costs.verify_time(6) == pytest.approx(2 * t6)


def test_auto_k_stops_where_acceptance_falls_off_with_depth():
    """Drafts land up to position 5 and miss at 6 (a draft drifting from the target). One
    acceptance number for the run (5/6) makes longer drafts look as good as 5; the per-depth
    estimates see that nothing past 5 is ever kept, and k settles on 5."""
    costs = flat_costs()
    costs.draft_s_per_token = DRAFT_CALL_S + DRAFT_TOKEN_S
    length = DraftLength("auto", k_max=16)
    chosen = []
    for _ in range(40):
        k = length.choose(costs)
        chosen.append(k)
        length.observe(tested=min(k, 6), accepted=min(k, 5))
    assert chosen[-10:] == [5] * 10
