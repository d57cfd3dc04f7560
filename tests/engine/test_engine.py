"""The engine end to end on real backends: greedy equality, rounding explained, bad input."""

from __future__ import annotations

import json
import shutil
import threading

import pytest

from engine import (
    ConfigError,
    ContextOverflowError,
    Engine,
    IncompatiblePairError,
    ModelLoadError,
    ModelNotFoundError,
    SamplingConfig,
    Source,
)
from engine.core.divergence import first_divergence
from engine.core.events import GenerationResult, RunStats, StepEvent, TokenInfo
from tests.engine.drafters.build import legacy_config
from tests.factories.gguf_models import make_corrupt_gguf
from tests.factories.hf_models import make_tiny_llama

PROMPTS = [
    "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese.",
    "Write a short poem about the sea.",
    "def add(a, b):\n    return a + b\n\nRename the function add to plus and show the code again.",
]
GREEDY = SamplingConfig(max_tokens=48)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": make_tiny_llama(root / "target", seed=0, n_layers=2),
        "draft": make_tiny_llama(root / "draft", seed=1, n_layers=1),
    }


def load(target, drafter="ngram", draft=None, **options) -> Engine:
    options.setdefault("measure_costs", False)
    return Engine.load(legacy_config(target=target, drafter=drafter, draft=draft, **options))


@pytest.fixture(scope="module")
def embedded_fp32(embedded_hf_dir):
    """The embedded model on PyTorch, dequantized to float32, with n-gram drafting."""
    engine = load(embedded_hf_dir, dtype="float32", k=4)
    yield engine
    engine.close()


def assert_same_greedy(engine: Engine, prompt_text: str, **sampling) -> GenerationResult:
    prompt = engine.prompt_ids(prompt_text)
    config = SamplingConfig(**{"max_tokens": 48, **sampling})
    comparison = engine.compare(prompt, config)
    assert comparison.speculative.tokens == comparison.vanilla.tokens, comparison.divergence
    assert comparison.speculative.text == comparison.vanilla.text
    return comparison.speculative


# -- greedy equality in float32 ------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_float32_greedy_speculative_equals_vanilla_on_tiny_models(tiny, drafter):
    draft = tiny["draft"] if drafter == "model" else None
    engine = load(tiny["target"], drafter=drafter, draft=draft, dtype="float32", k=4)
    try:
        for text in PROMPTS:
            result = assert_same_greedy(engine, text)
            assert result.stats.drafted > 0
    finally:
        engine.close()


def test_float32_greedy_equals_vanilla_on_the_embedded_model(embedded_fp32):
    results = [assert_same_greedy(embedded_fp32, text, max_tokens=40) for text in PROMPTS]
    assert sum(r.stats.accepted for r in results) > 0  # the n-gram drafter was really used


def test_float32_greedy_with_a_draft_model_on_the_embedded_target(embedded_hf_dir, tiny):
    engine = load(embedded_hf_dir, dtype="float32", draft=tiny["draft"], k=3)
    try:
        assert_same_greedy(engine, PROMPTS[0], max_tokens=24)
    finally:
        engine.close()


def test_draft_equal_to_target_accepts_every_draft_token(tiny):
    engine = load(tiny["target"], draft=tiny["target"], dtype="float32", k=5)
    try:
        result = engine.generate(engine.prompt_ids(PROMPTS[1]), GREEDY)
        assert result.stats.drafted > 0
        assert result.stats.accepted == result.stats.drafted
        assert {i.source for i in result.token_infos} <= {Source.ACCEPTED, Source.BONUS}
    finally:
        engine.close()


def test_draft_equal_to_target_sampling_accepts_every_draft_token(tiny):
    """With p == q the acceptance probability min(1, p/q) is 1 at any temperature."""
    engine = load(tiny["target"], draft=tiny["target"], dtype="float32", k=4)
    try:
        result = engine.generate(engine.prompt_ids(PROMPTS[1]), SamplingConfig(temperature=0.9, max_tokens=32))
        assert result.stats.drafted > 0 and result.stats.accepted == result.stats.drafted
    finally:
        engine.close()


# -- lower precision: every divergence explained ------------------------------------------


def comparisons(engine: Engine, texts) -> list:
    return [engine.compare(engine.prompt_ids(t), SamplingConfig(max_tokens=64)) for t in texts]


def test_llama_cpp_divergences_are_all_explained(default_gguf):
    engine = load(default_gguf, k=6)
    try:
        results = comparisons(engine, PROMPTS)
    finally:
        engine.close()
    assert sum(c.speculative.stats.accepted for c in results) > 0
    for c in results:
        assert c.identical or c.divergence.explained, c.divergence


def test_bf16_divergences_are_all_explained(embedded_hf_dir):
    engine = load(embedded_hf_dir, dtype="bfloat16", k=6)
    try:
        results = comparisons(engine, PROMPTS[::2])
    finally:
        engine.close()
    for c in results:
        assert c.identical or c.divergence.explained, c.divergence


def _token(tid, top_ids, top_logits):
    return TokenInfo(tid, "x", Source.PLAIN, 0.5, None, top_ids, top_logits)


