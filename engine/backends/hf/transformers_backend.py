"""The PyTorch backend on transformers' own forward: any architecture transformers knows.

One `DynamicCache`, rolled back in one of three ways (engine/backends/hf/hybrid_cache.py):
a cut, where every layer keeps one entry per token (full attention; sliding-window
layers are kept whole for this, the mask still applying the window); a restored state
checkpoint and a replay, where some layers are recurrent (Qwen3.5, Qwen3-Next, LFM2,
Nemotron-H, Granite 4, Falcon-H1, Mamba 2: engine/backends/checkpoints.py); and a
rebuild from scratch for any other layer kind, or a rollback before every checkpoint.

Checkpoint and replay against the alternative, per-position states (the verify run one
token at a time, saving the state after each, so that a rollback replays nothing),
measured by docs/bench/hf_hybrid_overhead.py: one batched forward plus a replay of the
accepted tokens on a rejection was the faster on every model and rejection rate tried
(k = 4, drafts rejected at 0.3 or 0.7, 2 CPU threads: 8.6-15 ms a step against 18-28 ms
on tiny Qwen3.5 / LFM2 / Nemotron-H, 72-75 against 121-126 ms on a hidden-512 Qwen3.5),
since a forward's fixed cost dominates a small step. Chains only: it
has ModelParts (the target's embeddings, rope and LM head) and HiddenFeatures (the base
model's final-norm output of every row, caught by a forward hook, so transformers' own
forward is called exactly as before), and CachedKV (a layer's keys and values in the
cache, what a Gemma 4 assistant attends to); the native backend has the other
capabilities of engine/backends/capabilities.py.

Written against transformers 5.x, where the model's cache argument is named
`cache` (5.24; `past_key_values` before, still accepted until 5.40), positions
follow from the cache length (there is no `cache_position`), and
`DynamicCache.crop` only takes a negative number of tokens to remove.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

from engine.backends.capabilities import CachedKV, HiddenFeatures, ModelParts
from engine.backends.checkpoints import StateCheckpoints
from engine.backends.hf import hybrid_cache
from engine.backends.hf.base import PREFILL_CHUNK, HFBackend
from engine.backends.hf.loader import LoadedModel


class TransformersBackend(HFBackend):
    """A transformers causal LM run by its own forward with one DynamicCache."""

    capabilities = frozenset({ModelParts, HiddenFeatures, CachedKV})

    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__(loaded, forward="transformers' own forward (no static path)")
        # The model's forward names its cache argument differently across
        # versions and in remote code; look it up once, not on every step.
        params_of_forward = inspect.signature(self._model.forward).parameters
        self._cache_kw = "cache" if "cache" in params_of_forward else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params_of_forward
        # Gemma 4 runs its KV-sharing layers on the kept rows only when logits_to_keep is an int, which
        # would leave the other rows' hidden states (HiddenFeatures) unmade: there the last row is named by index.
        self._keep_by_index = bool(getattr(loaded.config, "num_kv_shared_layers", 0))
        self._cache = self._new_cache()
        self._rollback_kind = hybrid_cache.rollback_kind(self._cache)  # "cut", "checkpoint" or "rebuild"
        self._checkpoints = StateCheckpoints() if self._rollback_kind == "checkpoint" else None
        self.replays_on_rollback = self._rollback_kind == "checkpoint"
        if any(type(layer).__name__ == "DynamicSlidingWindowLayer" for layer in self._plain_cache_layers()):
            self._info = replace(
                self._info,
                forward=self._info.forward + "; its sliding-window layers keep every position (more memory, "
                "the model still attends within its window) so that a rejected draft is undone by a cut",
            )
        self._fed = 0  # positions in the cache (self.tokens lags it inside a prefill cut in slices)
        self._caught: list[torch.Tensor] = []
        self._hook = self._model.base_model.register_forward_hook(self._catch_hidden)

    # -- model parts -------------------------------------------------------------------

    @property
    def lm_head(self):
        """The target's own LM head: a module mapping hidden states (..., hidden) to logits (..., V)."""
        return self._model.get_output_embeddings()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's input embeddings (..., hidden) of token ids, in its dtype and on its device."""
        return self._model.get_input_embeddings()(ids.to(self._device))

    def _rope_reference(self) -> torch.Tensor:
        return self._model.get_input_embeddings().weight

    def cached_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (1, kv_heads, n, head_dim) decoder layer `layer` holds for the cached tokens
        (CachedKV, what a Gemma 4 assistant attends to); inference tensors, to be read, not changed."""
        held = self._cache.layers[layer]
        return held.keys, held.values

    # A caller that skipped has(backend, C) hears which implementation it needs.

    def forward_tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Not here: trees (TreeForward) run on the native backend only."""
        raise NotImplementedError(
            f"forward_tree() needs the native implementation, and {self._info.name} runs on transformers' "
            "own forward, which verifies chains only: load it with impl='auto' or 'native' (llama, mistral, "
            "qwen2, qwen3)."
        )

    def partial_forward(self, tokens: list[int], n_layers: int, start: int) -> torch.Tensor:
        """Not here: early exit (LayerExit) runs on the native backend only."""
        raise NotImplementedError(
            f"partial_forward() needs the native implementation, and {self._info.name} runs on "
            "transformers' own forward: load it with impl='auto' or 'native' (llama, mistral, qwen2, qwen3)."
        )

    # -- the cache -----------------------------------------------------------------

    def _new_cache(self):
        return hybrid_cache.window_cache(self._model.config)

    def _plain_cache_layers(self) -> list:
        """The layers transformers would give this model (to tell the user what was changed)."""
        from transformers import DynamicCache

        return list(DynamicCache(config=self._model.config).layers)

    def _run(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
        kwargs = {self._cache_kw: self._cache, "use_cache": True}
        if self._has_logits_to_keep:
            last = torch.tensor([len(tokens) - 1], device=self._device) if self._keep_by_index else 1
            kwargs["logits_to_keep"] = 0 if all_logits else last  # 0 = every position
        start = self._fed
        self._caught.clear()
        with torch.inference_mode():
            if self._checkpoints is not None and start and self.checkpoint_forwards:
                self._save_checkpoint(start)
            logits = self._model(input_ids=input_ids[None], **kwargs).logits[0]
            features = self._caught.pop()[0] if self._caught else None  # (n, hidden)
            if features is not None:
                self._store_features(start, features)
        self._fed = start + len(tokens)
        self._features = None if features is None else features if all_logits else features[-1:]
        return logits if all_logits else logits[-1:]

    def _forward(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        logits = super()._forward(tokens, all_logits)
        if all_logits and self._features is not None and self._features.shape[0] != len(tokens):
            start = len(self.tokens)  # a prefill run in slices: every row's features
            self._features = self._feature_store[start : start + len(tokens)]
        return logits

    def _truncate(self, length: int) -> None:
        if length == 0:
            with torch.inference_mode():  # a linear-attention layer zeroes its inference-mode states in place
                self._cache.reset()
            if self._checkpoints is not None:
                self._checkpoints.clear()
        elif self._rollback_kind == "cut":
            with torch.inference_mode():
                self._cache.crop(-(len(self.tokens) - length))
        elif self._rollback_kind == "checkpoint":
            self._replay_to(length)
        else:
            self._rebuild(self.tokens[:length])
        self._fed = length

    # -- checkpoints and replay (recurrent layers) ----------------------------------------------

    def _save_checkpoint(self, position: int) -> None:
        """The recurrent states after `position` tokens, before a forward changes them in place;
        none when the newest checkpoint already holds this position (a replay starts there)."""
        newest = self._checkpoints.newest_at_or_before(position)
        if newest is None or newest.position != position:
            self._checkpoints.save(position, hybrid_cache.save_state(self._cache))

    def _replay_to(self, length: int) -> None:
        """Make the cache hold self.tokens[:length]: restore the newest checkpoint c <= length, cut
        the attention layers to c, and run the model over tokens c..length again. Exact: the
        states after c tokens plus the same tokens give the same states. Before every checkpoint,
        rebuild. The last call's features (last_features) stay the caller's, not the replay's."""
        self._checkpoints.drop_after(length)  # they hold tokens past the kept ones
        checkpoint = self._checkpoints.newest_at_or_before(length)
        if checkpoint is None:
            self._rebuild(self.tokens[:length])
            return
        features = self._features
        with torch.inference_mode():
            hybrid_cache.restore_state(self._cache, checkpoint.state)
            hybrid_cache.cut_attention(self._cache, checkpoint.position)
        self._fed = checkpoint.position
        replay = self.tokens[checkpoint.position : length]
        for start in range(0, len(replay), PREFILL_CHUNK):
            self._run(replay[start : start + PREFILL_CHUNK], False)
        self._features = features

    def _rebuild(self, tokens: list[int]) -> None:
        """Recompute the cache for `tokens` from scratch (the slow but always exact way)."""
        self._cache = self._new_cache()
        if self._checkpoints is not None:
            self._checkpoints.clear()
        self._fed = 0
        for start in range(0, len(tokens), PREFILL_CHUNK):
            self._run(tokens[start : start + PREFILL_CHUNK], False)

    def _repair_cache(self) -> None:
        keep = len(self.tokens)
        if self._rollback_kind != "cut":
            try:
                if self._rollback_kind == "checkpoint" and keep:
                    self._replay_to(keep)
                else:
                    self._rebuild(self.tokens)
            except BaseException:  # noqa: BLE001 - start empty; the caller re-raises the first error
                self._cache = self._new_cache()
                if self._checkpoints is not None:
                    self._checkpoints.clear()
                self._fed = 0
                self.tokens.clear()
            return
        self._fed = keep
        with torch.inference_mode():
            hybrid_cache.cut_attention(self._cache, keep)

    def _drop_cache(self) -> None:
        self._cache = self._features = self._feature_store = None
        self._hook.remove()

    # -- hidden states (HiddenFeatures) --------------------------------------------------

    def _catch_hidden(self, module, args, output) -> None:
        """The base model's output, (1, n, hidden) after its final norm: what the LM head reads."""
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None and isinstance(output, (tuple, list)) and output:
            hidden = output[0]
        if isinstance(hidden, torch.Tensor):
            self._caught.append(hidden)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._model is None:
            raise RuntimeError("this backend was closed")
        try:
            with torch.no_grad():
                return self._model.base_model(input_ids=input_ids.to(self._device), use_cache=False).last_hidden_state
        finally:
            self._caught.clear()  # the hook saw this batch too; the decode cache's features are not it
