"""Self-speculative early exit: the partial forward, cache sharing, losslessness, choosing L.

Tiny random models (tests/factories/hf_models.py) for the numerics and the rule;
the embedded SmolLM2-135M (float32) for one end-to-end check. Draft lengths are
fixed in the decode tests, so that every step drafts (automatic k would soon
stop drafting on random models, whose early exits rarely agree with the output).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.api import collect
from engine.backends.hf.backend import TorchBackend
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.sampling import SamplingConfig, probabilities
from engine.drafters.early_exit import EarlyExitDrafter, ExitChooser, candidate_exits
from engine.errors import ConfigError
from tests.factories.fake import MarkovBackend, random_transition
from tests.factories.hf_models import make_tiny_llama, make_tiny_model
from tests.stats_helpers import chi_square_pvalue

PROMPTS = [
    "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese.",
    "Write a short poem about the sea.",
]


def run(backend, prompt, sampling, drafter=None, k=4):
    length = DraftLength(k) if drafter is not None else None
    return collect(list(decode_steps(backend, prompt, sampling, drafter=drafter, draft_length=length)))


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to float32 rounding (1e-5 of the largest value)."""
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())


def ids(backend, text: str) -> list[int]:
    return backend.apply_chat_template([{"role": "user", "content": text}])


def scale_upper_layers(folder: str, first: int, factor: float) -> str:
    """Scale what layers `first`.. add to the residual stream (attention and MLP outputs) by
    `factor`: 0 makes them the identity, so that every exit >= first is exact."""
    path = Path(folder) / "model.safetensors"
    weights = load_file(str(path))
    for name in weights:
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
        if layer >= first and name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * factor
    save_file(weights, str(path), metadata={"format": "pt"})
    return folder


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run faster on one thread, and a second one only waits on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("early-exit")
    return {
        "llama": make_tiny_llama(root / "llama", seed=0, n_layers=4),
        "qwen2": make_tiny_model(root / "qwen2", "qwen2", seed=1, n_layers=4, tie_embeddings=False),
        "qwen3": make_tiny_model(root / "qwen3", "qwen3", seed=2, n_layers=4, n_kv_heads=1, head_dim=32),
    }


@pytest.fixture(scope="module")
def llama(models):
    backend = TorchBackend(models["llama"], dtype="float32")
    yield backend
    backend.close()


# -- the backend's partial forward ----------------------------------------------------------


def test_partial_forward_with_every_layer_equals_the_forward(llama):
    prompt = ids(llama, PROMPTS[0])
    llama.prefill(prompt[:-1])
    n = llama.info.n_layers
    partial = llama.partial_forward(prompt[-1:] + [42, 43], n, len(prompt) - 1)
    assert llama.tokens == prompt[:-1] and llama._kv.length == len(prompt) - 1  # nothing committed
    full = llama.forward(prompt[-1:] + [42, 43])
    assert partial.dtype == torch.float32 and partial.shape == full.shape
    close(partial, full)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_early_exit_head_is_the_final_norm_and_head_on_layer_l(models, arch):
    """Against transformers: hidden_states[L] (the output of layer L - 1), final norm, LM head."""
    backend = TorchBackend(models[arch], dtype="float32")
    try:
        prompt = ids(backend, PROMPTS[1])
        with torch.no_grad():
            hidden = backend._model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
            for layer in (1, 2, 3):
                want = backend._model.lm_head(backend._model.model.norm(hidden[layer][0]))
                got = backend.partial_forward(prompt, layer, 0)
                close(got, want)
    finally:
        backend.close()


