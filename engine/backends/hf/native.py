"""A compact forward pass for Llama-family models, on the weights transformers loaded.

Llama, Mistral, Qwen2 and Qwen3 share one block: RMSNorm, attention with
rotary positions and grouped KV heads (Qwen2 adds q/k/v biases, Qwen3 an
RMSNorm over each query and key head), RMSNorm, SwiGLU MLP; then a final
RMSNorm and the LM head. `NativeLlama` runs that block directly with a
preallocated KV cache (`kv_cache.KVCache`), which the backend needs for what
transformers makes awkward or slow: about half the per-step Python and
dispatch work, rollback by setting a length, tree attention with an explicit
mask, the final hidden state of every row, and an early exit after L layers.

Weights are borrowed, never copied. q/k/v are fused into one (q+2kv, hidden)
matrix and gate/up into one (2*intermediate, hidden) matrix, and the
transformers modules' parameters are re-pointed at row slices of the fused
tensors, so both paths share one copy and the transformers model still runs
(and saves) as before. With int8 weights (`engine.backends.hf.quantize`) the float weights
are quantized and dropped, and the transformers model's linear layers, LM
head and embeddings are replaced by int8 modules viewing the same tensors: it
still runs (on int8 weights), but can no longer be saved as a checkpoint.
float32 weights on a CPU are the exception to "never copied": where it fits, the
forward multiplies with a oneDNN-packed copy of each linear map (`prepack`,
engine/backends/hf/packed.py), which makes a few rows cost little more than one.

Numerics follow transformers: cos/sin come from the model's own
`rotary_emb` module (rope scaling and attention scaling included; a table of
its output for static rope types), attention is `scaled_dot_product_attention`
with the default 1/sqrt(head_dim) scale, no mask for a single query row and a
boolean mask for several. Grouped-query attention folds the query heads that
share a KV head into extra query rows instead of passing enable_gqa: the same
arithmetic per row, no copy of K/V, and on CPU it keeps SDPA on its fused
kernel (a 4-D GQA call in bfloat16 or a 3-D call take the slow math path:
docs/benchmarks.md, "Measurements behind the code"). In float32 the logits match transformers to ~1e-6; in
bfloat16 they differ by rounding only (F.rms_norm, addcmul in RoPE and the
residual adds folded into addmm round once where transformers rounds twice).

This forward is eager: shapes follow the cache's length. torch.compile does not
help it as it is: wrapping `_block` in torch.compile(dynamic=True) on the 2-core CPU
took 140 s for a 30-layer toy model, recompiled per layer (the layer index and the
cache lists are guarded) until dynamo's recompile limit, and ran no faster than
eager. The static-shape path that CUDA graphs need (one stacked KV buffer indexed by
tensors, a fixed capacity, a length mask, query rows padded to buckets) is
engine/backends/hf/static.py, on these same blocks (`--compile`).

`forward(..., n_layers=L)` runs the first L layers then the final norm and
head (for a later early-exit drafter; it reads and writes the KV cache of
those layers only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.backends.hf.architectures import SUPPORTED_ARCHITECTURES
from engine.backends.hf.packed import PackedLinear
from engine.backends.hf.quantize import Int8Embedding, Int8Linear
from engine.backends.kv_cache import KVCache


def unsupported_reason(model: nn.Module, n_ctx: int) -> str | None:
    """Why the native path cannot run `model` (a transformers causal LM), or None when it can."""
    config = getattr(model, "config", None)
    arch = getattr(config, "model_type", None)
    if arch not in SUPPORTED_ARCHITECTURES:
        return f"the architecture is {arch!r}"
    if not type(model).__module__.startswith("transformers.models."):
        return f"{type(model).__name__} comes from remote code, not transformers' own {arch} implementation"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"the MLP activation is {config.hidden_act!r}, not silu"
    body = getattr(model, "model", None)
    if body is None or not all(hasattr(body, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "the model does not have the usual embed_tokens / layers / norm / rotary_emb layout"
    if not isinstance(model.get_output_embeddings(), nn.Linear) or not isinstance(body.embed_tokens, nn.Embedding):
        return "the embeddings or the LM head are not plain torch modules (quantized or patched)"
    for layer in body.layers:
        linears = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj]
        linears += [layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj]
        if not all(type(m) is nn.Linear and m.weight.is_floating_point() for m in linears):
            return "some linear layers are not plain float nn.Linear modules (quantized or patched)"
    window = _sliding_window(config)
    if window is not None and window < n_ctx:
        return (
            f"it uses sliding-window attention ({window} tokens) shorter than the context ({n_ctx} tokens); "
            f"load it with n_ctx <= {window}"
        )
    return None


def _sliding_window(config) -> int | None:
    """The window of the layers that use one, or None when every layer attends to everything."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    if config.model_type in ("qwen2", "qwen3") and not getattr(config, "use_sliding_window", False):
        return None
    return int(window)


