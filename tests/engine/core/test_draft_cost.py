"""What automatic k is charged for a draft model: its decodes, not its catching up.

The clock is fake: each forward advances it by a cost the test sets (a call's
overhead plus a cost per token), so the timings the cost model learns are exact
and nothing here depends on how busy the machine is.
"""

from __future__ import annotations

import types

import pytest
import torch

from engine.api import collect
from engine.core import batch, draft_length, sequence
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength, measure_draft_cost
from engine.core.sampling import SamplingConfig
from engine.drafters import model as model_drafter
from engine.drafters.model import ModelDrafter
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
    for module in (batch, sequence, model_drafter, draft_length):
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
    result = collect(
        list(decode_steps(target, prompt, sampling, drafter=drafter, draft_length=DraftLength("auto"), costs=costs))
    )
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
    engine = Engine.load(
        EngineConfig(target=target, backend="torch").with_drafter("model", draft=draft, backend="torch")
    )
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
    result = collect(
        list(
            decode_steps(
                target,
                prompt,
                SamplingConfig(max_tokens=96),
                drafter=drafter,
                draft_length=DraftLength("auto"),
                costs=costs,
            )
        )
    )
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


def test_a_verify_curve_measured_while_the_cpu_was_busy_does_not_keep_auto_k_plain(clock):
    """Another process held the CPU while the engine loaded, less and less: the load-time
    curve's one-row forwards ran 20x slower, its two-row ones 9x, the draft's decode 3x, and the
    3-second budget stopped the curve there (seen on this machine: {1: 1052 ms, 2: 368 ms}). A
    vanilla run then timed T(1) right, but T(2) stayed 9x too dear: each load-time number counted
    as 3 of the 7 timings in its window, the rare probes could never outvote it, and automatic k
    decoded the whole reply plainly (1.01 tokens per forward). The loop's own timings overrule
    a load-time number: most of the reply comes as accepted drafts."""
    target, drafter = pair(clock)
    t1, t2 = TARGET_CALL_S + TARGET_TOKEN_S, TARGET_CALL_S + 2 * TARGET_TOKEN_S
    costs = CostModel(verify_s={1: 20 * t1, 2: 9 * t2}, draft_s_per_token=3 * (DRAFT_CALL_S + DRAFT_TOKEN_S))
    prompt = [i % VOCAB for i in range(20)]
    sampling = SamplingConfig(max_tokens=128)
    collect(list(decode_steps(target, prompt, sampling, costs=costs)))  # --compare runs vanilla first
    result = collect(
        list(decode_steps(target, prompt, sampling, drafter=drafter, draft_length=DraftLength("auto"), costs=costs))
    )
    assert result.stats.drafted >= 96  # three quarters of the reply came as drafts
    assert costs.verify_time(2) == pytest.approx(t2, rel=0.05)
    assert costs.draft_s_per_token == pytest.approx(DRAFT_CALL_S + DRAFT_TOKEN_S, rel=0.05)


def test_a_spike_that_hit_longer_forwards_at_load_does_not_hold_auto_k_at_one(clock):
    """The spike of the load hit only the 3- and 4-row forwards (seen here: {1: 31.6 ms, 2: 32.3,
    3: 844.7, 4: 267.0}). Steps of k = 1 timed T(2) right, but k = 2 and 3 looked 27x and 8x
    dearer, were never tried and so never timed, and automatic k drafted 1 token a step for the
    whole reply (0.68x the tokens per second of k = 5). Costs dearer than running the same rows
    as two forwards of two are not this backend's: automatic k tries those sizes and drafts long."""
    target, drafter = pair(clock)
    t = {n: TARGET_CALL_S + TARGET_TOKEN_S * n for n in (1, 2, 3, 4)}
    costs = CostModel(
        verify_s={1: t[1], 2: t[2], 3: 27 * t[3], 4: 8 * t[4]}, draft_s_per_token=DRAFT_CALL_S + DRAFT_TOKEN_S
    )
    prompt = [i % VOCAB for i in range(20)]
    sampling = SamplingConfig(max_tokens=128)
    collect(list(decode_steps(target, prompt, sampling, costs=costs)))  # --compare runs vanilla first
    result = collect(
        list(decode_steps(target, prompt, sampling, drafter=drafter, draft_length=DraftLength("auto"), costs=costs))
    )
    assert result.stats.tokens_per_step >= 6
    assert costs.verify_time(4) < 1.5 * t[4]