def _result(tokens: list[TokenInfo]) -> GenerationResult:
    event = StepEvent(0, tuple(tokens), "", 0, 0, 0, 0, 0, 0, RunStats(), "length")
    return GenerationResult("", tuple(t.id for t in tokens), RunStats(), "length", (event,))


def test_a_divergence_far_beyond_rounding_is_reported_as_unexplained():
    same = _token(5, (5, 6, 7, 8), (9.0, 8.0, 7.0, 6.0))
    near_spec = _token(6, (6, 7, 1, 2), (8.0, 7.9, 3.0, 2.0))
    near_van = _token(7, (7, 6, 1, 2), (8.0, 7.95, 3.0, 2.0))
    d = first_divergence(_result([same, near_spec]), _result([same, near_van]), bound=1.0)
    assert (d.index, d.explained) == (1, True)
    far_van = _token(9, (9, 1, 2, 3), (12.0, 3.0, 2.0, 1.0))  # the batch did not even rank token 9
    d = first_divergence(_result([same, near_spec]), _result([same, far_van]), bound=1.0)
    assert (d.index, d.explained) == (1, False)
    assert first_divergence(_result([same]), _result([same]), bound=1.0) is None


# -- bad input: clear errors, nothing crashes ----------------------------------------------


def test_missing_model_file(tmp_path):
    with pytest.raises(ModelNotFoundError, match="specdeck-cli models"):
        load(str(tmp_path / "nope.gguf"))


def test_a_file_that_is_not_a_model(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("not a model at all")
    with pytest.raises(ModelLoadError):
        load(str(path))


def test_a_corrupt_gguf(tmp_path, default_gguf):
    path = make_corrupt_gguf(str(tmp_path / "broken.gguf"), source=default_gguf)
    with pytest.raises(ModelLoadError, match="(?i)corrupt|truncated|re-?download"):
        load(path)


def test_pair_with_different_vocabularies_is_refused(tiny, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny["draft"], other)
    tokenizer_file = other / "tokenizer.json"
    data = json.loads(tokenizer_file.read_text())
    vocab = data["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    a, b = by_id[1000], by_id[1001]
    vocab[a], vocab[b] = 1001, 1000  # same tokens, two ids swapped: the ids no longer mean the same
    tokenizer_file.write_text(json.dumps(data))
    with pytest.raises(IncompatiblePairError, match="(?i)token 1000"):
        load(tiny["target"], draft=str(other))


def test_prompt_longer_than_the_context(default_gguf):
    engine = load(default_gguf, n_ctx=64)
    try:
        prompt = engine.prompt_ids("word " * 200)
        with pytest.raises(ContextOverflowError, match="shorten the prompt"):
            engine.generate(prompt, GREEDY)
        result = engine.generate(engine.prompt_ids("Hi"), SamplingConfig(max_tokens=8))  # still usable
        assert result.tokens
    finally:
        engine.close()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"k": 99}, "between 0 and 32"),
        ({"backend": "onnx"}, "Unknown backend"),
        ({"drafter": "magic"}, "Unknown drafter"),
    ],
)
def test_bad_settings_are_refused_before_loading(default_gguf, options, message):
    with pytest.raises(ConfigError, match=message):
        load(default_gguf, **options)


def test_cancel_mid_run_then_generate_again(default_gguf):
    engine = load(default_gguf, k=4)
    try:
        prompt = engine.prompt_ids(PROMPTS[1])
        full = engine.generate(prompt, GREEDY)
        cancel = threading.Event()
        seen = []
        for event in engine.stream(prompt, GREEDY, cancel=cancel):
            seen.append(event)
            if len(seen) == 2:
                cancel.set()
        assert seen[-1].finish_reason == "cancelled"
        again = engine.generate(prompt, GREEDY)
        assert again.tokens == full.tokens  # the engine is as good as new
        # a generator abandoned half-way (a UI closing) leaves it usable too
        stream = engine.stream(prompt, GREEDY)
        next(stream)
        stream.close()
        assert engine.generate(prompt, GREEDY).tokens == full.tokens
    finally:
        engine.close()


def load_with_progress(target, **options) -> list[tuple[str, float]]:
    heard = []
    engine = Engine.load(
        legacy_config(target=target, measure_costs=False, **options),
        progress=lambda message, fraction: heard.append((message, fraction)),
    )
    engine.close()
    return heard


def test_a_llama_cpp_load_reports_the_weights_as_they_are_read(default_gguf):
    heard = load_with_progress(default_gguf)
    fractions = [fraction for _, fraction in heard]
    reading = [fraction for message, fraction in heard if message == "Target: reading the weights"]
    assert len(reading) >= 10  # llama.cpp's own callback, not two or three coarse phases
    assert reading[-1] - reading[0] > 0.5
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert heard[-1][0] == "Ready"


def test_a_transformers_load_reports_its_phases_in_order(tiny):
    messages = [message for message, _ in load_with_progress(tiny["target"])]
    assert messages.index("Target: reading the weights") < messages.index("Target: reading the tokenizer")
    assert messages.index("Target: reading the tokenizer") < messages.index("Target: building the forward pass")
    assert messages[-1] == "Ready"
