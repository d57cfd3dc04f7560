"""The inputs of chosen layers (LayerFeatures, for EAGLE-3): what transformers calls the hidden states
entering them, kept for every cached token through chains, trees and rollbacks, on both native paths."""

from __future__ import annotations

import pytest
import torch

from engine.backends.hf.backend import TorchBackend
from tests.factories.hf_models import make_tiny_llama

LAYERS = (0, 2, 3)
TEXT = "The quick brown fox jumps over the lazy dog, and then it naps in the sun."


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("layers") / "four-layers", seed=2, n_layers=4)


def reference(backend, ids: list[int]) -> torch.Tensor:
    """transformers' hidden_states[i] (the input of layer i) for LAYERS, concatenated."""
    with torch.no_grad():
        states = backend._model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.cat([states[i][0] for i in LAYERS], dim=-1)


@pytest.mark.parametrize("compile", ["off", "on"], ids=["eager", "static"])
def test_watched_layers_are_the_inputs_transformers_reports(model, compile):
    backend = TorchBackend(model, dtype="float32", compile=compile)
    try:
        with pytest.raises(RuntimeError, match="watch_layers"):
            backend.cached_layer_features()  # nothing is kept unless a drafter asks
        ids = backend.tokenize(TEXT)
        backend.prefill(ids[:4])
        backend.watch_layers(LAYERS)
        assert backend.tokens == []  # what was cached kept no layer inputs: it runs again
        backend.prefill(ids[:-1])
        backend.forward([ids[-1]])
        torch.testing.assert_close(backend.cached_layer_features(), reference(backend, ids), atol=1e-4, rtol=1e-4)
        # A tree's kept branch moves its rows, the layer inputs with them.
        base = len(backend.tokens)
        backend.forward_tree([11, 12, 13, 14], [-1, -1, 1, 2])
        backend.keep_nodes([1, 2, 3])
        assert backend.cached_layer_features().shape == (base + 3, len(LAYERS) * 64)
        torch.testing.assert_close(
            backend.cached_layer_features(base - 2), reference(backend, ids + [12, 13, 14])[-5:], atol=1e-4, rtol=1e-4
        )
        backend.watch_layers(())
        assert backend._layer_store is None and backend.tokens  # stopping keeps the cache
    finally:
        backend.close()