def test_a_curve_spiked_in_its_shape_does_not_hold_auto_k_at_one(clock):
    """The load measured {1: 127.8 ms, 2: 314.1, 3: 1152.0} (seen here): after a vanilla run
    timed T(1) at 50 ms and steps of k = 1 timed T(2) at 43, scaling the load-time T(3) by the
    level of T(2) still left it at 158 ms, 3.6 x T(2), and the curve's slope past it made every
    longer draft look dear: automatic k drafted 1 token a step for a whole reply. No backend
    runs 3 rows slower than 3 forwards of one row; such a number is the spike's, not a cost.
    (T(2) at 2.5 x T(1) could still be a backend without parallelism, so plain steps may come
    first, until a probe times it.)"""
    target, drafter = pair(clock)
    t1 = TARGET_CALL_S + TARGET_TOKEN_S
    costs = CostModel(
        verify_s={1: 2.56 * t1, 2: 6.3 * t1, 3: 23.0 * t1}, draft_s_per_token=DRAFT_CALL_S + DRAFT_TOKEN_S
    )
    prompt = [i % VOCAB for i in range(20)]
    sampling = SamplingConfig(max_tokens=128)
    collect(list(decode_steps(target, prompt, sampling, costs=costs)))  # --compare runs vanilla first
    result = collect(
        list(decode_steps(target, prompt, sampling, drafter=drafter, draft_length=DraftLength("auto"), costs=costs))
    )
    assert result.stats.tokens_per_step >= 4 and max(event.drafted for event in result.events) >= 12
    assert costs.verify_time(3) < 1.5 * (TARGET_CALL_S + 3 * TARGET_TOKEN_S)


def test_a_drafts_fixed_cost_per_step_is_not_charged_per_token():
    """Each drafting step costs the draft a fixed part (here 1 s, feeding it the step's pending
    tokens and the drafter's own work) besides 0.12 s per token, as this machine's draft does
    (7 ms beside 13 ms per token). Timed on steps of one token, all of it looked like the cost
    of that token (1.12 s), which makes every draft length look too dear to pay: automatic k
    stayed plain. Charged as the step's fixed part, long drafts pay and automatic k drafts them."""
    costs = flat_costs()
    costs.draft_s_per_token = DRAFT_CALL_S + DRAFT_TOKEN_S  # the one-token decode measured at load
    for _ in range(7):
        costs.observe_draft(1, 1.0 + costs.draft_s_per_token)
    assert costs.draft_time(1) == pytest.approx(1.12) and costs.draft_time(9) == pytest.approx(1.0 + 9 * 0.12)
    length = DraftLength("auto", k_max=16)
    for _ in range(10):
        length.observe(tested=8, accepted=8)
    assert length.choose(costs) >= 8
    for k in (4, 8):  # timings at other lengths: a line through them
        costs.observe_draft(k, 1.0 + k * 0.12)
        costs.observe_draft(k, 1.0 + k * 0.12)
    assert costs.draft_s_per_token == pytest.approx(0.12) and costs.draft_fixed_s == pytest.approx(1.0)


