"""Medusa drafting: the tree it builds, losslessness on real models, loading heads, clear errors."""

from __future__ import annotations

import inspect
import itertools
import json

import pytest
import torch

from engine.api import Engine, EngineConfig, collect
from engine.backends.capabilities import HiddenFeatures
from engine.backends.hf import backend as torch_backend
from engine.backends.hf.loader import load
from engine.backends.hf.transformers_backend import TransformersBackend
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.sampling import SamplingConfig, make_generator
from engine.drafters.medusa import MedusaDrafter
from engine.errors import ConfigError, ModelLoadError
from engine.heads.medusa import MedusaConfig, MedusaHeads
from engine.models.shipped import default_heads_dir
from tests.engine.drafters.build import legacy_config, make_drafter
from tests.factories.fake import MarkovBackend, MarkovTreeBackend
from tests.factories.hf_models import make_tiny_llama

GREEDY = SamplingConfig(max_tokens=40)
PROMPTS = [
    "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese.",
    "Write a short poem about the sea.",
]


# -- on a Markov chain: heads that know the chain ------------------------------------------


def cycle(vocab: int = 7, noise: float = 0.05) -> torch.Tensor:
    t = torch.full((vocab, vocab), noise)
    for i in range(vocab):
        t[i, (i + 1) % vocab] = 1.0
    return t / t.sum(dim=-1, keepdim=True)


def markov_heads(transition: torch.Tensor, num_heads: int) -> MedusaHeads:
    """Heads with their own LM heads: head d reads the one-hot feature of token t and predicts
    log P^(d+1)[t], the chain's law d + 1 tokens later (identity residual blocks)."""
    vocab = transition.shape[0]
    heads = MedusaHeads(MedusaConfig(num_heads, 1, vocab, vocab, shared_lm_head=False))
    power = transition.clone()
    with torch.no_grad():
        for head in heads.heads:
            power = power @ transition
            head[-1].weight.copy_(torch.log(power).T)
    return heads


def run(backend, prompt, sampling, drafter=None, k=8):
    length = DraftLength(k) if drafter is not None else None
    return collect(list(decode_steps(backend, prompt, sampling, drafter=drafter, draft_length=length)))


def test_heads_that_know_the_chain_are_accepted_at_every_depth():
    t = cycle()
    backend = MarkovTreeBackend(t)
    drafter = MedusaDrafter(markov_heads(t, 3), backend)
    result = run(backend, [0, 1], SamplingConfig(max_tokens=41), drafter, k=8)
    assert result.tokens == run(MarkovBackend(t), [0, 1], SamplingConfig(max_tokens=41)).tokens
    s = result.stats
    assert s.depth_tested[:3] == s.depth_accepted[:3] and len(s.depth_tested) == 3
    assert s.steps <= 12  # first step plain, then 4 tokens per forward (3 heads + bonus)
    stats = drafter.stats()
    assert stats.heads == 3 and stats.head_top1 == (1.0, 1.0, 1.0)
    assert backend.tree_calls and max(len(p) for p in backend.tree_calls) == 9  # pending + 8 nodes


def test_the_tree_spends_its_budget_on_the_likeliest_paths():
    t = cycle()
    drafter = MedusaDrafter(markov_heads(t, 3), MarkovTreeBackend(t), top_k=4)
    drafter.observe_features(torch.nn.functional.one_hot(torch.tensor([2]), 7).float())
    draft = drafter.propose([0, 1, 2, 3], 10, GREEDY, make_generator(0))
    assert len(draft.tokens) == 10 and draft.branches
    assert draft.tokens[0] == 4  # node 0: head 1's best guess, two places after token 2
    assert [draft.tokens[i] for i in draft.best_path] == [4, 5, 6]  # every head's best
    probs = [prob for *_, prob in drafter.plan()]
    assert probs == sorted(probs, reverse=True)
    for i, parent in enumerate(draft.parents):
        assert parent < i
        siblings = [draft.tokens[j] for j, p in enumerate(draft.parents) if p == parent]
        assert len(siblings) == len(set(siblings))
    curve = [drafter.tree_expected_tokens(n) for n in range(12)]
    assert curve[0] == 1.0 and all(b >= a for a, b in itertools.pairwise(curve))
    assert drafter.propose([0, 1, 2, 3], 0, GREEDY, make_generator(0)).tokens == []


