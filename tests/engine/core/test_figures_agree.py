"""A run's figures agree with their parts, whatever ends the run (RunStats' docstring).

Every step gives its accepted drafts and one token of its own, so tokens = steps + accepted,
and a mean acceptance length below 1 or "2/2 drafts accepted, 1.00 tokens per step" cannot
happen. Checked over many real runs: the fake Markov model (where EOS and stop strings come
often), the embedded SmolLM2 on llama.cpp (n-gram lookup, and itself as the draft model, so
the end-of-turn token arrives as an accepted draft), and tiny random models on PyTorch.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.decode import decode_steps
from engine.core.draft_length import DraftLength
from engine.core.events import StepEvent
from engine.core.sampling import SamplingConfig
from engine.drafters.model import ModelDrafter
from engine.drafters.ngram import NgramDrafter
from tests.factories.fake import MarkovBackend, MarkovDrafter, random_transition

FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_figures_agree(events: list[StepEvent]) -> None:
    for event in events:  # every snapshot, not only the last: the charts draw each one
        s = event.stats
        assert s.tokens == s.steps + s.accepted, s
        assert 0 <= s.accepted <= s.tested <= s.drafted, s
        if s.steps:
            assert s.tokens_per_step >= 1.0 and s.mean_acceptance_length == s.tokens_per_step
    last = events[-1].stats
    assert sum(len(e.tokens) + e.ended_with for e in events) == last.tokens  # what the stream shows, and the end
    assert sum(e.accepted for e in events) == last.accepted
    assert sum(e.drafted for e in events) == last.drafted
    assert sum(1 for e in events if e.tokens or e.ended_with) <= last.steps


def run(backend, prompt, sampling, drafter, k) -> list[StepEvent]:
    length = DraftLength(k) if drafter is not None else None
    return list(decode_steps(backend, prompt, sampling, drafter=drafter, draft_length=length))


def sampling_configs(stops: list[tuple[str, ...]], most: int):
    return st.builds(
        SamplingConfig,
        temperature=st.sampled_from([0.0, 0.9]),
        seed=st.integers(0, 1000),
        max_tokens=st.integers(1, most),
        stop=st.sampled_from(stops),
    )


# -- the fake model: EOS and stop strings inside accepted blocks, often ---------------------


@settings(max_examples=60, deadline=None)
@given(
    chain_seed=st.integers(0, 50),
    eos=st.sampled_from([None, 2, 5]),
    prompt=st.lists(st.integers(0, 7), min_size=1, max_size=10),
    sampling=sampling_configs([(), ("c",), ("de",), ("ab", "h")], most=40),
    drafter=st.sampled_from(["ngram", "same", "other", "none"]),
    k=st.integers(1, 6),
)
def test_fake_runs_figures_agree(chain_seed, eos, prompt, sampling, drafter, k):
    transition = random_transition(8, seed=chain_seed)
    drafters = {
        "ngram": NgramDrafter(),
        "same": MarkovDrafter(transition),
        "other": MarkovDrafter(random_transition(8, seed=chain_seed + 1)),
        "none": None,
    }
    assert_figures_agree(run(MarkovBackend(transition, eos=eos), prompt, sampling, drafters[drafter], k))


def test_an_end_token_drafted_and_accepted_is_the_steps_own_token():
    """The "What is 2+2?" case: the draft equals the target, so the end token comes as an accepted draft;
    the drafts after it are dropped, and the reply's 2 tokens plus EOS are 3 tokens, not 2."""
    t = random_transition(6, seed=0)
    t[1] = 0.0
    t[1, 3] = 1.0  # 1 -> 3 -> EOS (4) -> ...
    t[3] = 0.0
    t[3, 4] = 1.0
    events = run(MarkovBackend(t, eos=4), [0, 1], SamplingConfig(max_tokens=20), MarkovDrafter(t), 4)
    s = events[-1].stats
    assert [info.id for e in events for info in e.tokens] == [3] and events[-1].end_token.id == 4
    assert (s.steps, s.tokens, s.accepted) == (1, 2, 1)  # 3 accepted, EOS its own token; 2 drafts unused
    assert s.drafted == 4 and s.tokens_per_step == 2.0


# -- real models ------------------------------------------------------------------------------

CHAT_PROMPTS = ["What is 2+2?", "Say hi.", "Fix the typos: teh cat sat on teh mat.", "Name three colours."]
REAL_STOPS = [(), (".",), ("\n",), (" the",)]


@pytest.fixture(scope="module")
def smollm_draft(default_gguf):
    from engine.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(default_gguf, n_ctx=2048)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def chat_prompts(default_llama):
    return [default_llama.apply_chat_template([{"role": "user", "content": text}]) for text in CHAT_PROMPTS]


@FEW
@given(
    which=st.integers(0, len(CHAT_PROMPTS) - 1),
    sampling=sampling_configs(REAL_STOPS, most=16),
    drafter=st.sampled_from(["ngram", "model"]),
    k=st.integers(1, 5),
)
def test_llama_cpp_runs_figures_agree(default_llama, smollm_draft, chat_prompts, which, sampling, drafter, k):
    draft = NgramDrafter() if drafter == "ngram" else ModelDrafter(smollm_draft, default_llama.vocab_size)
    assert_figures_agree(run(default_llama, chat_prompts[which], sampling, draft, k))


def test_what_is_2_plus_2_counts_its_end_token(default_llama, smollm_draft, chat_prompts):
    """The app's footer read "2/2 drafts accepted (100%) - 1.00 tokens per forward" for this reply."""
    drafter = ModelDrafter(smollm_draft, default_llama.vocab_size)
    events = run(default_llama, chat_prompts[0], SamplingConfig(max_tokens=64), drafter, 4)
    s = events[-1].stats
    assert events[-1].finish_reason == "stop"
    assert s.tokens == s.steps + s.accepted and s.tokens_per_step > 1.0
    assert s.tokens == len([i for e in events for i in e.tokens]) + 1  # the reply and its end token


@pytest.fixture(scope="module")
def tiny_torch(tmp_path_factory):
    from engine.backends.hf.backend import TorchBackend
    from tests.factories.hf_models import make_tiny_llama

    root = tmp_path_factory.mktemp("figures")
    target = TorchBackend(make_tiny_llama(root / "target", seed=0, n_layers=2), dtype="float32")
    draft = TorchBackend(make_tiny_llama(root / "draft", seed=1, n_layers=1), dtype="float32")
    yield target, draft
    target.close()
    draft.close()


@FEW
@given(
    prompt=st.lists(st.integers(10, 2000), min_size=1, max_size=8),
    sampling=sampling_configs([(), ("e",), (" ",), ("a", "o")], most=16),
    drafter=st.sampled_from(["ngram", "model"]),
    k=st.integers(1, 5),
)
def test_torch_runs_figures_agree(tiny_torch, prompt, sampling, drafter, k):
    target, draft = tiny_torch
    chosen = NgramDrafter() if drafter == "ngram" else ModelDrafter(draft, target.vocab_size)
    assert_figures_agree(run(target, prompt, sampling, chosen, k))
