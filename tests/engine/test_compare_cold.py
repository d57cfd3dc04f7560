"""The side by side's two runs each read the prompt from empty caches (issue 36, item 8).

Before, the speculative run (second) found the prompt in the KV cache the vanilla run had
just filled: its prefill read 0.00 s, as if speculation removed it. The tests watch what
the real backends hold when each run's prefill starts, and what each run reports.
"""

from __future__ import annotations

import pytest

from engine import Engine, SamplingConfig
from tests.engine.drafters.build import legacy_config
from tests.factories.hf_models import make_tiny_llama

GREEDY = SamplingConfig(max_tokens=12)
PROMPT = "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese."


def cached_at_each_prefill(engine: Engine) -> list[tuple[int, int]]:
    """(target tokens cached, draft tokens cached) as each generation's prefill starts."""
    seen = []
    draft = getattr(engine.drafter, "backend", None)
    prefill = engine.target.prefill

    def watched(tokens):
        seen.append((len(engine.target.tokens), len(draft.tokens) if draft is not None else 0))
        return prefill(tokens)

    engine.target.prefill = watched
    return seen


def assert_each_run_is_cold(engine: Engine) -> None:
    prompt = engine.prompt_ids(PROMPT)
    engine.generate(prompt, GREEDY)  # a chat before: the caches hold this prompt and its reply
    seen = cached_at_each_prefill(engine)

    comparison = engine.compare(prompt, GREEDY)

    assert seen == [(0, 0), (0, 0)]  # both runs, the speculative one too, start from empty caches
    for run in (comparison.vanilla, comparison.speculative):
        assert run.stats.prefill_s > 0
        assert run.stats.time_to_first_token_s > run.stats.prefill_s  # the first token comes after the prompt
    assert comparison.speculative.tokens == comparison.vanilla.tokens  # greedy in float32: same reply


def test_llama_cpp_runs_each_prefill_the_prompt(default_gguf):
    engine = Engine.load(legacy_config(target=default_gguf, drafter="ngram", k=4, measure_costs=False))
    try:
        assert_each_run_is_cold(engine)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return make_tiny_llama(root / "target", seed=0, n_layers=2), make_tiny_llama(root / "draft", seed=1, n_layers=1)


def test_pytorch_runs_and_the_draft_model_each_prefill_the_prompt(tiny):
    target, draft = tiny
    config = legacy_config(target=target, drafter="model", draft=draft, dtype="float32", k=4, measure_costs=False)
    engine = Engine.load(config)
    try:
        assert_each_run_is_cold(engine)
    finally:
        engine.close()