def test_no_features_yet_means_no_draft_and_reset_forgets():
    t = cycle()
    drafter = MedusaDrafter(markov_heads(t, 2), MarkovTreeBackend(t))
    assert drafter.propose([0, 1], 4, GREEDY, make_generator(0)).tokens == []
    prior = drafter.acceptance().clone()
    run(MarkovTreeBackend(t), [0, 1], SamplingConfig(max_tokens=20), drafter)
    assert drafter.acceptance()[0, 0] > prior[0, 0]  # learned that head 1's best is right
    drafter.reset()
    assert torch.equal(drafter.acceptance(), prior)


def test_on_a_chain_only_backend_medusa_verifies_its_best_branch():
    t = cycle()
    backend = MarkovTreeBackend(t, tree=False)
    result = run(backend, [0, 1], SamplingConfig(max_tokens=30), MedusaDrafter(markov_heads(t, 3), backend))
    assert result.tokens == run(MarkovBackend(t), [0, 1], SamplingConfig(max_tokens=30)).tokens
    assert result.stats.notes and "most likely branch" in result.stats.notes[0]
    assert max(backend.forward_calls) <= 4 and result.stats.accepted > 0


class FixedCosts(CostModel):
    """A cost curve that ignores the times measured while decoding (no timing in tests)."""

    def observe_verify(self, n, seconds):
        pass

    def observe_draft(self, tokens, seconds):
        pass


def test_automatic_k_sizes_the_tree_from_the_drafters_estimate():
    t = cycle()
    backend = MarkovTreeBackend(t)
    drafter = MedusaDrafter(markov_heads(t, 3), backend)
    costs = FixedCosts(verify_s={1: 0.010, 2: 0.0101, 4: 0.0102, 8: 0.0104, 16: 0.011, 33: 0.014})
    events = list(
        decode_steps(
            backend,
            [0, 1],
            SamplingConfig(max_tokens=60),
            drafter=drafter,
            draft_length=DraftLength("auto", k_max=16),
            costs=costs,
        )
    )
    assert collect(events).tokens == run(MarkovBackend(t), [0, 1], SamplingConfig(max_tokens=60)).tokens
    assert max(e.k for e in events) >= 3  # cheap verification and sure heads: a real tree
    assert events[-1].stats.predicted_speedup > 1.5


# -- on a real (tiny, random) Llama through the torch backend ------------------------------


class _FeaturesTorchBackend(TransformersBackend):
    """Hidden states through a hook on the final norm, for as long as the torch backend does
    not expose them itself (chains only: the decode loop verifies Medusa's best branch)."""

    capabilities = TransformersBackend.capabilities | {HiddenFeatures}

    def __init__(self, path, impl: str = "transformers", **options) -> None:
        super().__init__(load(path, **options))

    @property
    def hidden_size(self) -> int:
        return int(self._model.config.get_text_config().hidden_size)

    @property
    def lm_head(self) -> torch.nn.Module:
        return self._model.get_output_embeddings()

    def _run(self, tokens, all_logits):
        captured = {}
        hook = self._model.model.norm.register_forward_hook(lambda m, i, out: captured.update(h=out))
        try:
            logits = super()._run(tokens, all_logits)
        finally:
            hook.remove()
        self._features = captured["h"][0]  # (n, hidden)
        return logits

    def last_features(self) -> torch.Tensor:
        return self._features


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("medusa") / "target", seed=0, n_layers=2)


@pytest.fixture(scope="module")
def native_features(tiny) -> bool:
    """Whether the torch backend gives hidden states for this model by itself."""
    backend = torch_backend.TorchBackend(tiny, dtype="float32")
    try:
        return bool(backend.supports_features)
    finally:
        backend.close()


@pytest.fixture
def torch_with_features(monkeypatch, native_features):
    """The torch backend, with features from the shim where it has none of its own."""
    if not native_features:
        monkeypatch.setattr(torch_backend, "TorchBackend", _FeaturesTorchBackend)
    return torch_backend.TorchBackend


