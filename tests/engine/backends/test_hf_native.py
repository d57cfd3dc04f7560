"""The native Llama-family forward of the PyTorch backend against transformers' own.

Every model here is tiny and random (tests/factories/hf_models.py) except the
embedded SmolLM2-135M. The reference is always the same folder loaded with
impl="transformers": a user switching implementations must see the same logits,
the same greedy text, and trees that score every branch as a chain would.
"""

from __future__ import annotations

import pytest
import torch

from engine.backends.hf.backend import TorchBackend
from engine.backends.hf.device import pick_dtype
from engine.backends.hf.native_backend import NativeBackend
from engine.backends.hf.quantize import Int8Linear
from engine.backends.hf.transformers_backend import TransformersBackend
from engine.errors import ConfigError, ContextOverflowError
from tests.engine.backends.numerics import assert_close as _close
from tests.engine.backends.numerics import random_ids as _ids
from tests.factories.hf_models import make_tiny_model, tokenizer_dir

# Each: (architecture, factory options). Tied and untied heads, Qwen2's q/k/v biases,
# Qwen3's per-head q/k norms (with head_dim != hidden / heads), a Mistral whose window
# is longer than the context, a Llama with YaRN rope scaling (its attention factor
# scales cos and sin), one with dynamic rope (cos/sin computed per call, not from a
# table), a Llama with every bias and no grouping of KV heads.
CONFIGS = {
    "llama-tied": ("llama", {}),
    "llama-biases-mha": ("llama", {"attention_bias": True, "mlp_bias": True, "n_kv_heads": 4}),
    "llama-untied-yarn": (
        "llama",
        {
            "tie_embeddings": False,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 512,
            },
        },
    ),
    "llama-dynamic-rope": ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}),
    "qwen2-untied": ("qwen2", {"tie_embeddings": False}),
    "qwen3-tied": ("qwen3", {"n_heads": 4, "n_kv_heads": 1, "head_dim": 32}),
    "mistral-untied": ("mistral", {"tie_embeddings": False, "sliding_window": 4096}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("native")
    return {key: make_tiny_model(root / key, arch, seed=3, **opts) for key, (arch, opts) in CONFIGS.items()}


@pytest.fixture(scope="module")
def llama_dir(folders) -> str:
    return folders["llama-tied"]


@pytest.fixture(scope="module")
def native(llama_dir):
    backend = TorchBackend(llama_dir, dtype="float32", impl="native")
    yield backend
    backend.close()


@pytest.fixture
def fresh(native):
    native.rollback(0)
    return native


def _script(backend: TorchBackend) -> list[torch.Tensor]:
    """Prefill, single decode steps, a verify block, a rollback, more steps: every logit row seen."""
    prompt = _ids(12, 0)
    seen = [backend.forward(prompt)]
    for token in _ids(3, 1):
        seen.append(backend.forward([token]))
    seen.append(backend.forward(_ids(4, 2)))
    backend.rollback(len(backend.tokens) - 3)
    for token in _ids(2, 3):
        seen.append(backend.forward([token]))
    seen.append(backend.forward(_ids(3, 4)))
    backend.rollback(5)
    seen.append(backend.forward(_ids(6, 5), all_logits=False))
    return seen


# -- logits equal transformers' ------------------------------------------------------------


@pytest.mark.parametrize("key", list(CONFIGS))
def test_native_logits_equal_transformers_through_decode_and_rollback(folders, key):
    ours = TorchBackend(folders[key], dtype="float32", impl="native")
    theirs = TorchBackend(folders[key], dtype="float32", impl="transformers")
    assert isinstance(ours, NativeBackend) and isinstance(theirs, TransformersBackend)
    assert ours._native.static_rope == ("dynamic" not in key)  # a table of cos/sin, or per call
    assert ours.info.weight_bytes == theirs.info.weight_bytes == 4 * ours.info.n_params
    for step, (got, want) in enumerate(zip(_script(ours), _script(theirs), strict=True)):
        assert got.shape == want.shape
        _close(got, want, f"{key}, call {step}")
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert ours.tokens == theirs.tokens
    ours.close()
    theirs.close()


@pytest.mark.slow
def test_embedded_model_native_equals_transformers(embedded_hf_dir):
    ours = TorchBackend(embedded_hf_dir, dtype="float32", impl="native")
    theirs = TorchBackend(embedded_hf_dir, dtype="float32", impl="transformers")
    prompt = ours.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    got, want = ours.forward(prompt), theirs.forward(prompt)
    _close(got, want, "embedded prefill")
    reply = []
    for _ in range(6):  # greedy decode on both, token by token
        token = int(want[-1].argmax())
        assert int(got[-1].argmax()) == token
        reply.append(token)
        got, want = ours.forward([token]), theirs.forward([token])
        _close(got, want, "embedded decode")
    assert "Paris" in ours.detokenize(reply)
    ours.rollback(len(prompt) + 2)
    theirs.rollback(len(prompt) + 2)
    _close(ours.forward(reply[2:]), theirs.forward(reply[2:]), "embedded after rollback")
    ours.close()
    theirs.close()


def test_weights_are_borrowed_not_copied(native):
    # Fusing q/k/v and gate/up re-points the transformers parameters at the fused
    # tensors: one copy of every weight in memory, shared by both implementations.
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in native._model.parameters()}
    assert sum(storages.values()) == native.info.weight_bytes == 4 * native.info.n_params
    block = native._native.blocks[0]
    for ours in (block.qkv.weight, block.gate_up.weight, block.down.weight, native._native.head.weight):
        assert ours.untyped_storage().data_ptr() in storages
    attn = native._model.model.layers[0].self_attn
    assert attn.k_proj.weight.data_ptr() == block.qkv.weight[attn.q_proj.out_features :].data_ptr()


