"""GGUF files of real hybrid and sliding-window architectures, tiny and random, for tests.

Each writer builds a few layers of one llama.cpp architecture with random float32 weights and
SmolLM2's tokenizer (as `make_tiny_gguf` does), so the files share the vocabulary of the
embedded default model and of each other: one can draft for another. The hyper-parameter keys
and tensor shapes are the ones llama.cpp's loader reads for that architecture (src/llama-model.cpp),
checked by loading them with the llama.cpp that llama-cpp-python 0.3.36 bundles:

- `qwen35` (Qwen3.5 / 3.6): gated delta net layers with one full-attention layer in every
  `full_attention_interval`;
- `lfm2` (LFM2): short-convolution layers where the per-layer KV head count is 0, attention elsewhere;
- `nemotron_h` (Nemotron-H): Mamba 2 layers, an MLP-only layer and an attention layer;
- `granitehybrid` (Granite 4 hybrids): Mamba 2 layers and an attention layer, each with a feed-forward;
- `mamba2`: recurrent only, no attention at all;
- `gemma3`: sliding-window attention on most layers, a window shorter than a test prompt;
- `gemma4` (Gemma 4 text): the same with a sliding-window pattern, soft-capped logits.

Shapes are written as numpy (rows, cols) = ggml's {cols, rows}.
"""

from __future__ import annotations

import numpy as np
from gguf import GGUFWriter, LlamaFileType

from tests.factories.gguf_models import _add_tokenizer, _smollm2_tokenizer

N_EMBD = 64
N_FF = 128
N_HEAD = 4
HEAD_DIM = 16


class _Weights:
    """Random matrices with a spread that keeps activations O(1) through a few layers."""

    def __init__(self, writer: GGUFWriter, seed: int, mix: float) -> None:
        self.writer = writer
        self.rng = np.random.default_rng(seed)
        self.mix = mix  # scale of the matrices that write into the residual stream

    def out(self, name: str, rows: int, cols: int) -> None:
        """A matrix that adds to the residual stream: `mix` sets how far the layers move the
        embedding of the input token, so how often the model predicts that token again."""
        self.matrix(name, rows, cols, self.mix / np.sqrt(cols))

    def matrix(self, name: str, rows: int, cols: int, scale: float | None = None) -> None:
        scale = 1.0 / np.sqrt(cols) if scale is None else scale
        data = (self.rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float32)
        self.writer.add_tensor(name, data)

    def full(self, name: str, shape: tuple[int, ...], value: float) -> None:
        self.writer.add_tensor(name, np.full(shape, value, dtype=np.float32))

    def vector(self, name: str, n: int, value: float | None = None, scale: float = 0.5) -> None:
        if value is None:
            data = (self.rng.standard_normal(n, dtype=np.float32) * scale).astype(np.float32)
        else:
            data = np.full(n, value, dtype=np.float32)
        self.writer.add_tensor(name, data)


def _start(
    path: str, arch: str, seed: int, n_layers: int, context_length: int, mix: float, feed_forward: bool = True
) -> tuple[GGUFWriter, _Weights]:
    tokenizer = _smollm2_tokenizer()
    writer = GGUFWriter(path, arch=arch)
    writer.add_name(f"tiny-random-{arch}-seed{seed}")
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_block_count(n_layers)
    writer.add_context_length(context_length)
    writer.add_embedding_length(N_EMBD)
    if feed_forward:  # else the architecture writes one per layer
        writer.add_feed_forward_length(N_FF)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokenizer["tokenizer.ggml.tokens"]))
    _add_tokenizer(writer, tokenizer, with_chat_template=True)
    weights = _Weights(writer, seed, mix)
    weights.matrix("token_embd.weight", len(tokenizer["tokenizer.ggml.tokens"]), N_EMBD, 2.0 / np.sqrt(N_EMBD))
    return writer, weights


