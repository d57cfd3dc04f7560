"""Several requests decoded together on real backends: every reply is the one it gets alone."""

from __future__ import annotations

import threading

import pytest

from engine import ConfigError, Engine, SamplingConfig
from engine.api import collect
from engine.config import EngineConfig
from engine.drafters.registry import drafter_spec
from tests.factories.hf_models import make_tiny_llama

TEXTS = [
    "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese.",
    "Write a short poem about the sea.",
    "def add(a, b):\n    return a + b\n\nRename the function add to plus and show the code again.",
    "List the days of the week, then list them again backwards.",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("batching")
    return {
        "target": make_tiny_llama(root / "target", seed=0, n_layers=2),
        "draft": make_tiny_llama(root / "draft", seed=1, n_layers=1),
    }


def load(target, drafter="ngram", parallel=4, **options) -> Engine:
    options.setdefault("measure_costs", False)
    draft = {"draft": options.pop("draft")} if "draft" in options else {}
    config = EngineConfig(target=target, parallel=parallel, dtype="float32", **options).with_drafter(drafter, **draft)
    return Engine.load(config)


def decode_together(engine: Engine, prompts, samplings, *, speculative=True, hooks=None, cancels=None):
    """Every prompt in one EngineBatch; `hooks[step](batch, join)` before that step. Returns the
    results in join order and the largest number of sequences one forward ran."""
    batch = engine.batch()
    events, order = {}, []

    def join(prompt, sampling, cancel=None):
        sequence = batch.join(prompt, sampling, speculative=speculative, cancel=cancel)
        events[id(sequence)] = []
        order.append(sequence)

    for i, (prompt, sampling) in enumerate(zip(prompts, samplings)):
        join(prompt, sampling, (cancels or {}).get(i))
    widest, step = 0, 0
    try:
        while batch.sequences:
            if hooks and step in hooks:
                hooks[step](batch, join)
            for sequence, outcome in batch.step():
                assert not isinstance(outcome, BaseException), outcome
                events[id(sequence)].append(outcome)
                widest = max(widest, outcome.batch)
            step += 1
    finally:
        batch.close()
    return [collect(events[id(s)]) for s in order], widest


def alone(engine, prompt, sampling, speculative=True):
    return engine.generate(prompt, sampling, speculative=speculative)


@pytest.mark.parametrize("speculative", [False, True])
def test_float32_greedy_batch_replies_equal_their_solo_replies(tiny, speculative):
    engine = load(tiny["target"], k=4)
    try:
        prompts = [engine.prompt_ids(t) for t in TEXTS]
        samplings = [SamplingConfig(max_tokens=n) for n in (40, 24, 48, 32)]
        results, widest = decode_together(engine, prompts, samplings, speculative=speculative)
        assert widest == 4  # one forward ran all four sequences' rows
        for prompt, sampling, result in zip(prompts, samplings, results):
            assert result.tokens == alone(engine, prompt, sampling, speculative).tokens
    finally:
        engine.close()


def test_a_draft_model_drafts_for_every_sequence_and_each_gets_its_solo_reply(tiny):
    engine = load(tiny["target"], drafter="model", draft=tiny["draft"], k=3, parallel=3)
    try:
        prompts = [engine.prompt_ids(t) for t in TEXTS[:3]]
        samplings = [SamplingConfig(max_tokens=24)] * 3
        results, widest = decode_together(engine, prompts, samplings)
        assert widest == 3
        assert all(r.stats.drafted > 0 for r in results)
        for prompt, sampling, result in zip(prompts, samplings, results):
            assert result.tokens == alone(engine, prompt, sampling).tokens
    finally:
        engine.close()


def test_cancelling_one_and_joining_another_mid_run_change_no_other_reply(tiny):
    engine = load(tiny["target"], k=4)
    try:
        prompts = [engine.prompt_ids(t) for t in TEXTS]
        sampling = SamplingConfig(max_tokens=32)
        cancel = threading.Event()
        results, _ = decode_together(
            engine,
            prompts[:3],
            [sampling] * 3,
            cancels={1: cancel},
            hooks={3: lambda batch, join: (cancel.set(), join(prompts[3], sampling))},
        )
        assert results[1].finish_reason == "cancelled" and len(results[1].tokens) < 32
        for i in (0, 2):
            assert results[i].tokens == alone(engine, prompts[i], sampling).tokens
        assert results[3].tokens == alone(engine, prompts[3], sampling).tokens
    finally:
        engine.close()


def test_seeded_sampling_in_a_batch_draws_each_sequences_own_reply(tiny):
    engine = load(tiny["target"], k=3)
    try:
        prompts = [engine.prompt_ids(t) for t in TEXTS[:3]]
        samplings = [SamplingConfig(temperature=0.9, max_tokens=24, seed=40 + i) for i in range(3)]
        results, _ = decode_together(engine, prompts, samplings, speculative=False)
        for prompt, sampling, result in zip(prompts, samplings, results):
            assert result.tokens == alone(engine, prompt, sampling, speculative=False).tokens
    finally:
        engine.close()


@pytest.mark.parametrize("parallel", [0, -2, "4"])
def test_a_parallel_that_is_not_a_count_is_refused_before_loading(tiny, parallel):
    with pytest.raises(ConfigError, match="--parallel must be a whole number"):
        load(tiny["target"], parallel=parallel)


@pytest.mark.parametrize("drafter", ["medusa", "early-exit"])
def test_a_drafter_that_reads_one_sequences_states_is_refused_for_a_batch(tiny, drafter):
    assert drafter_spec(drafter).reads_weights or drafter_spec(drafter).needs  # heads, or the target's layers
    with pytest.raises(ConfigError, match=r"--parallel 1.*ngram"):
        load(tiny["target"], drafter=drafter, parallel=2)


@pytest.fixture(scope="module")
def embedded_llama(default_gguf):
    engine = Engine.load(EngineConfig(target=default_gguf, parallel=4, k=4, measure_costs=False).with_drafter("ngram"))
    yield engine
    engine.close()


@pytest.mark.parametrize("speculative", [False, True])
def test_llama_cpp_batch_replies_equal_their_solo_replies_or_differ_by_rounding_only(embedded_llama, speculative):
    """The embedded Q4_1 model on llama.cpp, four requests at once: a sequence's rows may sit in other
    cells of the shared cache than alone, so the sums round differently; every difference must be a
    near-tie that rounding explains (engine/core/divergence.py), as between speculative and plain."""
    from engine.core.divergence import first_divergence, rounding_bound

    engine = embedded_llama
    prompts = [engine.prompt_ids(t) for t in TEXTS]
    samplings = [SamplingConfig(max_tokens=32)] * 4
    results, widest = decode_together(engine, prompts, samplings, speculative=speculative)
    assert widest == 4
    bound = rounding_bound(engine.target.info)
    for prompt, sampling, result in zip(prompts, samplings, results):
        divergence = first_divergence(result, alone(engine, prompt, sampling, speculative), bound)
        assert divergence is None or divergence.explained, divergence
