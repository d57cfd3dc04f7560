"""A Hugging Face transformers model as a `Backend`.

It loads a local folder (config.json + safetensors + tokenizer files) or a GGUF
file, which transformers unpacks into dense weights of the chosen dtype (slow
to load: its reader parses the file three times; prefer the llama.cpp backend
for GGUF files). Everything runs offline: nothing is ever downloaded.

Two implementations run the loaded model (`impl`):

- "native" (`native_llama.NativeLlama`, for llama, mistral, qwen2 and qwen3):
  our own forward pass on the same weights, with a preallocated KV cache
  (rollback sets a length), token trees (`forward_tree` / `keep_nodes`), the
  final hidden states (`last_features`) and optional int8 weights.
- "transformers": the model's own forward with one `DynamicCache`, rolled back
  with `crop`; any architecture transformers knows, chains only.

"auto" (the default) takes native where it applies and transformers elsewhere.

Written against transformers 5.x, where the model's cache argument is named
`cache` (5.24; `past_key_values` before, still accepted until 5.40), positions
follow from the cache length (there is no `cache_position`), and
`DynamicCache.crop` only takes a negative number of tokens to remove.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from contextlib import contextmanager

import torch

from engine.backends.hf.device import dtype_name, pick_device, pick_dtype, weight_format
from engine.errors import ConfigError, ContextOverflowError, ModelLoadError, ModelNotFoundError
from engine.models.memory_errors import model_out_of_memory, out_of_memory, release_frames, unexplained_allocation_failure
from engine.models.pickled_code import convert_model_folder, is_refused_pickle, pickle_files, refused_pickle_error, short_reason
from engine.core.tree import ancestor_mask, check_parents, depths
from engine.backends.capabilities import HiddenFeatures, LayerExit, ModelParts, TreeForward
from engine.backends.base import Backend, LoadProgress, ModelInfo, finite_rows
from engine.backends.hf.native import SUPPORTED_ARCHITECTURES, NativeLlama, unsupported_reason

logger = logging.getLogger(__name__)
IMPLEMENTATIONS = ("auto", "native", "transformers")

# Longest slice of a prompt run through the model at once: bounds the memory of a
# long prefill (activations and attention scores grow with the slice length).
PREFILL_CHUNK = 512

_PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TorchBackend(Backend):
    """One transformers causal LM with a KV cache for one sequence."""

    name = "torch"

    def __init__(
        self,
        path: str,
        *,
        gguf_file: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        n_ctx: int | None = None,
        name: str | None = None,
        trust_remote_code: bool = False,
        impl: str = "auto",
        progress: LoadProgress | None = None,
    ) -> None:
        """`dtype` "int8" keeps the linear weights in int8 (native implementation only)
        and computes in the device's default dtype. `impl`: "auto", "native" or "transformers".
        `progress` hears the phases of the load (transformers reports nothing finer)."""
        super().__init__()
        if n_ctx is not None and n_ctx < 1:
            raise ConfigError(f"The context size must be a positive number of tokens, got {n_ctx}.")
        if impl not in IMPLEMENTATIONS:
            raise ConfigError(f"Unknown implementation {impl!r}: choose one of {', '.join(IMPLEMENTATIONS)}.")
        self._device = pick_device(device)
        self._dtype = pick_dtype(self._device, dtype)
        weights = weight_format(dtype)  # "int8" or None (float weights in self._dtype)
        if weights and impl == "transformers":
            raise ConfigError(
                "int8 weights need the native implementation; use impl='auto' or 'native', or a float dtype."
            )
        folder, gguf_file = _resolve_location(os.fspath(path), gguf_file)
        self._path = os.path.join(folder, gguf_file) if gguf_file else folder
        display = name or os.path.basename(os.path.normpath(self._path))

        report = progress or (lambda message, fraction: None)
        self._model, self._tok = _load(folder, gguf_file, self._dtype, self._device, trust_remote_code, n_ctx, report)
        self._native: NativeLlama | None = None
        self._kv = None  # the native path's KVCache
        self._features: torch.Tensor | None = None  # last_features() of the native path
        # Final-norm hidden states of every cached position (native path), row i for
        # self.tokens[i]: what EAGLE's head reads. Grown by doubling, like the KV cache.
        self._feature_store: torch.Tensor | None = None
        config = self._model.config.get_text_config()

        # Facts the UI and the decode loop ask for, computed once (before int8
        # quantization replaces the float weights).
        params = list(self._model.parameters())  # shared (tied) tensors appear once
        out_emb = self._model.get_output_embeddings()
        vocab = out_emb.weight.shape[0] if out_emb is not None else config.vocab_size
        context = _context_length(config, self._tok)
        if n_ctx is not None and not 1 <= n_ctx <= context:
            self.close()
            raise ConfigError(
                f"The context size must be between 1 and {context} tokens for {display} "
                f"(the length it was trained for), got {n_ctx}."
            )
        self._n_ctx = n_ctx or context
        n_params = sum(p.numel() for p in params)
        weight_bytes = sum(p.numel() * p.element_size() for p in params)
        del params
        self._hidden_size = int(getattr(config, "hidden_size", 0) or 0)

        try:
            report("Building the forward pass", 0.9)
            self._native = self._make_native(impl, weights, display)
        except BaseException:
            self.close()
            raise
        if self._native is not None:
            weight_bytes = self._native.weight_bytes
            self._kv = self._native.new_cache()
        self.supports_tree = self.supports_features = self._native is not None
        # Trees, features and early exit need the native forward; transformers' own has the model's parts only.
        self.capabilities = frozenset({TreeForward, HiddenFeatures, LayerExit, ModelParts} if self._native is not None
                                      else {ModelParts})  # fmt: skip
        self._info = ModelInfo(
            name=display,
            path=self._path,
            backend="torch",
            architecture=str(getattr(config, "model_type", "unknown")),
            n_params=n_params,
            weight_bytes=weight_bytes,
            vocab_size=int(vocab),
            n_layers=int(getattr(config, "num_hidden_layers", 0) or 0),
            context_length=context,
            dtype=f"int8 (weights) / {dtype_name(self._dtype)}" if weights else dtype_name(self._dtype),
            device=self._device,
        )
        self._eos = _eos_ids(self._model, self._tok)
        self._added_ids = frozenset(self._tok.added_tokens_decoder)  # control tokens etc.
        self._byte_level = _is_byte_level(self._tok)

        # The model's forward names its cache argument differently across
        # versions and in remote code; look it up once, not on every step.
        params_of_forward = inspect.signature(self._model.forward).parameters
        self._cache_kw = "cache" if "cache" in params_of_forward else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params_of_forward
        self._cache, self._exact_crop = self._new_cache() if self._native is None else (None, True)

    def _make_native(self, impl: str, weights: str | None, display: str) -> NativeLlama | None:
        """The native implementation when `impl` allows it and the model is supported, else None."""
        if impl == "transformers":
            return None
        reason = unsupported_reason(self._model, self._n_ctx)
        if reason is not None:
            if impl == "native" or weights:
                what = "int8 weights need" if weights else "impl='native' needs"
                raise ConfigError(
                    f"{display} cannot run on the native implementation, which {what}: {reason}. "
                    f"It supports the {', '.join(SUPPORTED_ARCHITECTURES)} architectures"
                    + ("; use a float dtype." if weights else "; use impl='auto' or 'transformers'.")
                )
            logger.debug("%s runs on transformers' own forward: %s", display, reason)
            return None
        try:
            return NativeLlama(self._model, self._n_ctx, weights)
        except Exception as error:
            if not _is_oom(error):
                raise
            dtype = f"int8 (weights) / {dtype_name(self._dtype)}" if weights else dtype_name(self._dtype)
            raise out_of_memory(
                f"prepare {display}", path=self._path, backend="torch", dtype=dtype, device=self._device,
                n_ctx=self._n_ctx,
            ) from error

    # -- model facts ---------------------------------------------------------------

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def hidden_size(self) -> int:
        return self._hidden_size

    @property
    def lm_head(self):
        """The target's own LM head: a module mapping hidden states (..., hidden) to logits (..., V)."""
        if self._native is not None:
            return self._native.lm_head
        return self._model.get_output_embeddings()

    @property
    def text_config(self):
        """The transformers config of the language model (layer sizes for draft heads)."""
        return self._model.config.get_text_config()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's input embeddings (..., hidden) of token ids, in its dtype and on its device."""
        if self._native is None:
            return self._model.get_input_embeddings()(ids.to(self._device))
        return self._native._embed(ids.to(self._device))

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (n, head_dim) of the target's rotary embedding at `positions` (n,), in
        the usual form (q * cos + rotate_half(q) * sin): draft heads with the target's
        attention shape place their rows as the target would."""
        rotary = self._model.model.rotary_emb
        # Only the dtype and device of this tensor matter to the rotary module.
        reference = self._native.final_norm if self._native is not None else self._model.get_input_embeddings().weight
        cos, sin = rotary(reference, positions.to(self._device)[None])
        return cos[0], sin[0]

    @property
    def chat_template(self) -> str | None:
        template = getattr(self._tok, "chat_template", None)
        if isinstance(template, dict):  # several named templates: use the default one
            template = template.get("default")
        return template or None

    # -- the cache -----------------------------------------------------------------

    def _new_cache(self):
        from transformers import DynamicCache, cache_utils

        cache = DynamicCache(config=self._model.config)
        # `crop` is exact for full-attention layers, and for sliding-window
        # layers whose window is longer than the whole context (they then never
        # drop anything). Otherwise a sliding layer has forgotten what left its
        # window, and a recurrent (linear-attention) layer keeps no per-token
        # state at all, so a rollback there rebuilds the cache instead.
        full = tuple(getattr(cache_utils, n) for n in ("DynamicLayer", "DummyLayer") if hasattr(cache_utils, n))
        sliding = getattr(cache_utils, "DynamicSlidingWindowLayer", None)

        def exact(layer) -> bool:
            if type(layer) in full:
                return True
            return type(layer) is sliding and getattr(layer, "sliding_window", 0) > self._n_ctx

        return cache, all(exact(layer) for layer in cache.layers)

    def _forward(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        if self._model is None:
            raise RuntimeError("this backend was closed")
        self._tree_base = self._tree_parents = None  # a plain forward ends any tree's keep window
        try:
            if len(tokens) <= PREFILL_CHUNK:  # the decode hot path: one call
                logits = self._run(tokens, all_logits)
            else:
                rows, features = [], []
                for start in range(0, len(tokens), PREFILL_CHUNK):
                    chunk = tokens[start : start + PREFILL_CHUNK]
                    last = start + PREFILL_CHUNK >= len(tokens)
                    if all_logits or last:
                        rows.append(self._run(chunk, all_logits))
                        features.append(self._features)
                    else:
                        self._run(chunk, False)
                logits = torch.cat(rows) if len(rows) > 1 else rows[0]
                if self._native is not None and len(features) > 1:
                    self._features = torch.cat(features)
        except BaseException as error:
            # A failed or interrupted call may have appended keys and values for
            # some layers; put the cache back in line with self.tokens.
            self._repair_cache()
            if _is_oom(error):
                doing = f"run {self._info.name} on {len(self.tokens) + len(tokens)} tokens"
                raise model_out_of_memory(doing, self._info, self._n_ctx, "a shorter prompt") from error
            raise
        # Copy out of inference mode: the caller gets an ordinary float32 CPU
        # tensor it may modify in place (inference tensors refuse that).
        return logits.to(device="cpu", dtype=torch.float32, copy=True)

    def _run(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        """One model call appending `tokens` to the cache; returns (n or 1, V) logits."""
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
        if self._native is not None:
            start = self._kv.length
            with torch.inference_mode():
                logits, features = self._native.forward(input_ids, self._kv, last_only=not all_logits)
                self._store_features(start, features)
            self._features = features if all_logits else features[-1:]
            return logits
        kwargs = {self._cache_kw: self._cache, "use_cache": True}
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 0 if all_logits else 1  # 0 = every position
        with torch.inference_mode():
            logits = self._model(input_ids=input_ids[None], **kwargs).logits[0]
        return logits if all_logits else logits[-1:]

    def _truncate(self, length: int) -> None:
        if self._native is not None:
            self._kv.truncate(length)  # rows past the length are stale and never read
        elif length == 0:
            self._cache.reset()
        elif self._exact_crop:
            with torch.inference_mode():
                self._cache.crop(-(len(self.tokens) - length))
        else:
            self._rebuild(self.tokens[:length])

    def _rebuild(self, tokens: list[int]) -> None:
        """Recompute the cache for `tokens` from scratch (the slow but always exact way)."""
        self._cache, _ = self._new_cache()
        for start in range(0, len(tokens), PREFILL_CHUNK):
            self._run(tokens[start : start + PREFILL_CHUNK], False)

    def _repair_cache(self) -> None:
        keep = len(self.tokens)
        if self._native is not None:
            self._kv.truncate(keep)
            return
        if not self._exact_crop:
            try:
                self._rebuild(self.tokens)
            except BaseException:  # noqa: BLE001 - start empty; the caller re-raises the first error
                self._cache, _ = self._new_cache()
                self.tokens.clear()
            return
        with torch.inference_mode():
            for layer in self._cache.layers:
                keys = getattr(layer, "keys", None)
                if keys is not None and keys.numel() and keys.shape[-2] > keep:
                    layer.crop(-(keys.shape[-2] - keep))

    # -- trees and hidden states (native implementation) ------------------------------

    def forward_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        if self._native is None:
            return super().forward_tree(tokens, parents)
        if not tokens or len(tokens) != len(parents):
            raise ValueError(f"forward_tree() needs one parent per token: {len(tokens)} tokens, {len(parents)} parents")
        check_parents(parents)
        offsets = [d - 1 for d in depths(parents)]
        logits = self.forward_masked(tokens, offsets, ancestor_mask(parents), what="a tree")
        self._tree_parents = list(parents)
        return logits

    def forward_masked(self, tokens: list[int], offsets: list[int], mask: torch.Tensor, what: str = "a block") -> torch.Tensor:
        """Run `tokens` after the cached ones, token i at position len(self.tokens) +
        offsets[i], attending to every cached token and to the new tokens j where
        mask[i, j] (bool (n, n); include i itself). Returns float32 logits (n, V).

        Trees are the special case forward_tree builds; lookahead decoding uses
        any pattern (Jacobi window and candidate n-grams side by side). The cache
        then holds every new token until `keep_rows` keeps the accepted ones.
        """
        if self._native is None:
            raise NotImplementedError(f"the {self.name} backend runs chains only (the transformers implementation)")
        if self._model is None:
            raise RuntimeError("this backend was closed")
        n = len(tokens)
        if not n or len(offsets) != n or tuple(mask.shape) != (n, n):
            raise ValueError(f"forward_masked() needs one offset and one mask row per token ({n} tokens)")
        if len(self.tokens) + n > self.n_ctx or len(self.tokens) + max(offsets) >= self.n_ctx:
            raise ContextOverflowError(
                f"The context window of {self.info.name} is full ({self.n_ctx} tokens): "
                f"{len(self.tokens)} are in use and {what} of {n} more was asked for. "
                "Start a new chat, shorten the prompt, or load the model with a larger context."
            )
        base = len(self.tokens)
        try:
            ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
            positions = torch.tensor(offsets, dtype=torch.long, device=self._device)
            with torch.inference_mode():
                logits, self._features = self._native.forward(
                    ids, self._kv, offsets=positions, mask=mask.to(device=self._device, dtype=torch.bool)
                )
                self._store_features(base, self._features)
        except BaseException as error:
            self._repair_cache()
            if _is_oom(error):
                doing = f"verify {what} of {n} tokens with {self._info.name}"
                raise model_out_of_memory(doing, self._info, self._n_ctx, "a smaller draft") from error
            raise
        self.tokens.extend(tokens)
        if not finite_rows(logits):
            self.rollback(base)
            raise self.corrupt_error()
        self._tree_base, self._tree_parents = base, None
        return logits.to(device="cpu", dtype=torch.float32, copy=True)

    # -- early exit (self-speculative drafting, native implementation) --------------------

    @property
    def supports_early_exit(self) -> bool:
        """True when `partial_forward` works (the native implementation)."""
        return self._native is not None

    def partial_forward(self, tokens: list[int], n_layers: int, start: int) -> torch.Tensor:
        """The early-exit head: the first `n_layers` layers, then the final norm and the
        LM head, over `tokens` placed at positions start, start + 1, ... Returns float32
        CPU logits (len(tokens), V); row i predicts the token after tokens[i].

        The committed tokens (self.tokens) are read from the cache as they are. Layers
        0..n_layers-1 of the same cache are written at positions start.. as scratch;
        positions len(self.tokens)..start-1 must hold scratch that earlier calls in the
        same drafting round wrote for at least `n_layers` layers (start >=
        len(self.tokens)). `self.tokens` does not change and the cache's length is set
        back to len(self.tokens) afterwards (also on error), so the scratch is never
        read by anything else: the next forward over those positions overwrites every
        layer. The cached features and last_features() are left alone.
        """
        if self._native is None:
            raise NotImplementedError(
                f"partial_forward() needs the native implementation, and {self._info.name} runs on "
                "transformers' own forward: load it with impl='auto' or 'native' (llama, mistral, qwen2, qwen3)."
            )
        if self._model is None:
            raise RuntimeError("this backend was closed")
        n, base, depth = len(tokens), len(self.tokens), len(self._native.blocks)
        if not n:
            raise ValueError("partial_forward() needs at least one token")
        if not 1 <= n_layers <= depth:
            raise ValueError(f"n_layers must be between 1 and {depth} (the model's layers), got {n_layers}")
        if start < base:
            raise ValueError(f"start {start} would overwrite cached tokens: the cache holds {base}")
        if start + n > self.n_ctx:
            raise ContextOverflowError(
                f"The context window of {self.info.name} is full ({self.n_ctx} tokens): "
                f"drafting {n} tokens at position {start} does not fit. "
                "Start a new chat, shorten the prompt, or load the model with a larger context."
            )
        try:
            ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
            with torch.inference_mode():
                self._kv.length = start  # NativeLlama.forward appends after `length` (and grows keep it)
                logits, _ = self._native.forward(ids, self._kv, n_layers=n_layers)
                self._exit_hidden = self._native.residual
        except BaseException as error:
            if _is_oom(error):
                doing = f"draft with the first {n_layers} layers of {self._info.name}"
                raise model_out_of_memory(doing, self._info, self._n_ctx, "a shorter draft") from error
            raise
        finally:
            self._kv.truncate(base)
        if not finite_rows(logits):
            raise self.corrupt_error()
        return logits.to(device="cpu", dtype=torch.float32, copy=True)

    def exit_hidden(self) -> torch.Tensor:
        """The residual stream (n, hidden) after the last layer of the last partial_forward,
        before the final norm: where forward_from_exit picks those rows up."""
        hidden = getattr(self, "_exit_hidden", None)
        if hidden is None:
            raise RuntimeError("exit_hidden() needs a partial_forward() call first")
        return hidden.clone()

    def forward_from_exit(self, tokens: list[int], hidden: torch.Tensor, exit_layer: int) -> torch.Tensor:
        """forward(tokens), reusing an early-exit draft's work: the first m = len(hidden)
        tokens went through layers 0..exit_layer-1 in partial_forward calls at positions
        len(self.tokens).. (their keys and values are in the cache as scratch, and `hidden`
        is their residual stream after those layers, from exit_hidden()). Only the other
        n - m tokens run those first layers here; then all n run the rest of the layers,
        the final norm and the LM head. Returns float32 logits (n, V) as forward() does,
        and the tokens join the cache. In exact arithmetic the same as forward(tokens):
        the same layers on the same inputs, some of them run a row at a time.
        """
        if self._native is None:
            raise NotImplementedError("forward_from_exit() needs the native implementation")
        n, m, base, depth = len(tokens), int(hidden.shape[0]), len(self.tokens), len(self._native.blocks)
        if not 0 < m <= n:
            raise ValueError(f"forward_from_exit() needs 1..{n} rows of hidden states for {n} tokens, got {m}")
        if not 1 <= exit_layer < depth:
            raise ValueError(f"exit_layer must be between 1 and {depth - 1}, got {exit_layer}")
        if base + n > self.n_ctx:
            raise ContextOverflowError(
                f"The context window of {self.info.name} is full ({self.n_ctx} tokens): "
                f"{base} are in use and {n} more were asked for. "
                "Start a new chat, shorten the prompt, or load the model with a larger context."
            )
        self._tree_base = self._tree_parents = None
        try:
            ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
            with torch.inference_mode():
                x = hidden.to(device=self._device, dtype=self._native.dtype)
                if m < n:  # the tokens the draft did not run: the first layers here, after its rows
                    self._kv.length = base + m
                    self._native.forward(ids[m:], self._kv, last_only=True, n_layers=exit_layer)
                    x = torch.cat([x, self._native.residual])
                self._kv.length = base
                logits, features = self._native.forward(ids, self._kv, start_layer=exit_layer, hidden=x)
                self._store_features(base, features)
        except BaseException as error:
            self._repair_cache()
            if _is_oom(error):
                raise model_out_of_memory(f"verify {n} tokens with {self._info.name}", self._info, self._n_ctx) from error
            raise
        self._features = features
        self.tokens.extend(tokens)
        if not finite_rows(logits):
            self.rollback(base)
            raise self.corrupt_error()
        return logits.to(device="cpu", dtype=torch.float32, copy=True)

    def keep_nodes(self, nodes: list[int]) -> None:
        if self._native is None:
            return super().keep_nodes(nodes)
        parents = getattr(self, "_tree_parents", None)
        if getattr(self, "_tree_base", None) is None or parents is None:
            raise RuntimeError("keep_nodes() needs a forward_tree() call first (and nothing in between)")
        nodes = [int(i) for i in nodes]
        expected_parent = -1
        for node in nodes:
            if not 0 <= node < len(parents) or parents[node] != expected_parent:
                raise ValueError(f"nodes {nodes} are not a path down from a depth-1 node of the tree")
            expected_parent = node
        self.keep_rows(nodes)

    def keep_rows(self, rows: list[int]) -> None:
        """After `forward_masked` (or `forward_tree`), keep the new tokens `rows` (indices
        into that call's tokens, increasing), in that order, right after the tokens
        cached before it; drop the rest. The caller keeps rows whose offsets were
        0, 1, 2...: a kept token's cache entry was computed at that position."""
        base = getattr(self, "_tree_base", None)
        if self._native is None or base is None:
            raise RuntimeError("keep_rows() needs a forward_masked() or forward_tree() call first")
        rows = [int(i) for i in rows]
        new = len(self.tokens) - base
        if any(not 0 <= r < new for r in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
            raise ValueError(f"rows {rows} are not increasing indices of the {new} tokens of the last call")
        self._tree_base = self._tree_parents = None
        if rows == list(range(len(rows))):  # a prefix in order: already in place
            self.rollback(base + len(rows))
            return
        index = torch.tensor([base + i for i in rows], dtype=torch.long, device=self._device)
        with torch.inference_mode():
            self._kv.keep_rows(base, index)
            if self._feature_store is not None:
                self._feature_store[base : base + len(rows)] = self._feature_store[index]
        new_tokens = self.tokens[base:]
        self.tokens[base:] = [new_tokens[i] for i in rows]

    def cached_features(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Final-norm hidden states (end - start, hidden) of the cached tokens
        self.tokens[start:end], on the model's device (an ordinary tensor)."""
        if self._native is None:
            return super().cached_features(start, end)
        end = len(self.tokens) if end is None else end
        if not 0 <= start <= end <= len(self.tokens):
            raise ValueError(f"no features for positions {start}..{end}: the cache holds {len(self.tokens)} tokens")
        if self._feature_store is None:
            return torch.zeros(0, self._native.hidden_size, dtype=self._native.dtype, device=self._device)
        return self._feature_store[start:end].clone()

    def _store_features(self, start: int, features: torch.Tensor) -> None:
        end = start + features.shape[0]
        store = self._feature_store
        if store is None or store.shape[0] < end:
            doubled = max(256, 2 * (0 if store is None else store.shape[0]))
            grown = features.new_empty(max(end, min(doubled, self.n_ctx)), features.shape[1])
            if store is not None and start:
                grown[:start] = store[:start]
            self._feature_store = store = grown
        store[start:end] = features

    def last_features(self) -> torch.Tensor:
        """Final-norm hidden states (n, hidden) of the rows of the last forward or
        forward_tree call (only the last row after a forward with all_logits=False)."""
        if self._native is None:
            return super().last_features()
        if self._features is None:
            raise RuntimeError("last_features() needs a forward() or forward_tree() call first")
        return self._features.clone()  # an ordinary tensor, outside inference mode

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states (B, T, hidden) of `input_ids` (B, T) run causally
        from position 0, in no-grad mode and without touching the cache (for
        training draft heads on batches of text)."""
        if self._model is None:
            raise RuntimeError("this backend was closed")
        input_ids = input_ids.to(self._device)
        if self._native is not None:
            return self._native.hidden_states(input_ids)
        with torch.no_grad():
            return self._model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state

    # -- text ----------------------------------------------------------------------

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        # HF tokenizers match special tokens written in the text by default;
        # split_special_tokens=True makes "<|im_start|>" typed by a user plain
        # text. (Added tokens that are not marked special still match.)
        encoded = self._tok(text, add_special_tokens=False, split_special_tokens=not special)
        return list(encoded["input_ids"])

    def detokenize(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry as text: 'ĠI' -> ' I', '▁the' -> ' the', '<0x0A>' -> '\\n'.

        Added/control tokens come back verbatim. Byte pieces that are not whole
        UTF-8 characters show as U+FFFD, as they do in llama.cpp's pieces.
        """
        piece = self._tok.convert_ids_to_tokens(int(token_id))
        if piece is None:
            return ""
        if int(token_id) in self._added_ids:
            return piece
        if self._byte_level:
            raw = bytes(_UNICODE_TO_BYTE.get(ch, 0x3F) for ch in piece)
            return raw.decode("utf-8", errors="replace")
        byte = _SPM_BYTE.fullmatch(piece)
        if byte:
            return bytes([int(byte.group(1), 16)]).decode("utf-8", errors="replace")
        return piece.replace("\u2581", " ")  # SentencePiece marks spaces with ▁

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Ids of the chat, ending where the assistant's reply starts.

        The template is rendered to text and then tokenized with control tokens
        parsed: this avoids the version-dependent return type of the tokenizer's
        own tokenizing path (list, BatchEncoding or dict across 4.x/5.x).
        Without a template (base models) the chat becomes "role: content" lines
        ending in "assistant:", after the tokenizer's usual prefix (e.g. BOS).
        """
        if self.chat_template:
            text = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return self.tokenize(text, special=True)
        prefix = list(self._tok("", add_special_tokens=True)["input_ids"])
        lines = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return prefix + self.tokenize(lines + "assistant:")

    def _corrupt_hint(self) -> str:
        if self._dtype == torch.float16:
            return " If the file is intact, the model may overflow in float16: load it in bfloat16 or float32."
        return ""

    def close(self) -> None:
        if getattr(self, "_model", None) is None:
            return
        device = self._device
        self._model = None
        self._cache = None
        self._native = self._kv = self._features = self._feature_store = None
        self.tokens.clear()
        if device == "cuda":
            torch.cuda.empty_cache()
        elif device == "mps":
            torch.mps.empty_cache()


# -- loading -------------------------------------------------------------------------


def _resolve_location(path: str, gguf_file: str | None) -> tuple[str, str | None]:
    """(folder, gguf basename or None); raises ModelNotFoundError for missing paths."""
    if gguf_file is None and path.lower().endswith(".gguf"):
        path, gguf_file = os.path.split(path)  # a .gguf path on its own is fine too
    if gguf_file is not None:
        full = os.path.join(path, gguf_file)  # an absolute gguf_file wins over path
        if not os.path.isfile(full):
            raise ModelNotFoundError(f"GGUF file not found: {full}. Check the path and file name.")
        folder, gguf_file = os.path.split(os.path.abspath(full))
        return folder, gguf_file
    if not os.path.exists(path):
        raise ModelNotFoundError(
            f"Model folder not found: {path}. Give the path of a local folder holding "
            "config.json, the weights (*.safetensors) and the tokenizer files."
        )
    if not os.path.isdir(path):
        raise ModelLoadError(
            f"{path} is a file, not a model folder. Give the folder holding config.json "
            "and the weights, or a .gguf file."
        )
    return os.path.abspath(path), None


def _check_folder(folder: str) -> None:
    """Refuse folders transformers would fail on with a confusing message."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ModelLoadError(
            f"{folder} has no config.json, so it is not a Hugging Face model folder. "
            "Point at the folder that holds config.json, the *.safetensors weights and the "
            "tokenizer files (download it whole), or at a .gguf file."
        )
    names = os.listdir(folder)
    has_safetensors = any(n.endswith(".safetensors") for n in names)
    has_pickle = any(n in _PICKLE_FILES or re.fullmatch(r"pytorch_model-.*\.bin", n) for n in names)
    if not has_safetensors and not has_pickle:
        raise ModelLoadError(
            f"{folder} has a config.json but no weights (no *.safetensors file). "
            "Download the model's weight files into that folder."
        )


def _load(
    folder: str, gguf_file: str | None, dtype: torch.dtype, device: str, trust_remote_code: bool, n_ctx: int | None,
    report: LoadProgress,
):  # fmt: skip
    if gguf_file is None:
        _check_folder(folder)
    where = os.path.join(folder, gguf_file) if gguf_file else folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    extra = {}
    if gguf_file:
        common["gguf_file"] = gguf_file
        extra = _dense_gguf_options()
    try:
        # weights_only=True: a pytorch_model.bin (pickle) is read with
        # torch.load(weights_only=True), which runs no code from the file;
        # transformers 5 also refuses that path on torch < 2.6 (CVE-2025-32434).
        # Safetensors files are preferred whenever both are present.
        # A GGUF file is dequantized tensor by tensor here: most of a 20-30 s load.
        report("Dequantizing the GGUF weights" if gguf_file else "Reading the weights", 0.05)
        with _gguf_tensor_progress(lambda done: report("Dequantizing the GGUF weights", 0.05 + 0.6 * done)):
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, weights_only=True, **common, **extra)
        report(f"Moving the weights to {device}", 0.7)
        model = model.to(device).eval()
        report("Reading the tokenizer", 0.8)
        tokenizer = AutoTokenizer.from_pretrained(folder, **common)
    except Exception as error:  # every failure gets an actionable message
        if _is_oom(error):
            release_frames(error)  # the half-loaded weights, before the estimate reads the files
            raise out_of_memory(
                f"load {where}", path=where, backend="torch", dtype=dtype_name(dtype), device=device, n_ctx=n_ctx
            ) from error
        pickles = [] if gguf_file else pickle_files(folder)
        if pickles and is_refused_pickle(error):
            raise refused_pickle_error(pickles[0], error, convert_model_folder(folder)) from error
        raise ModelLoadError(_load_failure_message(where, gguf_file, trust_remote_code, error)) from error
    return model, tokenizer


@contextmanager
def _gguf_tensor_progress(report):
    """While it is open, transformers' GGUF tensor loop reports the share of tensors done.

    That loop (`Converting and de-quantizing GGUF tensors`) iterates through its module's
    `tqdm`, the only progress it has; the name is wrapped for the load and put back after.
    A transformers without it still loads, with the phases only.
    """
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return

    def counted(iterable, *args, **kwargs):
        total = len(iterable) if hasattr(iterable, "__len__") else 0
        for done, item in enumerate(original(iterable, *args, **kwargs)):
            if total:
                report(done / total)
            yield item

    gguf_utils.tqdm = counted
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _dense_gguf_options() -> dict:
    """Ask transformers to unpack GGUF weights into plain dense tensors.

    Recent 5.x can keep GGUF blocks packed, but only with the `kernels` package
    and a kernel downloaded from the Hub, which an offline app never has; it
    then falls back to dense anyway, after a warning about float32 that does not
    apply. Asking for dense up front is what happens in practice, said plainly.
    """
    try:
        from transformers import GgufConfig
    except ImportError:  # older 5.x: dense is the only path
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _load_failure_message(where: str, gguf_file: str | None, trust_remote_code: bool, error: Exception) -> str:
    detail = short_reason(error, limit=400)
    hint = (
        "The GGUF file may be corrupt, or use an architecture or quantization transformers cannot "
        "dequantize; try the llama.cpp backend for it."
        if gguf_file
        else "The files may be incomplete or corrupt (download them again), or the architecture may "
        "need a newer transformers"
        + ("" if trust_remote_code else " or trust_remote_code (only for code you trust)")
        + "."
    )
    return f"Could not load the model in {where}. {hint} ({detail})"


def _is_oom(error: BaseException) -> bool:
    """A failed allocation in any of its forms (memory_errors), not yet turned into our error."""
    return unexplained_allocation_failure(error)


def _context_length(config, tokenizer) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 10**7:  # HF uses ~1e30 for "unknown"
        return limit
    return 2048


def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    for source in (getattr(generation, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return frozenset(ids)


def _is_byte_level(tokenizer) -> bool:
    """Whether vocabulary entries are GPT-2 style byte-level strings ('Ġ' for a space)."""
    from tokenizers.decoders import ByteLevel

    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and isinstance(backend.decoder, ByteLevel)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


_UNICODE_TO_BYTE = {ch: b for b, ch in _bytes_to_unicode().items()}