@pytest.mark.parametrize("reused", [3, 2], ids=["all-rows-drafted", "last-row-not-drafted"])
def test_verification_starts_from_the_drafts_layers_and_equals_a_full_forward(llama, monkeypatch, reused):
    """forward_from_exit reuses the draft's first layers (their keys and values and the rows'
    residual stream) and gives the logits a full forward gives."""
    prompt = ids(llama, PROMPTS[0])
    feed = prompt[-1:] + [42, 43]
    exit_layer = llama.info.n_layers // 2
    base = len(prompt) - 1
    llama.prefill(prompt[:-1])
    hidden = []
    for i, token in enumerate(feed[:reused]):  # what the drafter does: one row at a time
        llama.partial_forward([token], exit_layer, base + i)
        hidden.append(llama.exit_hidden())
    ran = []
    block = llama._native._block
    monkeypatch.setattr(
        llama._native, "_block", lambda index, *a: ran.append((index, a[1].shape[0])) or block(index, *a)
    )
    got = llama.forward_from_exit(feed, torch.cat(hidden), exit_layer)
    monkeypatch.undo()
    # The first layers ran only for the rows the draft did not run; the rest for all rows.
    assert [i for i, rows in ran if i < exit_layer] == list(range(exit_layer)) * (reused < len(feed))
    assert all(rows == len(feed) for i, rows in ran if i >= exit_layer)
    assert llama.tokens == prompt[:-1] + feed
    llama.rollback(base)
    close(got, llama.forward(feed))


def test_partial_forward_token_by_token_reads_its_own_scratch(llama):
    """Feeding one token at a time at start, start + 1, ... (the drafter's way) attends to the
    scratch rows the earlier calls wrote: the same rows as one call over all of them."""
    prompt = ids(llama, PROMPTS[0])
    llama.prefill(prompt[:-1])
    base, feed = len(prompt) - 1, [prompt[-1], 300, 301, 302]
    together = llama.partial_forward(feed, 2, base)
    apart = torch.cat([llama.partial_forward([t], 2, base + i) for i, t in enumerate(feed)])
    close(apart, together)
    assert llama.tokens == prompt[:-1] and llama._kv.length == base


@pytest.mark.parametrize("compile", ["off", "on"], ids=["eager", "static"])
def test_drafting_across_the_cache_growth_keeps_the_scratch_rows(models, compile):
    """The cache doubles its capacity when a draft runs past it; the scratch rows written
    before the growth are carried over (they lie below the length a partial call sets).
    The static forward's stacked cache too."""
    backend = TorchBackend(models["llama"], dtype="float32", compile=compile)
    try:
        backend.prefill([100 + (7 * i) % 3000 for i in range(254)])  # capacity 256: rows 254, 255 left
        feed = [11, 12, 13, 14, 15]
        apart = torch.cat([backend.partial_forward([t], 3, 254 + i) for i, t in enumerate(feed)])
        assert backend._kv.capacity > 256 and backend._kv.length == 254
        close(apart, backend.partial_forward(feed, 3, 254))
    finally:
        backend.close()


def test_partial_forward_refuses_bad_arguments_and_restores_the_cache_on_error(llama, models):
    prompt = ids(llama, PROMPTS[0])
    llama.prefill(prompt)
    n, base = llama.info.n_layers, len(prompt)
    with pytest.raises(ValueError, match="overwrite"):
        llama.partial_forward([5], 2, base - 1)
    for layers in (0, n + 1):
        with pytest.raises(ValueError, match="n_layers"):
            llama.partial_forward([5], layers, base)
    with pytest.raises(IndexError):  # an id past the vocabulary fails inside the model
        llama.partial_forward([5, 10**7], 2, base)
    assert llama._kv.length == base and llama.tokens == prompt
    assert llama.supports_early_exit
    plain = TorchBackend(models["llama"], dtype="float32", impl="transformers")
    try:
        assert not plain.supports_early_exit
        with pytest.raises(NotImplementedError, match="native"):
            plain.partial_forward([5], 1, 0)
    finally:
        plain.close()


# -- greedy output and the shared cache -----------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_early_exit_equals_vanilla_on_tiny_models(models, arch):
    backend = TorchBackend(models[arch], dtype="float32")
    try:
        for text in PROMPTS:
            prompt = ids(backend, text)
            vanilla = run(backend, prompt, SamplingConfig(max_tokens=40))
            for layers in ("auto", 3):
                result = run(backend, prompt, SamplingConfig(max_tokens=40), EarlyExitDrafter(backend, layers), k=4)
                assert result.tokens == vanilla.tokens
                assert result.stats.drafted > 0
    finally:
        backend.close()


