"""transformers' cache layers, sorted by how a rollback undoes them (transformers 5.25 `cache_utils`).

- Full attention (`DynamicLayer`, and `DummyLayer` for a layer with no cache): one entry
  per token, so a rollback is a cut.
- Sliding window (`DynamicSlidingWindowLayer`): keeps only the last `window - 1` tokens, so
  once the context passes the window a cut cannot bring back what left it. `window_cache`
  swaps these for full `DynamicLayer`s: the model still attends within its window, because
  transformers' sliding mask (`masking_utils.sliding_window_causal_mask_function`) compares
  absolute positions, kv_idx > q_idx - window, over whatever the layer holds; the layer just
  keeps what the mask hides, which costs memory growing with the context like a full layer's,
  and makes the rollback a cut again.
- Recurrent (`LinearAttentionCacheLayerMixin`: Qwen3.5's and Qwen3-Next's gated delta nets,
  Mamba 2 in Nemotron-H, Granite 4 and Falcon-H1, LFM2's short convolutions): one state for
  the whole sequence (a convolution window and/or a recurrent matrix), updated in place.
  `save_state` copies those states out before a forward; `restore_state` copies one back,
  and the backend replays the kept tokens after it (engine/backends/checkpoints.py).
"""

from __future__ import annotations


def window_cache(config):
    """A DynamicCache for `config` whose sliding-window layers keep every position (full layers)."""
    from transformers import DynamicCache, cache_utils

    cache = DynamicCache(config=config)
    sliding = getattr(cache_utils, "DynamicSlidingWindowLayer", None)
    cache.layers = [cache_utils.DynamicLayer() if type(layer) is sliding else layer for layer in cache.layers]
    return cache


def is_recurrent(layer) -> bool:
    from transformers import cache_utils

    mixin = getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)
    return mixin is not None and isinstance(layer, mixin)


def _cuts_exactly(layer) -> bool:
    """A layer whose per-token part (if any) a cut undoes: full attention, or none at all."""
    from transformers import cache_utils

    if type(layer).__name__ == "DummyLayer":
        return True
    sliding = getattr(cache_utils, "DynamicSlidingWindowLayer", ())
    return isinstance(layer, cache_utils.DynamicLayer) and not isinstance(layer, sliding)


def rollback_kind(cache) -> str:
    """ "cut" when every layer cuts exactly; "checkpoint" when the others are recurrent and their
    attention part (if any) cuts; "rebuild" otherwise (an unknown layer kind: recompute)."""
    if all(_cuts_exactly(layer) and not is_recurrent(layer) for layer in cache.layers):
        return "cut"
    if all(_cuts_exactly(layer) or (is_recurrent(layer) and _attention_part_cuts(layer)) for layer in cache.layers):
        return "checkpoint"
    return "rebuild"


def _attention_part_cuts(layer) -> bool:
    """A recurrent layer with no per-token part, or with a full-attention one."""
    from transformers import cache_utils

    return not isinstance(layer, cache_utils.CacheLayerMixin) or _cuts_exactly(layer)


# One saved recurrent layer: (conv states, recurrent states, has_previous_state, tokens counted),
# the first two by state index, None where the layer has not made that state yet.
LayerState = tuple[dict, dict, dict, int]


def save_state(cache) -> tuple[LayerState | None, ...]:
    """Copies of every recurrent layer's states (None for the other layers); call in inference mode."""

    def copy(states: dict) -> dict:
        return {i: None if s is None else s.clone() for i, s in states.items()}

    return tuple(
        (
            copy(layer.conv_states),
            copy(layer.recurrent_states),
            dict(layer.has_previous_state),
            int(layer.cumulative_length_linear),
        )
        if is_recurrent(layer)
        else None
        for layer in cache.layers
    )


def restore_state(cache, saved: tuple[LayerState | None, ...]) -> None:
    """Put `saved` back into the cache's recurrent layers. Copied into the layers' own tensors,
    not assigned: a layer updates its states in place, which would change the checkpoint too."""
    for layer, state in zip(cache.layers, saved, strict=True):
        if state is None:
            continue
        conv, recurrent, has_previous, length = state
        _copy_into(layer.conv_states, conv)
        _copy_into(layer.recurrent_states, recurrent)
        layer.has_previous_state.update(has_previous)
        layer.cumulative_length_linear.fill_(length)


def _copy_into(states: dict, saved: dict) -> None:
    for i, tensor in saved.items():
        if tensor is None:
            continue
        current = states.get(i)
        if current is not None and current.shape == tensor.shape:
            current.copy_(tensor)
        else:
            states[i] = tensor.clone()


def cut_attention(cache, length: int) -> None:
    """Cut every attention layer (and attention part of a mixed layer) back to `length` tokens."""
    from transformers import cache_utils

    for layer in cache.layers:
        if not isinstance(layer, cache_utils.DynamicLayer) or not getattr(layer, "is_initialized", False):
            continue
        keys = layer.keys
        if keys is not None and keys.dim() >= 2 and keys.shape[-2] > length:
            cache_utils.DynamicLayer.crop(layer, -(keys.shape[-2] - length))