class _Dense:
    """A float linear map on borrowed weights, for 2-D inputs (rows, in), without
    nn.Module call overhead; `add` folds a residual into the matmul (addmm)."""

    __slots__ = ("bias", "weight", "weight_t")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.weight_t = weight.t()  # (in, out) view

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return torch.mm(x, self.weight_t)
        return torch.addmm(self.bias, x, self.weight_t)

    def add(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + self(x)."""
        out = torch.addmm(residual, x, self.weight_t)
        return out if self.bias is None else out.add_(self.bias)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.weight, self.bias) if t is not None)


class _Quantized:
    """The same interface over an int8 `Int8Linear`."""

    __slots__ = ("forward", "linear")

    def __init__(self, linear: Int8Linear) -> None:
        self.linear, self.forward = linear, linear.forward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def add(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return residual + self.forward(x)

    def nbytes(self) -> int:
        return self.linear.nbytes()


class _Block:
    """One decoder layer's tensors."""

    __slots__ = ("attn_norm", "down", "gate_up", "mlp_norm", "o", "qk_norm", "qkv")
    LINEARS = ("qkv", "o", "gate_up", "down")  # its linear maps


class NativeLlama:
    """The forward pass of a transformers Llama-family model on its own (borrowed) weights."""

    def __init__(self, model: nn.Module, n_ctx: int, weights: str | None = None) -> None:
        """`weights`: None to share the float weights, "int8" to quantize the linear layers and LM head."""
        reason = unsupported_reason(model, n_ctx)
        if reason:
            raise ValueError(reason)
        config = model.config
        body = model.model
        self.n_ctx = n_ctx
        self.hidden_size = int(config.hidden_size)
        self.n_heads = int(config.num_attention_heads)
        self.n_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.n_heads)
        attn = body.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.intermediate = int(body.layers[0].mlp.gate_proj.out_features)
        self.eps = float(config.rms_norm_eps)
        self.rotary = body.rotary_emb
        rope_type = str(getattr(self.rotary, "rope_type", "default"))
        self.static_rope = "dynamic" not in rope_type and rope_type != "longrope"
        embed = body.embed_tokens.weight
        self.dtype, self.device = embed.dtype, embed.device
        self.weights = weights
        self.weight_bytes = 0  # bytes of weights read per token (the LM head and tied embeddings once)

        with torch.no_grad():
            self.blocks = [self._borrow_block(layer) for layer in body.layers]
            self.final_norm = body.norm.weight.detach()
            head = model.get_output_embeddings()
            tied = head.weight is body.embed_tokens.weight
            if weights == "int8":
                # The LM head and the embeddings (one int8 table when tied) replace the
                # transformers modules, as the int8 linear layers do.
                self.lm_head: nn.Module = Int8Linear.quantize(head.weight, head.bias, self.dtype)
                self.head = _Quantized(self.lm_head)
                self.embed = Int8Embedding(self.lm_head if tied else Int8Linear.quantize(embed, None, self.dtype))
                model.set_output_embeddings(self.lm_head)
                body.embed_tokens = self.embed
                del head, embed
            else:
                self.head = _Dense(head.weight.detach(), None if head.bias is None else head.bias.detach())
                self.embed = embed.detach()
                self.lm_head = head  # the target's own module, usable with autograd (Medusa training)
            self.weight_bytes += self.head.nbytes() + (0 if tied else _nbytes(self.embed)) + _nbytes(self.final_norm)

        self._gqa = _sdpa_supports_gqa()
        self._positions = torch.arange(n_ctx, device=self.device)  # sliced, never reallocated
        self._cos = self._sin = None  # RoPE table for positions 0..len-1 (static rope types)
        # Layers whose inputs a forward keeps (`layer_features`, for an EAGLE-3 head); () keeps none.
        self.watched: tuple[int, ...] = ()
        self.layer_features: torch.Tensor | None = None

    # -- building ------------------------------------------------------------------------

    def _borrow_block(self, layer: nn.Module) -> _Block:
        attn, mlp = layer.self_attn, layer.mlp
        block = _Block()
        block.attn_norm = layer.input_layernorm.weight.detach()
        block.mlp_norm = layer.post_attention_layernorm.weight.detach()
        block.qkv = self._linear(attn, ["q_proj", "k_proj", "v_proj"])
        block.o = self._linear(attn, ["o_proj"])
        block.gate_up = self._linear(mlp, ["gate_proj", "up_proj"])
        block.down = self._linear(mlp, ["down_proj"])
        block.qk_norm = None
        if hasattr(attn, "q_norm"):  # qwen3: RMSNorm over each head of q and k, before RoPE
            q_w, k_w = attn.q_norm.weight.detach(), attn.k_norm.weight.detach()
            block.qk_norm = torch.cat([q_w.expand(self.n_heads, -1), k_w.expand(self.n_kv_heads, -1)])
            self.weight_bytes += _nbytes(q_w) + _nbytes(k_w)
        self.weight_bytes += _nbytes(block.attn_norm) + _nbytes(block.mlp_norm)
        return block

    def _linear(self, parent: nn.Module, names: list[str]):
        """One linear map over the concatenated outputs of parent's linear modules `names`.

        The transformers modules are then re-pointed at row slices of the fused
        weights (float), or replaced by Int8Linear views of them (int8), so that
        both paths share one copy and the transformers model still runs.
        """
        modules = [getattr(parent, name) for name in names]
        weights = [m.weight.detach() for m in modules]
        biases = [None if m.bias is None else m.bias.detach() for m in modules]
        fused_w = weights[0] if len(modules) == 1 else torch.cat(weights)
        fused_b = None
        if any(b is not None for b in biases):
            parts = [b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)]
            fused_b = parts[0] if len(parts) == 1 else torch.cat(parts)
        if self.weights == "int8":
            fused = Int8Linear.quantize(fused_w, fused_b, self.dtype)
            del fused_w, weights
        start = 0
        for name, m, b in zip(names, modules, biases):
            rows = slice(start, start + m.out_features)
            start = rows.stop
            if self.weights == "int8":
                part = fused.rows(rows.start, rows.stop)
                if b is None:
                    part.bias = None
                setattr(parent, name, part)
            elif len(modules) > 1:
                m.weight = nn.Parameter(fused_w[rows], requires_grad=m.weight.requires_grad)
                if b is not None:
                    m.bias = nn.Parameter(fused_b[rows], requires_grad=m.bias.requires_grad)
        linear = _Quantized(fused) if self.weights == "int8" else _Dense(fused_w, fused_b)
        self.weight_bytes += linear.nbytes()
        return linear

    def prepack(self) -> None:
        """Multiply every float linear map (the blocks' and the LM head) with a oneDNN-packed
        copy of its weight from now on (packed.py: float32 on a CPU; the caller checked it fits).
        The copy is taken now: a weight changed in place later is not seen until this runs again."""
        for block in self.blocks:
            for name in _Block.LINEARS:
                dense = getattr(block, name)
                setattr(block, name, PackedLinear(dense.weight, dense.bias))
        self.head = PackedLinear(self.head.weight, self.head.bias)

    def linear_bytes(self) -> int:
        """Bytes of the float linear maps' weights: what a packed copy of them takes."""
        blocks = sum(getattr(block, name).nbytes() for block in self.blocks for name in _Block.LINEARS)
        return blocks + self.head.nbytes()

    def new_cache(self) -> KVCache:
        return KVCache(len(self.blocks), self.n_kv_heads, self.head_dim, self.n_ctx, self.dtype, self.device)

    # -- running -------------------------------------------------------------------------

    def forward(
        self,
        ids: torch.Tensor,
        cache: KVCache,
        offsets: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        last_only: bool = False,
        n_layers: int | None = None,
        start_layer: int = 0,
        hidden: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `ids` (n,) after the cache's `length` rows; return (logits, features).

        A chain by default: row i sits at position length + i and attends to
        every earlier row. Otherwise `offsets` (n,) places row i at position
        length + offsets[i] (a tree node at depth d: d - 1) and `mask` (n, n)
        bool says which of the new rows it attends to (a tree: itself and its
        ancestors); every row attends to all cached rows. Logits (n or 1, V)
        are in the model's dtype; features, the final-norm hidden states of
        every new row (n, hidden), too. The cache's length grows by n.

        Early exit: `n_layers` stops after that many layers; `start_layer` with
        `hidden` (n, hidden), the residual stream after layer start_layer - 1,
        starts there instead of at the embeddings, the cache already holding the
        first layers' keys and values for these rows. `self.residual` is the
        residual stream after the last layer run (before the final norm);
        `self.layer_features` the inputs of the `watched` layers (run_layers).
        """
        n = ids.shape[0]
        start = cache.length
        end = start + n
        cache.reserve(end)
        cos, sin, group_mask = self.placement(start, n, offsets, mask)

        def attend(layer: int, q, kv):
            return self._attend_cached(layer, q, kv, cache, start, group_mask)

        x = self._embed(ids) if hidden is None else hidden  # (n, hidden)
        x, self.layer_features = self.run_layers(x, start_layer, len(self.blocks[:n_layers]), cos, sin, attend)
        self.residual = x
        cache.length = end
        features = F.rms_norm(x, (self.hidden_size,), self.final_norm, self.eps)  # (n, hidden)
        return self.head(features[-1:] if last_only else features), features

    def placement(self, start: int, n: int, offsets: torch.Tensor | None, mask: torch.Tensor | None):
        """Where n new rows after `start` cached ones sit and what they see: cos, sin (n, 1, head_dim)
        and the attention mask over the cache and the new rows with the query heads that share a KV
        head folded in (groups * n, start + n), or None for one chain row (it sees everything).
        A chain without `offsets`; else row i at start + offsets[i], seeing new row j where mask[i, j]."""
        end = start + n
        if offsets is None:
            cos, sin = self._rope(start, end)  # (n, 1, head_dim)
            # One row attends to everything cached: no mask. Several rows: causal.
            mask = None if n == 1 else self._positions[:end] <= self._positions[start:end, None]  # (n, end)
        else:
            cos, sin = self._rope(start, end, offsets + start)
            new_rows = mask
            mask = torch.ones(n, end, dtype=torch.bool, device=self.device)
            mask[:, start:] = new_rows
        group_mask = None if mask is None else mask.repeat(self.n_heads // self.n_kv_heads, 1)  # (groups * n, end)
        return cos, sin, group_mask

    @torch.no_grad()
    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states (B, T, hidden) of sequences run causally from position 0, without a cache."""
        batch, length = input_ids.shape
        x = self._embed(input_ids.flatten())  # (B * T, hidden)
        positions = torch.arange(length, device=self.device)
        cos, sin = self.rotary(x, positions[None])  # (1, T, head_dim)
        cos, sin = cos[0, :, None].repeat(batch, 1, 1), _sign_first_half(sin[0, :, None]).repeat(batch, 1, 1)

        def attend(layer: int, q, kv):
            return self._attend_causal(batch, q, kv)

        for index, block in enumerate(self.blocks):
            x = self._block(index, block, x, cos, sin, attend)
        return F.rms_norm(x, (self.hidden_size,), self.final_norm, self.eps).unflatten(0, (batch, length))

    def run_layers(self, x: torch.Tensor, first: int, stop: int, cos, sin, attend):
        """Layers first..stop-1 on x (rows, hidden): (x after them, the inputs of the `watched`
        layers concatenated in layer order (rows, len(watched) * hidden), or None when none are
        watched or some of them were not run)."""
        taken = []
        for index in range(first, stop):
            if index in self.watched:
                taken.append(x)  # each block returns a new tensor: this one is never written again
            x = self._block(index, self.blocks[index], x, cos, sin, attend)
        complete = bool(self.watched) and len(taken) == len(self.watched)
        return x, (torch.cat(taken, dim=-1) if complete else None)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) if isinstance(self.embed, Int8Embedding) else F.embedding(ids, self.embed)

    def _rope(self, start: int, end: int, positions: torch.Tensor | None = None):
        """cos, sin (n, 1, head_dim) for positions start..end-1 (a chain) or `positions`
        (a tree), from the model's own rotary module."""
        if not self.static_rope:  # frequencies depend on the length seen: compute per call, as transformers does
            if positions is None:
                positions = self._positions[start:end]
            cos, sin = self.rotary(self.final_norm, positions[None])
            return cos[0, :, None], _sign_first_half(sin[0, :, None])
        if self._cos is None or self._cos.shape[0] < end:
            # A table of the rotary module's output for positions 0..size-1: for
            # static rope types, element for element what it returns for any of them.
            size = min(self.n_ctx, max(end, 2 * (0 if self._cos is None else self._cos.shape[0]), 256))
            cos, sin = self.rotary(self.final_norm, self._positions[:size][None])
            self._cos, self._sin = cos[0, :, None], _sign_first_half(sin[0, :, None])  # (size, 1, head_dim)
        if positions is None:
            return self._cos[start:end], self._sin[start:end]  # views: no copy
        return self._cos[positions], self._sin[positions]

    def _block(self, index: int, block: _Block, x: torch.Tensor, cos, sin, attend) -> torch.Tensor:
        """Decoder layer `index` on x (rows, hidden). `attend(index, q, kv)` takes
        q (rows, heads, head_dim) and the new keys then values (rows, 2 * kv_heads,
        head_dim) and returns the attention output (rows, heads * head_dim)."""
        heads, kv_heads, dim = self.n_heads, self.n_kv_heads, self.head_dim
        h = F.rms_norm(x, (self.hidden_size,), block.attn_norm, self.eps)
        qkv = block.qkv(h).unflatten(-1, (heads + 2 * kv_heads, dim))  # (rows, heads + 2 kv_heads, dim)
        qk = qkv[:, : heads + kv_heads]
        if block.qk_norm is not None:
            qk = F.rms_norm(qk, (dim,), None, self.eps) * block.qk_norm
        # RoPE on q and k at once: x * cos + rotate_half(x) * sin, where rotate_half(x) =
        # (-x2, x1) for the halves x1, x2; `sin` comes with its first half negated, so
        # swapping the halves is all that is left to do here. The result goes back into
        # qkv, so that keys and values stay side by side for one copy into the cache.
        swapped = qk.unflatten(-1, (2, dim // 2)).flip(-2).flatten(-2)
        torch.addcmul(qk * cos, swapped, sin, out=qkv[:, : heads + kv_heads])
        out = attend(index, qkv[:, :heads], qkv[:, heads:])  # (rows, heads * dim)
        x = block.o.add(x, out)  # x + o(out)
        h = F.rms_norm(x, (self.hidden_size,), block.mlp_norm, self.eps)
        gate_up = block.gate_up(h)
        return block.down.add(x, F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :])

    def _attend_cached(self, layer: int, q, kv, cache: KVCache, start: int, group_mask) -> torch.Tensor:
        """Store the new keys and values in the cache and attend over it. The query
        heads that share a KV head are folded into rows, (kv_heads, groups * n, dim):
        plain multi-head attention for scaled_dot_product_attention (its fused CPU
        kernel; a GQA call takes a slow path), the same per-row arithmetic, and a
        view when n == 1."""
        n = q.shape[0]
        kv_heads, groups, dim = self.n_kv_heads, self.n_heads // self.n_kv_heads, self.head_dim
        keys, values = cache.write(layer, start, kv.transpose(0, 1))  # (kv_heads, end, dim) each
        q = q.view(n, kv_heads, groups, dim).permute(1, 2, 0, 3).reshape(1, kv_heads, groups * n, dim)
        out = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=group_mask)
        return out.view(kv_heads, groups, n, dim).permute(2, 0, 1, 3).reshape(n, self.n_heads * dim)

    def _attend_causal(self, batch: int, q, kv) -> torch.Tensor:
        """Causal attention of `batch` equal-length sequences laid out as rows (batch * T, ...)."""
        k, v = kv[:, : self.n_kv_heads], kv[:, self.n_kv_heads :]
        q, k, v = (t.unflatten(0, (batch, -1)).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, dim)
        if self._gqa:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            groups = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).flatten(0, 1).flatten(1)  # (B * T, heads * dim)


def _sign_first_half(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated: rotate_half's minus sign, applied once per table."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _nbytes(t) -> int:
    if isinstance(t, Int8Embedding):
        return t.linear.nbytes()
    return t.numel() * t.element_size()


_GQA: bool | None = None


def _sdpa_supports_gqa() -> bool:
    """Whether this torch's scaled_dot_product_attention takes enable_gqa (2.5+)."""
    global _GQA
    if _GQA is None:
        q = torch.zeros(2, 1, 4)
        kv = torch.zeros(1, 1, 4)
        try:
            F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
            _GQA = True
        except (TypeError, RuntimeError):
            _GQA = False
    return _GQA