def test_after_a_speculative_run_the_cache_equals_a_fresh_prefill(models, llama):
    prompt = ids(llama, PROMPTS[0])
    drafter = EarlyExitDrafter(llama, 3)
    result = run(llama, prompt, SamplingConfig(max_tokens=40), drafter, k=5)
    s = result.stats
    assert 0 < s.accepted < s.drafted  # drafts were kept and rejected: scratch rows became real rows
    committed = prompt + list(result.tokens)
    assert llama.tokens == committed[:-1]
    fresh = TorchBackend(models["llama"], dtype="float32")
    try:
        fresh.prefill(committed[:-1])
        m = len(committed) - 1
        for layer in range(llama.info.n_layers):
            got, want = llama._kv.buffers[layer][:, :m], fresh._kv.buffers[layer][:, :m]
            close(got, want)
        close(llama.forward(committed[-1:]), fresh.forward(committed[-1:]))
    finally:
        fresh.close()


def test_greedy_early_exit_equals_vanilla_on_the_embedded_model(embedded_hf_dir):
    backend = TorchBackend(embedded_hf_dir, dtype="float32")
    try:
        drafter = EarlyExitDrafter(backend, "auto")
        assert drafter.stats().n_layers == 30
        for text in PROMPTS:  # one the reply copies, one open
            prompt = ids(backend, text)
            vanilla = run(backend, prompt, SamplingConfig(max_tokens=40))
            result = run(backend, prompt, SamplingConfig(max_tokens=40), drafter, k=3)
            assert result.tokens == vanilla.tokens, (result.text, vanilla.text)
            assert result.stats.drafted > 0
        stats = drafter.stats()
        assert [c.layer for c in stats.candidates] == [8, 11, 15, 19, 22]
        assert all(c.steps >= 2 and c.acceptance is not None for c in stats.candidates)  # all explored
    finally:
        backend.close()


# -- sampling stays lossless ----------------------------------------------------------------