def test_cache_grows_by_doubling_and_keeps_what_it_held(llama_dir):
    ours = TorchBackend(llama_dir, dtype="float32", impl="native")
    theirs = TorchBackend(llama_dir, dtype="float32", impl="transformers")
    long_prompt = _ids(250, 6)
    ours.forward(long_prompt, all_logits=False)
    theirs.forward(long_prompt, all_logits=False)
    assert ours._kv.capacity == 256  # not the whole 2048-token context up front
    block = _ids(20, 7)  # crosses 256: the cache is reallocated under the rows it holds
    _close(ours.forward(block), theirs.forward(block), "after growing")
    assert ours._kv.capacity == 512
    ours.close()
    theirs.close()


def test_saved_model_still_loads_after_weights_were_fused(native, tmp_path):
    # q/k/v and gate/up now live in fused tensors; saving must still write plain weights.
    native.rollback(0)
    want = native.forward(_ids(8, 8))
    native.rollback(0)
    native._model.save_pretrained(tmp_path)
    for item in tokenizer_dir().iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    reloaded = TorchBackend(str(tmp_path), dtype="float32", impl="transformers")
    _close(reloaded.forward(_ids(8, 8)), want, "reloaded")
    reloaded.close()


def test_bfloat16_native_stays_close_to_transformers(llama_dir):
    ours = TorchBackend(llama_dir, dtype="bfloat16", impl="native")
    theirs = TorchBackend(llama_dir, dtype="bfloat16", impl="transformers")
    ids = _ids(16, 9)
    got, want = ours.forward(ids), theirs.forward(ids)
    spread = want.std().item()
    assert (got - want).abs().max().item() < 0.25 * spread  # bf16 rounds differently, nothing more
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.75
    ours.close()
    theirs.close()


# -- trees -------------------------------------------------------------------------------


# A hand-made tree after the prompt: two roots, branching at depths 1 and 2.
#        0           5
#      /   \         |
#     1     2        6
#    / \    |
#   3   4   7
TREE_PARENTS = [-1, 0, 0, 1, 1, -1, 5, 2]
TREE_TOKENS = _ids(8, 10)


