"""The PyTorch backend on transformers' own forward: any architecture transformers knows.

One `DynamicCache`, rolled back with `crop` where that is exact (full attention, or a
sliding window longer than the whole context) and rebuilt otherwise. Chains only: it
has ModelParts (the target's embeddings, rope and LM head) and no other capability of
engine/backends/capabilities.py; the native backend has those.

Written against transformers 5.x, where the model's cache argument is named
`cache` (5.24; `past_key_values` before, still accepted until 5.40), positions
follow from the cache length (there is no `cache_position`), and
`DynamicCache.crop` only takes a negative number of tokens to remove.
"""

from __future__ import annotations

import inspect

import torch

from engine.backends.capabilities import ModelParts
from engine.backends.hf.base import PREFILL_CHUNK, HFBackend
from engine.backends.hf.loader import LoadedModel


class TransformersBackend(HFBackend):
    """A transformers causal LM run by its own forward with one DynamicCache."""

    capabilities = frozenset({ModelParts})

    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__(loaded, forward="transformers' own forward (no static path)")
        # The model's forward names its cache argument differently across
        # versions and in remote code; look it up once, not on every step.
        params_of_forward = inspect.signature(self._model.forward).parameters
        self._cache_kw = "cache" if "cache" in params_of_forward else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params_of_forward
        self._cache, self._exact_crop = self._new_cache()

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

    def _run(self, tokens: list[int], all_logits: bool) -> torch.Tensor:
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
        kwargs = {self._cache_kw: self._cache, "use_cache": True}
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 0 if all_logits else 1  # 0 = every position
        with torch.inference_mode():
            logits = self._model(input_ids=input_ids[None], **kwargs).logits[0]
        return logits if all_logits else logits[-1:]

    def _truncate(self, length: int) -> None:
        if length == 0:
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

    def _drop_cache(self) -> None:
        self._cache = None

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._model is None:
            raise RuntimeError("this backend was closed")
        with torch.no_grad():
            return self._model.base_model(input_ids=input_ids.to(self._device), use_cache=False).last_hidden_state
