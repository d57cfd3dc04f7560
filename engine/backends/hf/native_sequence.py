"""One sequence on the native forward: its KV cache, trees, hidden states and early exit.

`NativeSequence` is everything engine/backends/hf/native_backend.py's docstring lists but
Slots: the backend that loads the model is one (NativeBackend), and each slot it opens
(engine/backends/hf/native_slots.py) is another, on the same weights.
"""

from __future__ import annotations

import torch

from engine.backends.base import finite_rows
from engine.backends.capabilities import HiddenFeatures, LayerExit, LayerFeatures, ModelParts, TreeForward
from engine.backends.hf.base import HFBackend
from engine.backends.hf.loader import is_oom
from engine.backends.hf.native import NativeLlama
from engine.core.tree import ancestor_mask, check_parents, depths


class NativeSequence(HFBackend):
    """One sequence on a NativeLlama: its cache, trees, hidden states and early exit on shared weights.

    The backend that loads the model (NativeBackend) is one; the slots it opens
    (engine/backends/hf/native_slots.py) are others. Each sets, besides HFBackend's state,
    `_native` and `_pass` (the model and the forward every call goes through, shared) and its
    own cache with `_start_sequence`.
    """

    capabilities = frozenset({TreeForward, HiddenFeatures, LayerFeatures, LayerExit, ModelParts})
    _native: NativeLlama | None
    _pass = None  # NativeLlama.forward, or StaticForward.forward (static.py)
    _static = None  # the StaticForward on the static-shape path, which steps several sequences at once

    def _start_sequence(self, cache) -> None:
        """Begin this sequence's own state on `cache` (a KVCache, empty)."""
        self._kv = cache
        self._tree_base: int | None = None  # len(self.tokens) before the last forward_masked, until kept
        self._tree_parents: list[int] | None = None  # the last forward_tree's parents, until kept
        self._exit_hidden: torch.Tensor | None = None  # residual stream after the last partial_forward

    # -- model parts -------------------------------------------------------------------

    @property
    def lm_head(self):
        """The target's own LM head: a module mapping hidden states (..., hidden) to logits (..., V)."""
        return self._native.lm_head

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's input embeddings (..., hidden) of token ids, in its dtype and on its device."""
        return self._native._embed(ids.to(self._device))

    def _rope_reference(self) -> torch.Tensor:
        return self._native.final_norm

    # -- the cache -----------------------------------------------------------------

    def _forward(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        self._tree_base = self._tree_parents = None  # a plain forward ends any tree's keep window
        logits = super()._forward(tokens, all_logits)
        if all_logits and self._features.shape[0] != len(tokens):  # a prefill run in slices: every row's
            start = len(self.tokens)
            self._features = self._feature_store[start : start + len(tokens)].clone()
        return logits

    def _run(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
        start = self._kv.length
        with torch.inference_mode():
            logits, features = self._pass(input_ids, self._kv, last_only=not all_logits)
            self._store_features(start, features)
            self._store_layer_features(start, self._native.layer_features)
        self._features = features if all_logits else features[-1:]
        return logits

    def _truncate(self, length: int) -> None:
        self._kv.truncate(length)  # rows past the length are stale and never read

    def _repair_cache(self) -> None:
        self._kv.truncate(len(self.tokens))

    def _drop_cache(self) -> None:
        self._native = self._pass = self._static = self._kv = self._features = self._feature_store = (
            self._exit_hidden
        ) = None
        self._layer_store = None

    # -- trees and masked blocks (TreeForward) ------------------------------------------

    def forward_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Run a token tree after the cached tokens (Backend docs: node i at position
        len(self.tokens) + depth(i) - 1, attending to the cache, its ancestors and itself)."""
        if not tokens or len(tokens) != len(parents):
            raise ValueError(f"forward_tree() needs one parent per token: {len(tokens)} tokens, {len(parents)} parents")
        check_parents(parents)
        offsets = [d - 1 for d in depths(parents)]
        logits = self.forward_masked(tokens, offsets, ancestor_mask(parents), what="a tree")
        self._tree_parents = list(parents)
        return logits

    def forward_masked(
        self, tokens: list[int], offsets: list[int], mask: torch.Tensor, what: str = "a block"
    ) -> torch.Tensor:
        """Run `tokens` after the cached ones, token i at position len(self.tokens) +
        offsets[i], attending to every cached token and to the new tokens j where
        mask[i, j] (bool (n, n); include i itself). Returns float32 logits (n, V).

        Trees are the special case forward_tree builds; lookahead decoding uses
        any pattern (Jacobi window and candidate n-grams side by side). The cache
        then holds every new token until `keep_rows` keeps the accepted ones.
        """
        if self._model is None:
            raise RuntimeError("this backend was closed")
        n = len(tokens)
        if not n or len(offsets) != n or tuple(mask.shape) != (n, n):
            raise ValueError(f"forward_masked() needs one offset and one mask row per token ({n} tokens)")
        if len(self.tokens) + n > self.n_ctx or len(self.tokens) + max(offsets) >= self.n_ctx:
            raise self._context_full(f"{len(self.tokens)} are in use and {what} of {n} more was asked for")
        base = len(self.tokens)
        try:
            ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
            positions = torch.tensor(offsets, dtype=torch.long, device=self._device)
            with torch.inference_mode():
                logits, self._features = self._pass(
                    ids, self._kv, offsets=positions, mask=mask.to(device=self._device, dtype=torch.bool)
                )
                self._store_features(base, self._features)
                self._store_layer_features(base, self._native.layer_features)
        except BaseException as error:
            self._repair_cache()
            if is_oom(error):
                raise self._out_of_memory(
                    f"verify {what} of {n} tokens with {self._info.name}", "a smaller draft"
                ) from error
            raise
        self.tokens.extend(tokens)
        if not finite_rows(logits):
            self.rollback(base)
            raise self.corrupt_error()
        self._tree_base, self._tree_parents = base, None
        return logits.to(device="cpu", dtype=torch.float32, copy=True)

    def keep_nodes(self, nodes: list[int]) -> None:
        """After `forward_tree`, keep the cache entries of `nodes` (a path from a depth-1 node
        down, in order) and drop every other node of the tree."""
        parents = self._tree_parents
        if self._tree_base is None or parents is None:
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
        base = self._tree_base
        if base is None:
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
            for store in (self._feature_store, self._layer_store):
                if store is not None:
                    store[base : base + len(rows)] = store[index]
        new_tokens = self.tokens[base:]
        self.tokens[base:] = [new_tokens[i] for i in rows]

    # -- hidden states (HiddenFeatures) --------------------------------------------------

    def _feature_dtype(self) -> torch.dtype:
        return self._native.dtype  # the compute dtype (int8 weights compute in bf16)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._model is None:
            raise RuntimeError("this backend was closed")
        return self._native.hidden_states(input_ids.to(self._device))

    # -- the inputs of chosen layers (LayerFeatures: EAGLE-3) ------------------------------

    def watch_layers(self, layers: tuple[int, ...]) -> None:
        """Keep the inputs of `layers` (increasing, 0..n_layers-1) for every token from now on; ()
        stops. A new set forgets the cached tokens, whose layers' inputs were not kept."""
        layers = tuple(int(i) for i in layers)
        if self._native is None:  # closed: nothing is kept any more
            if layers:
                raise RuntimeError("this backend was closed")
            return
        depth = len(self._native.blocks)
        if any(not 0 <= i < depth for i in layers) or list(layers) != sorted(set(layers)):
            raise ValueError(f"layers {layers} are not increasing ids of the model's {depth} layers")
        if layers == self._watched:
            return
        if layers:
            self.rollback(0)
        self._watched = self._native.watched = layers
        self._layer_store = None

    # -- early exit (LayerExit: self-speculative drafting) ---------------------------------

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
            raise self._context_full(f"drafting {n} tokens at position {start} does not fit")
        try:
            ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
            with torch.inference_mode():
                self._kv.length = start  # NativeLlama.forward appends after `length` (and grows keep it)
                logits, _ = self._pass(ids, self._kv, n_layers=n_layers)
                self._exit_hidden = self._native.residual
        except BaseException as error:
            if is_oom(error):
                raise self._out_of_memory(
                    f"draft with the first {n_layers} layers of {self._info.name}", "a shorter draft"
                ) from error
            raise
        finally:
            self._kv.truncate(base)
        if not finite_rows(logits):
            raise self.corrupt_error()
        return logits.to(device="cpu", dtype=torch.float32, copy=True)

    def exit_hidden(self) -> torch.Tensor:
        """The residual stream (n, hidden) after the last layer of the last partial_forward,
        before the final norm: where forward_from_exit picks those rows up."""
        if self._exit_hidden is None:
            raise RuntimeError("exit_hidden() needs a partial_forward() call first")
        return self._exit_hidden.clone()

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
        n, m, base, depth = len(tokens), int(hidden.shape[0]), len(self.tokens), len(self._native.blocks)
        if not 0 < m <= n:
            raise ValueError(f"forward_from_exit() needs 1..{n} rows of hidden states for {n} tokens, got {m}")
        if not 1 <= exit_layer < depth:
            raise ValueError(f"exit_layer must be between 1 and {depth - 1}, got {exit_layer}")
        if base + n > self.n_ctx:
            raise self._context_full(f"{base} are in use and {n} more were asked for")
        if self._watched and self._watched[0] < exit_layer:
            # The draft's partial forwards kept no inputs of the watched layers below the exit: run
            # every layer instead (the same logits; the scratch rows are overwritten).
            return self.forward(tokens)
        self._tree_base = self._tree_parents = None
        try:
            ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
            with torch.inference_mode():
                x = hidden.to(device=self._device, dtype=self._native.dtype)
                if m < n:  # the tokens the draft did not run: the first layers here, after its rows
                    self._kv.length = base + m
                    self._pass(ids[m:], self._kv, last_only=True, n_layers=exit_layer)
                    x = torch.cat([x, self._native.residual])
                self._kv.length = base
                logits, features = self._pass(ids, self._kv, start_layer=exit_layer, hidden=x)
                self._store_features(base, features)
                self._store_layer_features(base, self._native.layer_features)
        except BaseException as error:
            self._repair_cache()
            if is_oom(error):
                raise self._out_of_memory(f"verify {n} tokens with {self._info.name}") from error
            raise
        self._features = features
        self.tokens.extend(tokens)
        if not finite_rows(logits):
            self.rollback(base)
            raise self.corrupt_error()
        return logits.to(device="cpu", dtype=torch.float32, copy=True)