def _path(node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = TREE_PARENTS[node]
    return path[::-1]


def test_tree_logits_equal_chain_logits_of_each_path(fresh):
    prompt = _ids(10, 11)
    fresh.forward(prompt, all_logits=False)
    tree_logits = fresh.forward_tree(TREE_TOKENS, TREE_PARENTS)
    tree_features = fresh.last_features()
    assert tree_logits.shape == (8, 49152) and tree_features.shape == (8, 64)
    assert fresh.tokens == prompt + TREE_TOKENS and fresh._kv.length == 18
    for node in range(len(TREE_PARENTS)):
        fresh.rollback(0)
        chain = prompt + [TREE_TOKENS[i] for i in _path(node)]
        want = fresh.forward(chain)[-1]
        _close(tree_logits[node], want, f"tree node {node}")
        _close(tree_features[node], fresh.last_features()[-1], f"features of tree node {node}")


@pytest.mark.parametrize("node", [3, 7, 6])
def test_keep_nodes_leaves_the_cache_of_the_kept_path_only(fresh, node):
    prompt = _ids(10, 11)
    fresh.forward(prompt, all_logits=False)
    fresh.forward_tree(TREE_TOKENS, TREE_PARENTS)
    path = _path(node)
    fresh.keep_nodes(path)
    kept = prompt + [TREE_TOKENS[i] for i in path]
    assert fresh.tokens == kept and fresh._kv.length == len(kept)
    after = fresh.forward([555, 556])

    fresh.rollback(0)
    want = fresh.forward(kept + [555, 556])[-2:]
    _close(after, want, f"after keeping the path to node {node}")


def test_keep_nodes_refuses_what_is_not_a_path(fresh):
    with pytest.raises(RuntimeError, match="forward_tree"):
        fresh.keep_nodes([0])
    fresh.forward(_ids(4, 12))
    fresh.forward_tree(TREE_TOKENS, TREE_PARENTS)
    with pytest.raises(ValueError, match="not a path"):
        fresh.keep_nodes([0, 2, 4])  # 4 hangs under 1, not 2
    with pytest.raises(ValueError, match="not a path"):
        fresh.keep_nodes([1, 3])  # does not start at a depth-1 node
    fresh.keep_nodes([5, 6])
    assert fresh.tokens[-2:] == [TREE_TOKENS[5], TREE_TOKENS[6]]


def test_a_tree_that_does_not_fit_is_refused_and_leaves_the_cache_alone(llama_dir):
    backend = TorchBackend(llama_dir, dtype="float32", impl="native", n_ctx=16)
    backend.forward(_ids(10, 13))
    with pytest.raises(ContextOverflowError, match="16 tokens"):
        backend.forward_tree(TREE_TOKENS, TREE_PARENTS)
    assert len(backend.tokens) == 10 == backend._kv.length
    backend.close()


# -- hidden states, the LM head, early exit -------------------------------------------------


def test_features_are_what_the_lm_head_reads(fresh):
    ids = _ids(9, 14)
    logits = fresh.forward(ids)
    features = fresh.last_features()
    assert features.shape == (9, fresh.hidden_size) and not features.is_inference()
    _close(fresh.lm_head(features), logits, "lm_head(last_features)")
    fresh.rollback(0)
    fresh.forward(ids, all_logits=False)  # a prefill: at least the last row
    _close(fresh.last_features()[-1], features[-1], "features after a prefill")


def test_hidden_states_run_batches_without_touching_the_cache(fresh, llama_dir):
    fresh.forward(_ids(5, 15))
    ids = torch.tensor([_ids(7, 16), _ids(7, 17)])
    hidden = fresh.hidden_states(ids)  # (2, 7, hidden)
    assert hidden.shape == (2, 7, 64) and fresh._kv.length == 5 and len(fresh.tokens) == 5
    theirs = TorchBackend(llama_dir, dtype="float32", impl="transformers")
    _close(hidden, theirs.hidden_states(ids), "hidden states against transformers'")
    theirs.close()
    for row in range(2):  # the same rows as a cached forward of each sequence alone
        fresh.rollback(0)
        fresh.forward(ids[row].tolist())
        _close(fresh.last_features(), hidden[row], f"hidden states of sequence {row}")


def test_early_exit_equals_the_model_cut_after_those_layers(tmp_path):
    # The factory draws weights per name: 1 layer of seed 3 is the first layer of 2 layers of seed 3.
    deep = TorchBackend(make_tiny_model(tmp_path / "deep", "llama", seed=3, n_layers=2), dtype="float32")
    shallow = TorchBackend(make_tiny_model(tmp_path / "shallow", "llama", seed=3, n_layers=1), dtype="float32")
    ids = torch.tensor(_ids(6, 18))
    with torch.inference_mode():
        early, _ = deep._native.forward(ids, deep._native.new_cache(), n_layers=1)
    _close(early.float(), shallow.forward(ids.tolist()), "first layer only")
    deep.close()
    shallow.close()


# -- choosing the implementation -----------------------------------------------------------


def test_auto_falls_back_to_transformers_and_native_says_why(tmp_path):
    windowed = make_tiny_model(tmp_path / "windowed", "mistral", sliding_window=64)
    auto = TorchBackend(windowed, dtype="float32")  # window 64 < context 2048: not native
    assert isinstance(auto, TransformersBackend) and not auto.supports_tree and auto.supports_features
    auto.forward(_ids(5, 19))
    with pytest.raises(NotImplementedError):
        auto.forward_tree(TREE_TOKENS, TREE_PARENTS)
    auto.close()
    with pytest.raises(ConfigError, match="sliding-window.*llama, mistral, qwen2, qwen3"):
        TorchBackend(windowed, dtype="float32", impl="native")
    short = TorchBackend(windowed, dtype="float32", n_ctx=64)  # the window covers the whole context
    assert isinstance(short, NativeBackend) and short.supports_tree
    short.close()
    with pytest.raises(ConfigError, match="implementation"):
        TorchBackend(windowed, impl="fast")


def test_other_architectures_run_on_transformers(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    config = GPT2Config(vocab_size=49152, n_embd=32, n_layer=1, n_head=2, n_positions=128)
    GPT2LMHeadModel(config).save_pretrained(folder)
    for item in tokenizer_dir().iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    auto = TorchBackend(str(folder), dtype="float32")
    assert isinstance(auto, TransformersBackend) and auto.forward(_ids(3, 20)).shape == (3, 49152)
    assert auto.hidden_states(torch.tensor([_ids(3, 20)])).shape == (1, 3, 32) and auto.hidden_size == 32
    auto.close()
    with pytest.raises(ConfigError, match="'gpt2'.*llama, mistral, qwen2, qwen3"):
        TorchBackend(str(folder), dtype="float32", impl="native")
    with pytest.raises(ConfigError, match="int8"):
        TorchBackend(str(folder), dtype="int8")


# -- int8 weights --------------------------------------------------------------------------


def test_int8_linear_kernel_and_fallback_agree_with_the_float_matmul():
    gen = torch.Generator().manual_seed(21)
    weight = torch.randn(96, 64, generator=gen)
    bias = torch.randn(96, generator=gen)
    x = torch.randn(5, 64, generator=gen)
    want = torch.nn.functional.linear(x, weight, bias)
    scale = want.abs().max().item()
    for dtype in (torch.float32, torch.bfloat16):
        linear = Int8Linear.quantize(weight, bias, dtype)
        assert linear.qweight.dtype == torch.int8 and linear.qweight.shape == (96, 64)
        fast = linear(x.to(dtype)).float()
        assert (fast - want).abs().max().item() < 0.03 * scale
        # An input at an odd address (the CPU kernel's loads need alignment) gives the same rows.
        odd = torch.empty(5 * 64 + 1, dtype=dtype)[1:].view(5, 64)
        odd.copy_(x)
        assert torch.equal(linear(odd), linear(x.to(dtype)))
        # A slice of the output rows, sharing the int8 tensors (what q/k/v views of a fused qkv are).
        part = linear.rows(32, 80)
        assert part.qweight.data_ptr() == linear.qweight[32:].data_ptr()
        assert torch.equal(part(x.to(dtype)), linear(x.to(dtype))[:, 32:80])
        linear.use_kernel = False  # the dequantize-then-matmul path other devices take
        slow = linear(x.to(dtype)).float()
        assert (fast - slow).abs().max().item() < 0.02 * scale


@pytest.mark.parametrize("key", ["llama-tied", "qwen2-untied"])
def test_int8_weights_stay_close_and_decode_greedily(folders, key):
    int8 = TorchBackend(folders[key], dtype="int8")
    full = TorchBackend(folders[key], dtype="float32")
    compute = pick_dtype("cpu")
    assert int8.info.dtype == f"int8 (weights) / {str(compute).removeprefix('torch.')}"
    assert int8.info.n_params == full.info.n_params
    # int8 linear weights and LM head: about a quarter of float32's bytes.
    assert int8.info.weight_bytes < 0.3 * full.info.weight_bytes

    ids = _ids(24, 22)
    got, want = int8.forward(ids), full.forward(ids)
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    error = (got - want).abs().max().item() / want.std().item()
    print(f"\n{key} int8 vs float32: top-1 agreement {agree:.2f}, max |diff| {error:.2f} logit std")
    assert agree >= 0.8
    assert error < 1.0

    def greedy(backend, steps=12):
        backend.rollback(0)
        logits = backend.forward(ids[:8], all_logits=False)
        out = []
        for _ in range(steps):
            out.append(int(logits[-1].argmax()))
            logits = backend.forward([out[-1]])
        return out

    tokens = greedy(int8)
    assert tokens == greedy(int8)  # deterministic
    # A random model's greedy text forks at the first near-tie, so judge int8's choices
    # by the float model on the same text: each is among its top 3, most are its top 1.
    full.rollback(0)
    rows = full.forward(ids[:8] + tokens)[7:-1]  # (12, V): the rows that chose each token
    ranks = [(row > row[t]).sum().item() for row, t in zip(rows, tokens)]
    assert max(ranks) < 3 and ranks.count(0) >= 9, ranks
    # The transformers model runs on the same int8 tensors (no hidden second copy).
    with torch.inference_mode():
        theirs = int8._model(input_ids=torch.tensor([ids])).logits[0].float()
    assert (theirs - got).abs().max().item() < 0.25 * want.std().item()  # bf16 rounding apart
    assert (theirs.argmax(-1) == got.argmax(-1)).float().mean().item() >= 0.75
    # Trees and features work on int8 weights too.
    int8.rollback(8)
    logits = int8.forward_tree(TREE_TOKENS, TREE_PARENTS)
    assert logits.shape == (8, 49152) and int8.last_features().shape == (8, 64)
    int8.keep_nodes([0, 2, 7])
    assert len(int8.tokens) == 11
    int8.close()
    full.close()


@pytest.mark.slow
def test_embedded_model_in_int8_follows_the_float_model(embedded_hf_dir):
    full = TorchBackend(embedded_hf_dir, dtype="float32")
    ids = full.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    logits, reply = full.forward(ids, all_logits=False), []
    while len(reply) < 12 and int(logits[-1].argmax()) not in full.eos_ids:
        reply.append(int(logits[-1].argmax()))
        logits = full.forward([reply[-1]])
    assert "Paris" in full.detokenize(reply)
    full.close()

    int8 = TorchBackend(embedded_hf_dir, dtype="int8")
    assert 130e6 < int8.info.weight_bytes < 140e6  # ~1 byte per weight (plus bf16 norms and scales)
    # On the float model's reply, int8 ranks each of its tokens first or close to it.
    rows = int8.forward(ids + reply)[len(ids) - 1 : -1]  # (len(reply), V)
    ranks = [(row > row[token]).sum().item() for row, token in zip(rows, reply)]
    assert max(ranks) < 3 and ranks.count(0) >= 0.75 * len(reply), ranks
    int8.close()


def test_int8_needs_the_native_implementation(llama_dir):
    with pytest.raises(ConfigError, match="int8.*native"):
        TorchBackend(llama_dir, dtype="int8", impl="transformers")
