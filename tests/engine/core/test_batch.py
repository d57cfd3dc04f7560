"""Several sequences decoded together: each gives exactly what it gives alone, and k follows the load."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from engine.api import collect
from engine.backends.slots import SlotsFull
from engine.core.batch import Batch
from engine.core.batch_k import choose_draft_lengths
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.sampling import SamplingConfig
from engine.errors import ConfigError
from tests.factories.fake import LETTERS, MarkovBackend, MarkovDrafter, MarkovSlotsBackend, random_transition
from tests.stats_helpers import chi_square_pvalue, three_token_law

P = random_transition(8, seed=3, sharpness=2.5)
Q = random_transition(8, seed=4, sharpness=2.5)  # another chain: some drafts are rejected
EOS = 7


def solo(prompt, sampling, k=3, drafter=True):
    events = decode_steps(
        MarkovBackend(P, eos=EOS),
        prompt,
        sampling,
        drafter=MarkovDrafter(Q) if drafter else None,
        draft_length=DraftLength(k) if drafter else None,
    )
    return collect(list(events))


def together(jobs, *, capacity=None, hooks=None, n_ctx=256):
    """Decode `jobs` (dicts of join's arguments) in one batch; `hooks[step]` runs before that step.
    Returns each job's collected result and the backend (its `batches`)."""
    backend = MarkovSlotsBackend(P, eos=EOS, n_ctx=n_ctx, max_slots=capacity or len(jobs))
    batch = Batch(backend, CostModel(), capacity=capacity or len(jobs))
    events: dict[int, list] = {}
    order = []

    def join(job):
        job = dict(job)
        job.setdefault("drafter", MarkovDrafter(Q))
        k = job.pop("k", 3)
        if job["drafter"] is not None:
            job.setdefault("draft_length", DraftLength(k))
        sequence = batch.join(job.pop("prompt"), job.pop("sampling"), **job)
        events[id(sequence)] = []
        order.append(sequence)
        return sequence

    for job in jobs:
        join(job)
    step = 0
    while batch.sequences:
        if hooks and step in hooks:
            hooks[step](join, order)
        for sequence, outcome in batch.step():
            events[id(sequence)].append(outcome)
        step += 1
    batch.close()
    return [events[id(s)] for s in order], backend


def greedy(n, **extra):
    return SamplingConfig(temperature=0.0, max_tokens=n, **extra)


JOBS = [([0], 20), ([3, 4], 14), ([5, 1, 2], 26)]


@pytest.mark.parametrize("k", [3, "auto"])
def test_each_sequence_of_a_greedy_batch_gives_its_solo_reply(k):
    results, backend = together([{"prompt": p, "sampling": greedy(n), "k": k} for p, n in JOBS])
    for (prompt, n), events in zip(JOBS, results):
        assert collect(events).tokens == solo(prompt, greedy(n), k).tokens
    assert max(len(b) for b in backend.batches) == 3  # one forward carried all three sequences' rows
    assert all(max(e.stats.steps for e in ev) == ev[-1].stats.steps for ev in results)


def test_seeded_samples_are_each_sequences_own():
    jobs = [{"prompt": [i], "sampling": SamplingConfig(temperature=1.0, max_tokens=15, seed=100 + i)} for i in range(3)]
    results, _ = together(jobs)
    for i, events in enumerate(results):
        assert collect(events).tokens == solo([i], SamplingConfig(temperature=1.0, max_tokens=15, seed=100 + i)).tokens


def test_sampling_in_a_batch_with_automatic_k_is_lossless():
    """The law of the first three tokens of the second sequence of a batch of two, each step drafting
    what the batch's goodput chooses, is the target chain's."""
    vocab, draws = 4, 6000
    p_t, q_t = random_transition(vocab, seed=11, sharpness=1.0), random_transition(vocab, seed=12, sharpness=1.0)
    backend = MarkovSlotsBackend(p_t, max_slots=2)
    costs = CostModel(verify_s={1: 0.01, 4: 0.0102, 16: 0.011})  # cheap rows: the batch drafts
    counts = np.zeros(vocab**3)
    batch = Batch(backend, costs, capacity=2)
    for seed in range(draws):
        for s in (seed, seed + draws):
            sampling = SamplingConfig(temperature=1.0, max_tokens=3, seed=s)
            batch.join([0], sampling, drafter=MarkovDrafter(q_t), draft_length=DraftLength("auto", k_max=4))
        second = batch.sequences[1]
        tokens = []
        while batch.sequences:
            tokens += [t.id for seq, e in batch.step() if seq is second for t in e.tokens]
        a, b, c = tokens
        counts[(a * vocab + b) * vocab + c] += 1
    assert chi_square_pvalue(counts, three_token_law(p_t, 0)) > 1e-3
    assert sum(len(b) == 2 for b in backend.batches) > draws  # the two went through shared forwards


def test_cancelling_one_sequence_changes_no_other():
    cancel = threading.Event()
    jobs = [{"prompt": p, "sampling": greedy(n)} for p, n in JOBS]
    jobs[1]["cancel"] = cancel
    results, _ = together(jobs, hooks={3: lambda join, order: cancel.set()})
    assert results[1][-1].finish_reason == "cancelled"
    cut = collect(results[1]).tokens
    assert cut == solo(*JOBS[1][:1], greedy(JOBS[1][1])).tokens[: len(cut)] and len(cut) < JOBS[1][1]
    for i in (0, 2):
        assert collect(results[i]).tokens == solo(JOBS[i][0], greedy(JOBS[i][1])).tokens


def test_a_sequence_joining_mid_run_changes_no_other_and_gets_its_own_reply():
    late = {"prompt": [6, 2], "sampling": greedy(12)}
    results, backend = together(
        [{"prompt": p, "sampling": greedy(n)} for p, n in JOBS[:2]],
        capacity=3,
        hooks={4: lambda join, order: join(late)},
    )
    for (prompt, n), events in zip(JOBS[:2], results):
        assert collect(events).tokens == solo(prompt, greedy(n)).tokens
    assert collect(results[2]).tokens == solo([6, 2], greedy(12)).tokens


def test_a_stop_string_or_a_full_context_ends_one_sequence_and_the_others_go_on():
    text = LETTERS[: P.shape[0]]
    reply = solo([0], greedy(20)).tokens
    stop = "".join(text[t] for t in reply[4:6])  # ends the first sequence early
    jobs = [
        {"prompt": [0], "sampling": greedy(20, stop=(stop,))},
        {"prompt": [1] * 25, "sampling": greedy(20)},  # 25 of 32 positions: the context fills up
        {"prompt": [2], "sampling": greedy(20)},
    ]
    results, _ = together(jobs, n_ctx=32)
    assert results[0][-1].finish_reason == "stop_string"
    assert results[1][-1].finish_reason in ("context", "length", "stop")
    for job, events in zip(jobs, results):
        alone = collect(
            list(
                decode_steps(
                    MarkovBackend(P, eos=EOS, n_ctx=32),
                    job["prompt"],
                    job["sampling"],
                    drafter=MarkovDrafter(Q),
                    draft_length=DraftLength(3),
                )
            )
        )
        assert collect(events).tokens == alone.tokens
        assert events[-1].finish_reason == alone.finish_reason


def test_a_drafter_that_fails_ends_its_own_sequence_only():
    class Broken(MarkovDrafter):
        def propose(self, context, k, sampling, generator):
            if len(context) > 5:
                raise RuntimeError("the drafter broke")
            return super().propose(context, k, sampling, generator)

    jobs = [{"prompt": p, "sampling": greedy(n)} for p, n in JOBS]
    jobs[0]["drafter"] = Broken(Q)
    results, _ = together(jobs)
    assert isinstance(results[0][-1], RuntimeError)
    for i in (1, 2):
        assert collect(results[i]).tokens == solo(JOBS[i][0], greedy(JOBS[i][1])).tokens


def test_out_of_memory_in_a_growing_batch_ends_the_newest_sequence_and_the_others_go_on():
    from engine.errors import OutOfMemoryError

    backend = MarkovSlotsBackend(P, eos=EOS, max_slots=3)
    backend.memory_rows = 8  # two sequences' drafts of 3 fit (4 rows each); a third does not
    batch = Batch(backend, CostModel(), capacity=3)
    sequences = [batch.join(p, greedy(n), drafter=MarkovDrafter(Q), draft_length=DraftLength(3)) for p, n in JOBS]
    events = {id(s): [] for s in sequences}
    while batch.sequences:
        for sequence, outcome in batch.step():
            events[id(sequence)].append(outcome)
    assert isinstance(events[id(sequences[2])][-1], OutOfMemoryError)
    for (prompt, n), sequence in zip(JOBS[:2], sequences):
        assert collect(events[id(sequence)]).tokens == solo(prompt, greedy(n)).tokens


def test_a_batch_larger_than_the_backend_holds_is_refused_and_a_full_batch_says_so():
    with pytest.raises(ConfigError, match="--parallel 5"):
        Batch(MarkovSlotsBackend(P, max_slots=4), capacity=5)
    with pytest.raises(ConfigError, match="--parallel 2"):
        Batch(MarkovBackend(P), capacity=2)  # no Slots: one sequence at a time
    batch = Batch(MarkovSlotsBackend(P, max_slots=2), capacity=2)
    for prompt in ([0], [1]):
        batch.join(prompt, greedy(3))
    with pytest.raises(SlotsFull):
        batch.join([2], greedy(3))


def test_a_new_prompt_goes_to_the_slot_that_holds_most_of_it():
    backend = MarkovSlotsBackend(P, max_slots=2)
    batch = Batch(backend, capacity=2)
    chats = [[0, 1, 2, 3, 4], [5, 6, 5, 6, 5]]
    for chat in chats:
        batch.join(chat, greedy(2))
    while batch.sequences:
        batch.step()
    follow_up = batch.join([5, 6, 5, 6, 5, 6, 1], greedy(2))
    assert follow_up.slot.tokens[:5] == chats[1]  # its prefill reuses what the slot holds


def fake_sequence(acceptance: float | None, k="auto"):
    """A sequence whose drafts of 8 were accepted token by token with probability `acceptance`."""
    length = DraftLength(k, k_max=8)
    if acceptance is not None:
        rng = np.random.default_rng(0)
        for _ in range(60):  # enough evidence at every depth for the estimate to settle near `acceptance`
            kept = next((d for d in range(8) if rng.random() >= acceptance), 8)
            length.observe(min(kept + 1, 8), kept)
    return types.SimpleNamespace(drafter=object(), draft_length=length, k_limit=100)


def bent_curve(flat_until: int, t1: float = 0.01) -> CostModel:
    """T(rows) flat while the forward is memory-bound, then growing with every row (compute-bound)."""
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    return CostModel(verify_s={n: t1 * max(1.0, n / flat_until) for n in sizes})


def test_automatic_k_drafts_while_rows_are_cheap_and_stops_when_the_batch_saturates():
    costs = bent_curve(flat_until=16)
    light = choose_draft_lengths([fake_sequence(0.8) for _ in range(2)], costs)
    heavy = choose_draft_lengths([fake_sequence(0.8) for _ in range(16)], costs)
    assert all(k >= 2 for k in light)
    assert sum(heavy) == 0  # 16 sequences fill the forward: a draft row costs a whole token's share
    linear = CostModel(verify_s={n: 0.01 * n for n in (1, 2, 4, 8, 16, 64)})
    assert sum(choose_draft_lengths([fake_sequence(0.8) for _ in range(4)], linear)) == 0


def test_the_better_drafting_sequences_keep_their_drafts_as_the_batch_fills():
    costs = bent_curve(flat_until=24)
    ks = choose_draft_lengths([fake_sequence(0.95) for _ in range(4)] + [fake_sequence(0.3) for _ in range(4)], costs)
    assert min(ks[:4]) > max(ks[4:])


def test_a_fixed_k_stays_fixed_in_a_batch():
    for costs in (bent_curve(flat_until=2), bent_curve(flat_until=64)):
        ks = choose_draft_lengths([fake_sequence(None, k=5), fake_sequence(0.3), fake_sequence(None, k=0)], costs)
        assert ks[0] == 5 and ks[2] == 0


def test_one_sequence_chooses_as_it_always_has():
    costs = bent_curve(flat_until=16)
    alone = fake_sequence(0.8)
    reference = fake_sequence(0.8)
    assert choose_draft_lengths([alone], costs) == [reference.draft_length.choose(costs)]


def draft_models(n: int):
    """n ModelDrafters on slots of one Markov draft model (q = Q), as EngineBatch makes them."""
    from engine.drafters.model import ModelDrafter

    owner = MarkovSlotsBackend(Q, eos=EOS, max_slots=n)
    return owner, [ModelDrafter(owner if i == 0 else owner.open_slot(), 8, owner=owner) for i in range(n)]


@pytest.mark.parametrize("sampling", [greedy(18), SamplingConfig(temperature=1.0, max_tokens=18, seed=5)])
def test_draft_models_on_slots_draft_together_and_each_sequence_gets_its_solo_reply(sampling):
    from engine.drafters.model import ModelDrafter

    owner, drafters = draft_models(3)
    prompts = [[0], [3, 4], [5, 1, 2]]
    jobs = [{"prompt": p, "sampling": sampling, "drafter": d} for p, d in zip(prompts, drafters)]
    results, _ = together(jobs)
    for prompt, events in zip(prompts, results):
        alone = decode_steps(
            MarkovBackend(P, eos=EOS),
            prompt,
            sampling,
            drafter=ModelDrafter(MarkovBackend(Q, eos=EOS), 8),
            draft_length=DraftLength(3),
        )
        assert collect(events).tokens == collect(list(alone)).tokens
    assert max(len(b) for b in owner.batches) == 3  # one draft forward per position for all three
