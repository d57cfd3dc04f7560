"""The static-shape native forward (`--compile on`) against the eager one, on the CPU.

A user switching --compile must see the same greedy text, speculative or not, and logits
equal up to float32 rounding: through prefills longer than the largest bucket (which run
eagerly on the static cache), single steps, verify blocks padded to a bucket, rollbacks,
trees, features and early exits. The CUDA graphs of that path need a GPU and are not run
here; `auto` does not choose them, even on CUDA, until they have run on one (issue 40).
Every model is tiny and random (tests/factories/hf_models.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.api import Engine, collect
from engine.backends.hf import static as static_module
from engine.backends.hf.backend import TorchBackend
from engine.backends.hf.static import ROW_BUCKETS, bucket, choose
from engine.config import EngineConfig
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.sampling import SamplingConfig
from engine.drafters.eagle import EagleDrafter
from engine.drafters.early_exit import EarlyExitDrafter
from engine.drafters.model import ModelDrafter
from engine.errors import ConfigError
from engine.heads.eagle import EagleConfig, EagleHead
from tests.engine.backends.numerics import assert_close as _close
from tests.engine.backends.numerics import random_ids as _ids
from tests.engine.drafters.build import make_drafter
from tests.factories.hf_models import make_tiny_model

GREEDY = SamplingConfig(max_tokens=40)
PROMPT = "Repeat after me, word for word: the early bird catches the worm, but the second mouse gets the cheese."

CONFIGS = {
    "llama-tied": ("llama", {"n_layers": 3}),
    "llama-biases-mha": ("llama", {"attention_bias": True, "mlp_bias": True, "n_kv_heads": 4}),
    "qwen2-untied": ("qwen2", {"tie_embeddings": False}),
    "qwen3-tied": ("qwen3", {"n_heads": 4, "n_kv_heads": 1, "head_dim": 32}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("static")
    return {key: make_tiny_model(root / key, arch, seed=3, **opts) for key, (arch, opts) in CONFIGS.items()}


@pytest.fixture(scope="module")
def pair(folders):
    """The same llama folder loaded eager and static."""
    eager = TorchBackend(folders["llama-tied"], dtype="float32", compile="off")
    static = TorchBackend(folders["llama-tied"], dtype="float32", compile="on")
    yield eager, static
    eager.close()
    static.close()


@pytest.fixture
def fresh(pair):
    for backend in pair:
        backend.rollback(0)
    return pair


def _script(backend) -> list[torch.Tensor]:
    """Prefills inside and beyond the largest bucket, single steps, blocks of odd sizes, rollbacks."""
    seen = [backend.forward(_ids(12, 0))]  # padded to 16
    for token in _ids(3, 1):
        seen.append(backend.forward([token]))
    seen.append(backend.forward(_ids(5, 2)))  # padded to 8
    backend.rollback(len(backend.tokens) - 3)
    for token in _ids(2, 3):
        seen.append(backend.forward([token]))
    seen.append(backend.forward(_ids(70, 4)))  # past the largest bucket: eager, on the static cache
    seen.append(backend.forward(_ids(3, 5)))
    backend.rollback(5)
    seen.append(backend.forward(_ids(27, 6), all_logits=False))  # padded to 32, the last row only
    seen.append(backend.forward(_ids(20, 7)))  # padded to 33
    seen.append(backend.forward([8]))
    return seen


# -- the same numbers --------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(CONFIGS))
def test_static_logits_equal_eager_through_decode_and_rollback(folders, key):
    eager = TorchBackend(folders[key], dtype="float32", compile="off")
    static = TorchBackend(folders[key], dtype="float32", compile="on")
    assert eager.info.forward.startswith("native forward, eager")
    assert static.info.forward.startswith("native forward, static shapes")
    for step, (got, want) in enumerate(zip(_script(static), _script(eager), strict=True)):
        assert got.shape == want.shape
        _close(got, want, f"{key}, call {step}")
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert static.tokens == eager.tokens
    eager.close()
    static.close()


def test_auto_is_the_eager_path_on_the_cpu(folders):
    backend = TorchBackend(folders["llama-tied"], dtype="float32")
    assert backend.info.forward.startswith("native forward, eager")  # then how it multiplies: test_prepacked.py
    assert type(backend._kv).__name__ == "KVCache"  # grown by doubling, as before
    backend.close()


def test_auto_on_cuda_is_eager_and_says_graphs_are_opt_in():
    """A user with a GPU gets the forward that has run, and the load line says how to get graphs."""
    on_cuda = SimpleNamespace(device=torch.device("cuda"), static_rope=True)  # a native forward on CUDA
    static, said = choose(on_cuda, "auto")
    assert static is None
    assert said == "native forward, eager (CUDA graphs are opt-in: --compile on; not yet verified on a GPU)"
    assert choose(on_cuda, "off") == (None, "native forward, eager")


def test_compile_on_still_captures_graphs_on_cuda_and_says_they_are_unverified(monkeypatch):
    built = []
    monkeypatch.setattr(static_module, "StaticForward", lambda native, graphs: built.append(graphs) or "static")
    on_cuda = SimpleNamespace(device=torch.device("cuda"), static_rope=True)
    assert choose(on_cuda, "on") == (
        "static",
        "native forward, static shapes and CUDA graphs (not yet verified on a GPU)",
    )
    assert built == [True]


def test_compile_on_gives_the_static_path_off_cuda(pair):
    assert pair[1].info.forward.startswith("native forward, static shapes (no CUDA graphs off CUDA)")
    assert type(pair[1]._kv).__name__ == "StaticKVCache"


def test_every_row_count_up_to_the_largest_bucket_gives_eager_logits(fresh):
    eager, static = fresh
    assert bucket(ROW_BUCKETS[-1] + 1) is None
    prompt = _ids(6, 7)
    for backend in fresh:
        backend.forward(prompt)
    for n in range(1, ROW_BUCKETS[-1] + 1):
        block = _ids(n, 100 + n)
        _close(static.forward(block), eager.forward(block), f"{n} rows")
        for backend in fresh:
            backend.rollback(len(prompt))


def test_a_block_that_ends_at_the_last_position_of_the_context(folders):
    # Padding rows go past n_ctx into the cache's scratch rows: nothing there may leak back.
    eager = TorchBackend(folders["llama-tied"], dtype="float32", compile="off", n_ctx=40)
    static = TorchBackend(folders["llama-tied"], dtype="float32", compile="on", n_ctx=40)
    for backend in (eager, static):
        backend.forward(_ids(30, 8))
    block = _ids(10, 9)  # positions 30..39, padded to 16 rows
    _close(static.forward(block), eager.forward(block), "the last block")
    static.rollback(31)
    eager.rollback(31)
    _close(static.forward(block[1:]), eager.forward(block[1:]), "after a rollback into it")
    eager.close()
    static.close()


TREE_PARENTS = [-1, 0, 0, 1, 1, -1, 5, 2]


def test_trees_features_and_kept_paths_equal_eager(fresh):
    eager, static = fresh
    tokens = _ids(8, 10)
    for backend in fresh:
        backend.forward(_ids(10, 11), all_logits=False)
    _close(static.forward_tree(tokens, TREE_PARENTS), eager.forward_tree(tokens, TREE_PARENTS), "tree")
    _close(static.last_features(), eager.last_features(), "tree features")
    for backend in fresh:
        backend.keep_nodes([0, 2, 7])
    assert static.tokens == eager.tokens and static._kv.length == 13
    _close(static.forward([555, 556]), eager.forward([555, 556]), "after keeping a path")
    _close(static.cached_features(), eager.cached_features(), "cached features")


def test_early_exit_on_the_static_path_equals_eager(fresh):
    eager, static = fresh
    prompt, draft = _ids(9, 12), _ids(3, 13)
    results = []
    for backend in fresh:
        backend.forward(prompt)
        rows = [backend.partial_forward([token], 2, len(prompt) + i) for i, token in enumerate(draft)]
        hidden = backend.exit_hidden()
        exits = [backend.partial_forward(draft, 2, len(prompt)), backend.exit_hidden()]
        verify = backend.forward_from_exit(draft + [17], exits[1], 2)
        results.append((torch.cat(rows), hidden, *exits, verify))
        assert len(backend.tokens) == len(prompt) + 4
    for name, got, want in zip(("one by one", "hidden", "a block", "its hidden", "verify"), *results):
        _close(got, want, f"early exit: {name}")


class ReplayLike:
    """What CUDA graphs in one shared pool do to outputs, on the CPU: each shape's outputs live at
    fixed addresses, every shape's in the same memory, and each run overwrites them."""

    def __init__(self) -> None:
        self.shared: list[torch.Tensor] = []
        self.runs: dict[tuple, int] = {}
        self.buffer, self.buffers_seen = None, 0

    def clear(self, buffer) -> None:  # the KV buffer moved: a GPU would capture every shape again
        self.buffer, self.buffers_seen, self.runs = buffer, self.buffers_seen + 1, {}

    def run(self, key: tuple, step) -> tuple[torch.Tensor, ...]:
        result = step()
        if not self.shared:
            self.shared = [torch.empty(64 * 49152) for _ in result]  # the largest bucket's logits fit
        self.runs[key] = self.runs.get(key, 0) + 1
        outputs = tuple(flat[: t.numel()].view_as(t) for flat, t in zip(self.shared, result))
        for kept, new in zip(outputs, result):
            kept.copy_(new)
        return outputs