def test_sampled_early_exit_is_lossless(tmp_path):
    """The joint law of the first three reply tokens (top-2 sampling, drafts of 2 from exit 1 of
    a 2-layer model whose second layer is damped, so that about half the drafts are kept)
    equals the target's own, computed from its forward passes."""
    backend = TorchBackend(scale_upper_layers(make_tiny_llama(tmp_path / "m", seed=0), 1, 0.4), dtype="float32")
    try:
        sampling = SamplingConfig(temperature=1.0, top_k=2, max_tokens=3)
        prompt = ids(backend, "Hi")
        exact = {}

        def p(seq):
            backend.prefill(seq[:-1])
            return probabilities(backend.forward(seq[-1:])[0], sampling)

        p1 = p(prompt)
        for a in p1.nonzero().flatten().tolist():
            p2 = p(prompt + [a])
            for b in p2.nonzero().flatten().tolist():
                p3 = p(prompt + [a, b])
                for c in p3.nonzero().flatten().tolist():
                    exact[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
        cells = {key: i for i, key in enumerate(exact)}
        counts = np.zeros(len(cells))
        drafter = EarlyExitDrafter(backend, 1)
        drafted = accepted = 0
        for seed in range(800):
            config = SamplingConfig(temperature=1.0, top_k=2, max_tokens=3, seed=seed)
            result = run(backend, prompt, config, drafter, k=2)
            counts[cells[tuple(result.tokens)]] += 1
            drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
        assert 0.1 * drafted < accepted < 0.9 * drafted  # drafts both kept and rejected
    finally:
        backend.close()
    assert chi_square_pvalue(counts, np.array(list(exact.values()))) > 1e-3


# -- choosing the exit ----------------------------------------------------------------------


def test_candidate_exits_lie_between_a_quarter_and_three_quarters():
    assert candidate_exits(30) == [8, 11, 15, 19, 22]
    assert candidate_exits(8) == [2, 3, 4, 5, 6]
    assert candidate_exits(4) == [1, 2, 3]
    assert candidate_exits(2) == [1]


def test_the_rule_weighs_acceptance_against_cost():
    chooser = ExitChooser(24, [6, 12, 18], head_layers=2.0, explore_steps=1, bonus=0.0)
    for layer in (18, 12, 6):
        assert chooser.choose(4) == layer  # exploration: every candidate once, deepest first
        chooser.count_step(layer)
    # Per-token times proportional to layers + head: c_L = (L + 2) / 26.
    for layer, a in ((6, 0.3), (12, 0.8), (18, 0.85)):
        chooser.observe_time(layer, 0.001 * (layer + 2))
        for _ in range(20):
            chooser.observe(layer, 10, round(10 * a))
    assert chooser.cost_ratio(12) == pytest.approx(14 / 26)
    assert chooser.cost_ratio(12, t1=0.028) == pytest.approx(0.5)  # the engine's measured T(1)
    assert chooser.choose(4) == 12  # nearly the deepest's acceptance at two thirds of its cost
    # Deep exit made much better: it now pays for its cost.
    for _ in range(200):
        chooser.observe(18, 10, 10)
    assert chooser.choose(4) == 18
    # A cheap exit that is as good as the others wins.
    for _ in range(400):
        chooser.observe(6, 10, 10)
    assert chooser.choose(4) == 6


def test_an_untried_exit_is_retried_once_its_counts_fade():
    chooser = ExitChooser(12, [3, 9], head_layers=1.0, explore_steps=1)
    for layer in (9, 3):
        chooser.count_step(layer)
        chooser.observe_time(layer, 0.001 * (layer + 1))
    chooser.observe(3, 3, 0)  # one bad step for the shallow exit
    picks = []
    for _ in range(600):
        layer = chooser.choose(4)
        picks.append(layer)
        chooser.observe(layer, 4, 3 if layer == 9 else 0)
    assert picks.count(9) > 0.9 * len(picks)
    assert 3 in picks[100:]  # optimism brings the faded exit back now and then


def test_automatic_exit_settles_where_drafts_are_accepted(tmp_path):
    folder = scale_upper_layers(make_tiny_llama(tmp_path / "m", seed=3, n_layers=8), 4, 0.0)
    backend = TorchBackend(folder, dtype="float32")
    try:
        drafter = EarlyExitDrafter(backend, "auto", costs=CostModel())
        prompt = ids(backend, PROMPTS[1])
        vanilla = run(backend, prompt, SamplingConfig(max_tokens=120))
        result = run(backend, prompt, SamplingConfig(max_tokens=120), drafter, k=6)
        assert result.tokens == vanilla.tokens
        stats = drafter.stats()
        by_layer = {c.layer: c for c in stats.candidates}
        assert set(by_layer) == {2, 3, 4, 5, 6} and all(c.steps >= 2 for c in by_layer.values())
        assert all(by_layer[layer].acceptance > 0.9 for layer in (4, 5, 6))  # exact exits
        assert by_layer[2].acceptance < 0.6
        assert stats.exit_layer in (4, 5, 6) and stats.layers == "auto" and stats.n_layers == 8
        assert result.stats.tokens_per_step > 3
    finally:
        backend.close()


# -- clear errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [0, 4, -1, 2.5, "three", True, None])
def test_an_exit_outside_the_model_is_refused(llama, layers):
    with pytest.raises(ConfigError, match="from 1 to 3"):
        EarlyExitDrafter(llama, layers)


def test_a_fixed_exit_as_text_is_accepted(llama):
    assert EarlyExitDrafter(llama, "2").stats().exit_layer == 2


def test_early_exit_needs_the_native_torch_implementation(models):
    plain = TorchBackend(models["llama"], dtype="float32", impl="transformers")
    try:
        with pytest.raises(ConfigError, match="native implementation.*--backend torch"):
            EarlyExitDrafter(plain)
    finally:
        plain.close()
    with pytest.raises(ConfigError, match="PyTorch backend's native implementation"):
        EarlyExitDrafter(MarkovBackend(random_transition(4, seed=0)))