def shared_heads(folder, num_heads=3, hidden=64, noise=0.0, seed=0) -> str:
    heads = MedusaHeads(MedusaConfig(num_heads, 1, hidden, 49152, shared_lm_head=True, base_model="tiny"))
    if noise:
        gen = make_generator(seed)
        with torch.no_grad():
            for p in heads.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * noise / hidden**0.5)
    heads.save(str(folder))
    return str(folder)


def published_heads(folder, backend, prompts: list[list[int]], num_heads=3) -> str:
    """FasterDecoding/Medusa's layout (config.json + medusa_lm_head.safetensors, each head with
    its own LM head), with LM heads that memorize the target's greedy replies to `prompts`.

    Head k's LM head row for token y is the sum of the (normalized) hidden states after which
    y came k + 2 places later, so on those replies the heads guess right, except at every third
    position, where the right token is only their second guess (a rejection in a chain, an
    accepted second branch in a tree).
    """
    from safetensors.torch import save_file

    hidden, vocab = backend.hidden_size, backend.vocab_size
    lm = torch.zeros(num_heads, vocab, hidden)
    for prompt in prompts:
        seq = list(collect(list(decode_steps(backend, prompt, GREEDY))).tokens)
        seq = prompt + seq
        backend.rollback(0)
        backend.forward(seq)
        h = backend.last_features().float()
        h = h / h.norm(dim=1, keepdim=True)  # (n, hidden)
        for t in range(len(prompt) - 2, len(seq)):
            for k in range(num_heads):
                if t + 2 + k < len(seq):
                    right = seq[t + 2 + k]
                    if (t + k) % 3:
                        lm[k, right] += h[t]
                    else:
                        lm[k, (right + 1) % vocab] += h[t]
                        lm[k, right] += 0.5 * h[t]
        backend.rollback(0)
    weights = {}
    for k in range(num_heads):
        weights[f"{k}.0.linear.weight"] = torch.zeros(hidden, hidden)  # identity blocks
        weights[f"{k}.0.linear.bias"] = torch.zeros(hidden)
        weights[f"{k}.1.weight"] = lm[k].contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / "medusa_lm_head.safetensors"))
    config = {"medusa_num_heads": num_heads, "medusa_num_layers": 1, "base_model_name_or_path": "tiny-llama"}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def medusa_engine(backend_class, target: str, heads: str, k: int = 6) -> Engine:
    backend = backend_class(target, dtype="float32")
    try:
        drafter = make_drafter("medusa", backend, heads=heads)
    except Exception:
        backend.close()
        raise
    return Engine(backend, drafter, legacy_config(target=target, drafter="medusa", heads=heads, k=k), CostModel())


@pytest.mark.parametrize("noise", [0.0, 2.0], ids=["zero-init", "perturbed"])
def test_float32_greedy_medusa_equals_vanilla_on_a_tiny_llama(torch_with_features, tiny, tmp_path, noise):
    engine = medusa_engine(torch_with_features, tiny, shared_heads(tmp_path / "heads", noise=noise))
    try:
        for text in PROMPTS:
            comparison = engine.compare(engine.prompt_ids(text), GREEDY)
            assert comparison.identical, comparison.divergence
            s = comparison.speculative.stats
            assert s.drafted > 0 and s.accepted < s.drafted  # drafted, and rejections happened
            assert sum(s.depth_tested) == s.tested
        assert engine.drafter.stats().scored[0] > 0
    finally:
        engine.close()


def test_sampled_medusa_runs_and_a_seed_reproduces_it(torch_with_features, tiny, tmp_path):
    engine = medusa_engine(torch_with_features, tiny, shared_heads(tmp_path / "heads", noise=1.0))
    try:
        prompt = engine.prompt_ids(PROMPTS[1])
        config = SamplingConfig(temperature=0.8, top_k=40, max_tokens=24, seed=7)
        first, second = (engine.generate(prompt, config) for _ in range(2))
        assert first.tokens == second.tokens and len(first.tokens) > 0
        assert first.stats.drafted > 0
    finally:
        engine.close()