def test_outputs_are_copied_out_before_the_next_replay_overwrites_them(folders):
    eager = TorchBackend(folders["llama-tied"], dtype="float32", compile="off")
    static = TorchBackend(folders["llama-tied"], dtype="float32", compile="on")
    graphs = static._pass.__self__.graphs = ReplayLike()
    for step, (got, want) in enumerate(zip(_script(static), _script(eager), strict=True)):
        _close(got, want, f"call {step}")
    for backend in (eager, static):
        backend.rollback(20)
        backend.forward_tree(_ids(8, 14), TREE_PARENTS)
        backend.partial_forward([3], 1, len(backend.tokens))  # another replay, into the same memory
    _close(static.last_features(), eager.last_features(), "the tree's features, after another replay")
    _close(static.cached_features(), eager.cached_features(), "every cached feature")
    # Decoding reuses one shape per span: a GPU captures a handful of graphs, not one per step.
    assert len(graphs.runs) <= 10 and max(graphs.runs.values()) >= 5
    assert graphs.buffers_seen == 1  # the first 256 rows: no growth yet
    for backend in (eager, static):
        backend.forward(_ids(250, 15), all_logits=False)
    block = _ids(20, 16)  # crosses 256: the buffer doubles under the rows it holds
    _close(static.forward(block), eager.forward(block), "after growing")
    assert static._kv.capacity == eager._kv.capacity == 512 and graphs.buffers_seen == 2
    eager.close()
    static.close()