def test_auto_k_drafts_no_longer_than_pays_when_verify_costs_jump_past_6_rows(clock):
    """Verifying costs the same up to 6 rows and twice that from 7 (a backend whose forward goes
    from one tile of rows to two, say): drafting past 5 pays for its tokens with a second tile.
    Automatic k, with the curve measured at load as Engine.load does, settles on the k that
    maximizes tokens per second and is within 0.9x of the best fixed k's tokens per second."""
    target, drafter = pair(clock)
    tile = 6

    def forward(tokens, all_logits, _forward=target._forward):
        clock.now += TARGET_CALL_S * ((len(tokens) - 1) // tile)  # one more call's cost per extra tile
        return _forward(tokens, all_logits)

    target._forward = forward
    one_decode = DRAFT_CALL_S + DRAFT_TOKEN_S

    def t(n):
        return TARGET_CALL_S * (1 + (n - 1) // tile) + TARGET_TOKEN_S * n

    best = max(range(1, 17), key=lambda k: (k + 1) / (k * one_decode + t(k + 1)))
    prompt = [i % VOCAB for i in range(20)]
    sampling = SamplingConfig(max_tokens=128)

    def tokens_per_s(k):
        costs = CostModel(verify_s=draft_length.measure_verify_curve(target, budget_s=1e9))  # every size
        costs.draft_s_per_token = measure_draft_cost(drafter.backend)
        drafter.backend.rollback(0)  # each run feeds the draft the prompt (docs/bench/self_draft.py)
        result = collect(
            list(decode_steps(target, prompt, sampling, drafter=drafter, draft_length=DraftLength(k), costs=costs))
        )
        return result.stats.tokens_per_s, [event.drafted for event in result.events]

    auto, lengths = tokens_per_s("auto")
    fixed = {k: tokens_per_s(k)[0] for k in range(1, 17)}
    assert best == 5 and max(fixed, key=fixed.get) == best
    assert max(lengths) <= best and lengths[-4:-1] == [best] * 3
    assert auto >= 0.9 * fixed[best]


def test_a_reply_starts_with_a_probe_where_drafts_that_land_would_pay():
    """Before any draft of a reply is verified its acceptance is the prior's guess (0.67). Where
    that guess says drafting does not pay but drafts that land would (a draft model that the
    target accepts at 0.98), the reply's first step tries a draft instead of waiting 16 plain
    steps for the first probe; where not even landing drafts would pay, it decodes plainly."""
    costs = CostModel(verify_s={1: 1.0, 2: 1.3, 4: 1.9, 8: 3.1, 16: 5.5, 33: 10.6}, draft_s_per_token=0.4)
    assert DraftLength("auto")._best_k(costs) == 0 < DraftLength("auto")._best_k(costs, 0.9)
    length = DraftLength("auto")
    chosen = []
    for _ in range(8):
        chosen.append(length.choose(costs))
        length.observe(tested=chosen[-1], accepted=chosen[-1])  # every draft lands
    assert chosen[0] > 0 and min(chosen) > 0 and chosen[-1] >= 2
    linear = CostModel(verify_s={n: 0.01 * n for n in (1, 2, 4, 8, 16)})
    assert DraftLength("auto").choose(linear) == 0


class BurstyMarkovBackend(TimedMarkovBackend):
    """Every forward that starts between `burst_from` and `burst_to` (fake seconds) takes
    `burst_s` longer: something else had the cores for that while."""

    def __init__(self, *args, burst_from: float, burst_to: float, burst_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.burst = (burst_from, burst_to, burst_s)

    def _forward(self, tokens, all_logits):
        start, end, extra = self.burst
        if start <= self.clock.now < end:
            self.clock.now += extra
        return super()._forward(tokens, all_logits)


def test_a_burst_of_other_work_while_the_curve_is_measured_leaves_its_shape_alone(clock):
    """The desktop window paints its load progress while its engine process times the verify
    curve, and for a few forwards the two share the cores (seen here, PyTorch bf16 on 2 cores:
    T(3) and T(4) at 1.55-1.65 x T(1) in the app's engine, 1.14-1.17 x in a process alone).
    Timed three times in a row, a size that such a burst covered kept a doubled time as its
    median, and automatic k chose its draft length from a cost that was not the backend's for
    the whole session. Timed in turns, each size keeps its own cost, and automatic k chooses
    as it would on a quiet machine."""
    quiet = {n: TARGET_CALL_S + TARGET_TOKEN_S * n for n in draft_length.CURVE_SIZES}
    # Other work for a few forwards' while, starting as the 3-row forwards come up.
    target = BurstyMarkovBackend(
        near_cycle(), clock, TARGET_CALL_S, TARGET_TOKEN_S, burst_from=8.5, burst_to=15.0, burst_s=TARGET_CALL_S
    )
    measured = draft_length.measure_verify_curve(target, budget_s=1e9)
    assert measured == pytest.approx(quiet, rel=0.01)
    with_burst = CostModel(verify_s=measured, draft_s_per_token=0.2)
    alone = CostModel(verify_s=quiet, draft_s_per_token=0.2)
    assert DraftLength("auto")._best_k(with_burst, 0.7) == DraftLength("auto")._best_k(alone, 0.7) == 2