def test_published_layout_with_own_lm_heads_loads_drafts_and_stays_lossless(torch_with_features, tiny, tmp_path):
    backend = torch_with_features(tiny, dtype="float32")
    try:
        engine = Engine(backend, None, EngineConfig(drafter="medusa", k=8), CostModel())
        prompts = [engine.prompt_ids(text) for text in PROMPTS]
        engine.drafter = make_drafter(
            "medusa", backend, heads=published_heads(tmp_path / "published", backend, prompts)
        )
        assert not engine.drafter.heads.config.shared_lm_head and engine.drafter.num_heads == 3
        for prompt in prompts:
            comparison = engine.compare(prompt, GREEDY)
            assert comparison.identical, comparison.divergence
            s = comparison.speculative.stats
            assert 0 < s.accepted < s.drafted  # right guesses and wrong ones
            assert s.tokens_per_step > 1.5
            assert len(s.depth_accepted) == 3 and all(a > 0 for a in s.depth_accepted)
            if backend.supports_tree:  # the second guesses are in the tree: accepted there
                assert s.tokens_per_step > 2.5
    finally:
        backend.close()


def test_on_a_torch_target_without_tree_attention_medusa_verifies_its_best_branch(tiny, tmp_path):
    """The transformers implementation (chains only), with hidden states from the shim."""
    if "impl" in inspect.signature(torch_backend.TorchBackend).parameters:
        backend = _FeaturesTorchBackend(tiny, dtype="float32", impl="transformers")
    else:
        backend = torch_backend.TorchBackend(tiny, dtype="float32")
        if backend.supports_features:
            backend.supports_tree = False  # hide the tree attention: chains only
        else:
            backend.close()
            backend = _FeaturesTorchBackend(tiny, dtype="float32")
    try:
        assert not backend.supports_tree
        engine = Engine(backend, None, EngineConfig(drafter="medusa", k=8), CostModel())
        prompts = [engine.prompt_ids(text) for text in PROMPTS]
        engine.drafter = make_drafter(
            "medusa", backend, heads=published_heads(tmp_path / "published", backend, prompts)
        )
        assert engine.notes and "most likely branch" in engine.notes[0]
        comparison = engine.compare(prompts[0], GREEDY)
        assert comparison.identical, comparison.divergence
        s = comparison.speculative.stats
        assert 0 < s.accepted < s.drafted and s.notes == engine.notes
    finally:
        backend.close()


# -- loading errors ------------------------------------------------------------------------


def break_missing_tensor(folder):
    from safetensors.torch import load_file, save_file

    path = folder / "medusa_lm_head.safetensors"
    weights = load_file(str(path))
    del weights["1.0.linear.bias"]
    save_file(weights, str(path))


def break_corrupt_file(folder):
    (folder / "medusa_lm_head.safetensors").write_bytes(b"\x00\x01not a safetensors file" * 10)


class NotATensor:
    """What a hostile or broken .pt file might hold instead of tensors."""


def break_pickle(folder):
    (folder / "medusa_lm_head.safetensors").unlink()
    torch.save({"0.0.linear.weight": NotATensor()}, str(folder / "medusa_lm_head.pt"))


@pytest.mark.parametrize(
    "breakage, message",
    [
        (break_missing_tensor, "incomplete"),
        (break_corrupt_file, "corrupt"),
        (break_pickle, "contains pickled code"),
        (None, "hidden size of 32"),
    ],
    ids=["missing-tensor", "corrupt-file", "non-tensor-pickle", "wrong-hidden-size"],
)
def test_heads_that_do_not_fit_give_a_clear_load_error(torch_with_features, tiny, tmp_path, breakage, message):
    folder = tmp_path / "heads"
    shared_heads(folder, hidden=32 if breakage is None else 64)
    if breakage is not None:
        breakage(folder)
    backend = torch_with_features(tiny, dtype="float32")
    try:
        with pytest.raises(ModelLoadError, match=message):
            make_drafter("medusa", backend, heads=str(folder))
    finally:
        backend.close()


def test_medusa_on_llama_cpp_says_to_use_the_torch_backend(default_llama, tmp_path):
    with pytest.raises(ConfigError, match="PyTorch backend"):
        make_drafter("medusa", default_llama, heads=shared_heads(tmp_path / "heads", hidden=576))