def test_the_path_travels_to_the_app_and_an_older_servers_info_still_reads(pair):
    from engine.service import wire

    info = pair[1].info
    sent = wire.model_info_to_dict(info)
    assert wire.model_info_from_dict(sent) == info and "static shapes" in sent["forward"]
    del sent["forward"]  # a server from before the field
    assert wire.model_info_from_dict(sent).forward == ""


def test_dynamic_rope_keeps_the_eager_path_and_says_why(tmp_path):
    folder = make_tiny_model(
        tmp_path / "dynamic", "llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    )
    backend = TorchBackend(folder, dtype="float32", compile="on")
    assert "eager" in backend.info.forward and "dynamic rope" in backend.info.forward
    backend.close()
    with pytest.raises(ConfigError, match="compile"):
        TorchBackend(folder, dtype="float32", compile="fast")


# -- the same text -----------------------------------------------------------------------------


def _run(backend, prompt, drafter=None, k=4):
    length = DraftLength(k) if drafter is not None else None
    return collect(list(decode_steps(backend, prompt, GREEDY, drafter=drafter, draft_length=length)))


def test_greedy_text_is_the_same_vanilla_and_with_ngram_and_early_exit_drafts(pair):
    eager, static = pair
    prompt = eager.apply_chat_template([{"role": "user", "content": PROMPT}])
    vanilla = _run(eager, prompt)
    assert _run(static, prompt).tokens == vanilla.tokens
    ngram = _run(static, prompt, make_drafter("ngram", static))
    exits = _run(static, prompt, EarlyExitDrafter(static, 2))
    assert ngram.tokens == exits.tokens == vanilla.tokens
    assert ngram.stats.drafted > 0 and exits.stats.drafted > 0


def test_greedy_text_is_the_same_with_a_static_draft_model(pair, folders):
    eager, static = pair
    draft = TorchBackend(folders["llama-biases-mha"], dtype="float32", compile="on")
    prompt = eager.apply_chat_template([{"role": "user", "content": PROMPT}])
    result = _run(static, prompt, ModelDrafter(draft, static.vocab_size))
    assert result.tokens == _run(eager, prompt).tokens and result.stats.drafted > 0
    draft.close()


def test_greedy_eagle_trees_give_the_same_text(pair):
    eager, static = pair
    torch.manual_seed(0)
    head = EagleHead(EagleConfig.for_target(static.text_config)).eval()
    engine = Engine(static, EagleDrafter(head, static), EngineConfig(drafter="eagle", k=8), CostModel())
    prompt = engine.prompt_ids(PROMPT)
    comparison = engine.compare(prompt, GREEDY)
    assert comparison.identical, comparison.divergence
    assert comparison.speculative.tokens == _run(eager, prompt).tokens
    assert comparison.speculative.stats.drafted > 0


# -- on a GPU (skipped without one) -------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_cuda_graphs_give_the_eager_logits_and_text(folders):
    eager = TorchBackend(folders["llama-tied"], device="cuda", dtype="float32", compile="off")
    graphed = TorchBackend(folders["llama-tied"], device="cuda", dtype="float32", compile="on")  # graphs: opt-in
    assert graphed.info.forward == "native forward, static shapes and CUDA graphs (not yet verified on a GPU)"
    for step, (got, want) in enumerate(zip(_script(graphed), _script(eager), strict=True)):
        _close(got, want, f"call {step}")
    captured = graphed._pass.__self__.graphs.captured
    assert 0 < len(captured) <= 12
    prompt = eager.apply_chat_template([{"role": "user", "content": PROMPT}])
    vanilla = _run(eager, prompt)
    assert _run(graphed, prompt).tokens == vanilla.tokens
    assert _run(graphed, prompt, make_drafter("ngram", graphed)).tokens == vanilla.tokens
    assert _run(graphed, prompt, EarlyExitDrafter(graphed, 2)).tokens == vanilla.tokens
    eager.close()
    graphed.close()