def _finish(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _ffn(w: _Weights, block: str) -> None:
    w.matrix(f"{block}.ffn_gate.weight", N_FF, N_EMBD)
    w.matrix(f"{block}.ffn_up.weight", N_FF, N_EMBD)
    w.out(f"{block}.ffn_down.weight", N_EMBD, N_FF)


def make_qwen35_gguf(
    path: str,
    *,
    seed: int = 0,
    n_layers: int = 4,
    context_length: int = 2048,
    mix: float = 1.0,
    d_state: int = 16,
    n_v_heads: int = 4,
) -> str:
    """A Qwen3.5 hybrid: layers 0-2 gated delta nets, layer 3 full attention (interval 4).
    `d_state` and `n_v_heads` set the size of the recurrent state: Qwen3.5's own are 128 and 16
    to 64 (a state of n_v_heads x d_state x d_state floats per delta-net layer)."""
    writer, w = _start(path, "qwen35", seed, n_layers, context_length, mix)
    n_head_kv = 2
    n_k_heads, d_conv = 2, 4
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_dimension_sections([2, 3, 3, 0])  # text only: all three axes see the same position
    writer.add_rope_freq_base(100000.0)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(value_dim)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(n_v_heads)
    writer.add_ssm_group_count(n_k_heads)
    writer.add_full_attention_interval(4)

    w.vector("output_norm.weight", N_EMBD, 1.0)
    for i in range(n_layers):
        block = f"blk.{i}"
        w.vector(f"{block}.attn_norm.weight", N_EMBD, 1.0)
        w.vector(f"{block}.post_attention_norm.weight", N_EMBD, 1.0)
        if (i + 1) % 4 == 0:  # full attention; q carries a gate of the same size
            w.matrix(f"{block}.attn_q.weight", 2 * N_HEAD * HEAD_DIM, N_EMBD)
            w.matrix(f"{block}.attn_k.weight", n_head_kv * HEAD_DIM, N_EMBD)
            w.matrix(f"{block}.attn_v.weight", n_head_kv * HEAD_DIM, N_EMBD)
            w.out(f"{block}.attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
            w.vector(f"{block}.attn_q_norm.weight", HEAD_DIM, 1.0)
            w.vector(f"{block}.attn_k_norm.weight", HEAD_DIM, 1.0)
        else:  # gated delta net
            w.matrix(f"{block}.attn_qkv.weight", 2 * key_dim + value_dim, N_EMBD)
            w.matrix(f"{block}.attn_gate.weight", value_dim, N_EMBD)
            w.matrix(f"{block}.ssm_conv1d.weight", 2 * key_dim + value_dim, d_conv, 0.5)
            w.vector(f"{block}.ssm_dt.bias", n_v_heads)
            w.vector(f"{block}.ssm_a", n_v_heads, -1.0)
            w.matrix(f"{block}.ssm_beta.weight", n_v_heads, N_EMBD)
            w.matrix(f"{block}.ssm_alpha.weight", n_v_heads, N_EMBD)
            w.vector(f"{block}.ssm_norm.weight", d_state, 1.0)
            w.out(f"{block}.ssm_out.weight", N_EMBD, value_dim)
        _ffn(w, block)
    _finish(writer)
    return str(path)


def make_lfm2_gguf(path: str, *, seed: int = 0, n_layers: int = 4, context_length: int = 2048, mix: float = 1.0) -> str:
    """An LFM2 hybrid: short-convolution layers 0, 1 and 3, attention on layer 2."""
    writer, w = _start(path, "lfm2", seed, n_layers, context_length, mix)
    attention = {2}
    l_cache = 3
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv([2 if i in attention else 0 for i in range(n_layers)])
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(100000.0)
    writer.add_shortconv_l_cache(l_cache)

    w.vector("token_embd_norm.weight", N_EMBD, 1.0)  # LFM2's final norm has this name
    for i in range(n_layers):
        block = f"blk.{i}"
        w.vector(f"{block}.attn_norm.weight", N_EMBD, 1.0)
        w.vector(f"{block}.ffn_norm.weight", N_EMBD, 1.0)
        if i in attention:
            w.matrix(f"{block}.attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
            w.matrix(f"{block}.attn_k.weight", 2 * HEAD_DIM, N_EMBD)
            w.matrix(f"{block}.attn_v.weight", 2 * HEAD_DIM, N_EMBD)
            w.out(f"{block}.attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
            w.vector(f"{block}.attn_q_norm.weight", HEAD_DIM, 1.0)
            w.vector(f"{block}.attn_k_norm.weight", HEAD_DIM, 1.0)
        else:
            w.matrix(f"{block}.shortconv.in_proj.weight", 3 * N_EMBD, N_EMBD)
            w.matrix(f"{block}.shortconv.conv.weight", N_EMBD, l_cache, 0.5)
            w.out(f"{block}.shortconv.out_proj.weight", N_EMBD, N_EMBD)
        _ffn(w, block)
    _finish(writer)
    return str(path)


def make_gemma3_gguf(
    path: str,
    *,
    seed: int = 0,
    n_layers: int = 3,
    sliding_window: int = 4,
    context_length: int = 2048,
    mix: float = 1.0,
) -> str:
    """A Gemma 3: sliding-window attention over the last `sliding_window` tokens on every layer
    here (Gemma 3 makes one layer in six global; these files have fewer)."""
    writer, w = _start(path, "gemma3", seed, n_layers, context_length, mix)
    n_head_kv = 2
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(100000.0)
    writer.add_sliding_window(sliding_window)

    w.vector("output_norm.weight", N_EMBD, 1.0)
    for i in range(n_layers):
        block = f"blk.{i}"
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            w.vector(f"{block}.{norm}.weight", N_EMBD, 1.0)
        w.matrix(f"{block}.attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
        w.matrix(f"{block}.attn_k.weight", n_head_kv * HEAD_DIM, N_EMBD)
        w.matrix(f"{block}.attn_v.weight", n_head_kv * HEAD_DIM, N_EMBD)
        w.out(f"{block}.attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
        w.vector(f"{block}.attn_q_norm.weight", HEAD_DIM, 1.0)
        w.vector(f"{block}.attn_k_norm.weight", HEAD_DIM, 1.0)
        _ffn(w, block)
    _finish(writer)
    return str(path)


def make_gemma4_gguf(
    path: str,
    *,
    seed: int = 0,
    n_layers: int = 3,
    sliding_window: int = 4,
    context_length: int = 2048,
    mix: float = 1.0,
) -> str:
    """A Gemma 4 text model: Gemma 3's layer with sliding-window attention on two layers in three
    (`sliding_window_pattern`), the keys and values of each layer its own (no shared KV layers), no
    per-layer input embeddings, and the final logits soft-capped."""
    writer, w = _start(path, "gemma4", seed, n_layers, context_length, mix)
    n_head_kv = 2
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_uint32("gemma4.attention.key_length_swa", HEAD_DIM)
    writer.add_uint32("gemma4.attention.value_length_swa", HEAD_DIM)
    writer.add_rope_freq_base(100000.0)
    writer.add_sliding_window(sliding_window)
    writer.add_array("gemma4.attention.sliding_window_pattern", [i % 3 != 2 for i in range(n_layers)])
    writer.add_uint32("gemma4.embedding_length_per_layer_input", 0)
    writer.add_uint32("gemma4.attention.shared_kv_layers", 0)
    writer.add_float32("gemma4.final_logit_softcapping", 30.0)

    w.vector("output_norm.weight", N_EMBD, 1.0)
    w.full("rope_freqs.weight", (HEAD_DIM // 2,), 1.0)  # the full-attention layers' rope: every frequency as is
    for i in range(n_layers):
        block = f"blk.{i}"
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            w.vector(f"{block}.{norm}.weight", N_EMBD, 1.0)
        w.matrix(f"{block}.attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
        w.matrix(f"{block}.attn_k.weight", n_head_kv * HEAD_DIM, N_EMBD)
        w.matrix(f"{block}.attn_v.weight", n_head_kv * HEAD_DIM, N_EMBD)
        w.out(f"{block}.attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
        w.vector(f"{block}.attn_q_norm.weight", HEAD_DIM, 1.0)
        w.vector(f"{block}.attn_k_norm.weight", HEAD_DIM, 1.0)
        _ffn(w, block)
    _finish(writer)
    return str(path)


# Mamba 2 sizes shared by nemotron_h and mamba2: 8 heads of 16 channels, 2 groups, a 16-wide state.
_D_STATE, _N_GROUP, _N_SSM_HEAD, _D_CONV = 16, 2, 8, 4
_D_INNER = 2 * N_EMBD


def _mamba2_hparams(writer: GGUFWriter) -> None:
    writer.add_ssm_conv_kernel(_D_CONV)
    writer.add_ssm_inner_size(_D_INNER)
    writer.add_ssm_state_size(_D_STATE)
    writer.add_ssm_time_step_rank(_N_SSM_HEAD)
    writer.add_ssm_group_count(_N_GROUP)


def _mamba2_layer(w: _Weights, block: str) -> None:
    conv_dim = _D_INNER + 2 * _N_GROUP * _D_STATE
    w.matrix(f"{block}.ssm_in.weight", 2 * _D_INNER + 2 * _N_GROUP * _D_STATE + _N_SSM_HEAD, N_EMBD)
    w.matrix(f"{block}.ssm_conv1d.weight", conv_dim, _D_CONV, 0.5)
    w.vector(f"{block}.ssm_conv1d.bias", conv_dim)
    w.vector(f"{block}.ssm_dt.bias", _N_SSM_HEAD)
    w.full(f"{block}.ssm_a", (_N_SSM_HEAD, 1), -1.0)  # decay: A < 0
    w.matrix(f"{block}.ssm_d", _N_SSM_HEAD, 1)
    w.full(f"{block}.ssm_norm.weight", (_N_GROUP, _D_INNER // _N_GROUP), 1.0)
    w.out(f"{block}.ssm_out.weight", N_EMBD, _D_INNER)


def make_nemotron_h_gguf(path: str, *, seed: int = 0, context_length: int = 2048, mix: float = 1.0) -> str:
    """A Nemotron-H hybrid: Mamba 2 layers 0 and 3, an MLP layer 1, attention on layer 2 (a layer is
    Mamba where both its KV head count and its feed-forward length are 0)."""
    kinds = ("mamba", "mlp", "attention", "mamba")
    writer, w = _start(path, "nemotron_h", seed, len(kinds), context_length, mix, feed_forward=False)
    n_head_kv = 2
    writer.add_head_count(N_HEAD)  # one count, as converted files have; the KV head count says which layer
    writer.add_head_count_kv([n_head_kv if kind == "attention" else 0 for kind in kinds])
    writer.add_feed_forward_length([N_FF if kind == "mlp" else 0 for kind in kinds])
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_eps(1e-5)  # read besides the RMS epsilon
    _mamba2_hparams(writer)

    w.vector("output_norm.weight", N_EMBD, 1.0)
    for i, kind in enumerate(kinds):
        block = f"blk.{i}"
        w.vector(f"{block}.attn_norm.weight", N_EMBD, 1.0)
        if kind == "mamba":
            _mamba2_layer(w, block)
        elif kind == "attention":
            w.matrix(f"{block}.attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
            w.matrix(f"{block}.attn_k.weight", n_head_kv * HEAD_DIM, N_EMBD)
            w.matrix(f"{block}.attn_v.weight", n_head_kv * HEAD_DIM, N_EMBD)
            w.out(f"{block}.attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
        else:
            w.matrix(f"{block}.ffn_up.weight", N_FF, N_EMBD)
            w.out(f"{block}.ffn_down.weight", N_EMBD, N_FF)
    _finish(writer)
    return str(path)


def make_granite_hybrid_gguf(path: str, *, seed: int = 0, context_length: int = 2048, mix: float = 1.0) -> str:
    """A Granite 4 hybrid (`granitehybrid`): Mamba 2 layers with attention on layer 1, a dense
    feed-forward after every mixer, and Granite's scales (embedding, residual, attention, logits)
    at their neutral values."""
    kinds = ("mamba", "attention", "mamba", "mamba")
    writer, w = _start(path, "granitehybrid", seed, len(kinds), context_length, mix)
    n_head_kv = 2
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv([n_head_kv if kind == "attention" else 0 for kind in kinds])
    writer.add_embedding_scale(1.0)
    writer.add_residual_scale(1.0)
    writer.add_attention_scale(1.0 / HEAD_DIM**0.5)
    writer.add_logit_scale(1.0)
    _mamba2_hparams(writer)
    w.vector("output_norm.weight", N_EMBD, 1.0)
    for i, kind in enumerate(kinds):
        block = f"blk.{i}"
        w.vector(f"{block}.attn_norm.weight", N_EMBD, 1.0)
        if kind == "mamba":
            _mamba2_layer(w, block)
        else:
            w.matrix(f"{block}.attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
            w.matrix(f"{block}.attn_k.weight", n_head_kv * HEAD_DIM, N_EMBD)
            w.matrix(f"{block}.attn_v.weight", n_head_kv * HEAD_DIM, N_EMBD)
            w.out(f"{block}.attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
        w.vector(f"{block}.ffn_norm.weight", N_EMBD, 1.0)
        _ffn(w, block)
    _finish(writer)
    return str(path)


def make_mamba2_gguf(
    path: str, *, seed: int = 0, n_layers: int = 3, context_length: int = 2048, mix: float = 1.0
) -> str:
    """A Mamba 2: recurrent layers only, no attention and no KV cache at all."""
    writer, w = _start(path, "mamba2", seed, n_layers, context_length, mix, feed_forward=False)
    _mamba2_hparams(writer)
    w.vector("output_norm.weight", N_EMBD, 1.0)
    for i in range(n_layers):
        w.vector(f"blk.{i}.attn_norm.weight", N_EMBD, 1.0)
        _mamba2_layer(w, f"blk.{i}")
    _finish(writer)
    return str(path)