def test_medusa_on_the_default_model_through_the_engine_explains_what_to_do():
    with pytest.raises(ConfigError, match="PyTorch backend"):
        Engine.load(EngineConfig(target="default", drafter="medusa", backend="llama.cpp", measure_costs=False))


def test_medusa_with_backend_auto_loads_the_target_on_pytorch():
    from engine.api import target_backend

    assert target_backend(EngineConfig(target="default", drafter="medusa")) == "torch"
    assert target_backend(EngineConfig(target="default", drafter="ngram")) == "auto"
    assert target_backend(EngineConfig(target="default", drafter="medusa", backend="llama.cpp")) == "llama.cpp"


def test_no_heads_for_a_model_says_how_to_get_some(torch_with_features, tiny):
    backend = torch_with_features(tiny, dtype="float32")
    try:
        with pytest.raises(ConfigError, match="train-heads --kind medusa"):
            make_drafter("medusa", backend)
    finally:
        backend.close()


def test_shipped_heads_are_found_for_the_embedded_model_only(monkeypatch, tmp_path):
    from engine.backends.base import ModelInfo
    from engine.models import shipped

    monkeypatch.setattr(shipped, "resources_dir", lambda: tmp_path)
    smollm = ModelInfo(
        "SmolLM2-135M-Instruct.Q4_1", "/x.gguf", "torch", "llama", 134_515_008, 0, 49152, 30, 8192, "float32", "cpu"
    )
    converted = ModelInfo(
        "my-folder", "/tmp/my-folder", "torch", "llama", 134_515_008, 0, 49152, 30, 8192, "float32", "cpu"
    )
    other = ModelInfo("tiny", "/tmp/tiny", "torch", "llama", 3_000_000, 0, 49152, 2, 2048, "float32", "cpu")
    assert default_heads_dir("medusa", smollm) is None  # nothing shipped yet
    folder = tmp_path / "heads" / "medusa-smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert default_heads_dir("medusa", smollm) == str(folder)
    assert default_heads_dir("medusa", converted) == str(folder)
    assert default_heads_dir("medusa", other) is None


# -- the command line ------------------------------------------------------------------


def test_cli_reports_per_head_acceptance(torch_with_features, tiny, tmp_path, capsys):
    from engine.cli.main import main

    heads = shared_heads(tmp_path / "heads", noise=1.0)
    code = main(
        [
            "generate",
            "--target",
            tiny,
            "--heads",
            heads,
            "--k",
            "4",
            "--dtype",
            "float32",
            "--prompt",
            PROMPTS[0],
            "--max-tokens",
            "16",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    stats = json.loads(out)["stats"]
    assert stats["drafted"] > 0
    assert len(stats["head_acceptance"]) == len(stats["depth_tested"]) >= 1
    assert all(0.0 <= a <= 1.0 for a in stats["head_acceptance"])


def test_cli_medusa_on_the_default_model_is_one_clear_line(capsys):
    from engine.cli.main import main

    code = main(
        [
            "generate",
            "--target",
            "default",
            "--backend",
            "llama.cpp",
            "--drafter",
            "medusa",
            "--prompt",
            "hi",
            "--max-tokens",
            "4",
        ]
    )
    _, err = capsys.readouterr()
    assert code == 2 and "PyTorch backend" in err and len(err.strip().splitlines()) == 1


def test_shipped_heads_keep_the_embedded_model_greedy_output_exact_in_float32(embedded_hf_dir):
    """The heads in resources/ load for the embedded model, draft real trees, and change nothing."""
    from engine.backends.hf.backend import TorchBackend

    engine = medusa_engine(TorchBackend, embedded_hf_dir, heads=None, k=12)
    try:
        prompt = engine.prompt_ids("List the days of the week, one per line.")
        comparison = engine.compare(prompt, SamplingConfig(temperature=0.0, max_tokens=40))
        assert comparison.identical, comparison.divergence
        s = comparison.speculative.stats
        assert s.drafted > s.steps  # several tree nodes per target forward
        assert s.depth_tested and sum(s.depth_tested) == s.tested
    finally:
        engine.close()
