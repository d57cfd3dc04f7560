"""What the pair doctor reads from a hybrid's files: only its attention layers keep a KV cache.

A hybrid (Qwen3.5, LFM2, Nemotron-H) keeps a fixed-size recurrent state in most layers and a
cache entry per token in a few; counting every layer as attention overstated the memory a long
context needs by the ratio (4x for Qwen3.5), so the doctor and the drafter discovery called
pairs "too big for the memory left" that fit.
"""

from __future__ import annotations

import pytest

from engine.models.doctor import estimate_memory
from engine.models.locate import resolve
from engine.models.metadata import read_metadata
from tests.factories.hybrid_gguf import (
    make_granite_hybrid_gguf,
    make_lfm2_gguf,
    make_mamba2_gguf,
    make_nemotron_h_gguf,
    make_qwen35_gguf,
)
from tests.factories.hybrid_models import make_hybrid_model

N_CTX = 4096


def kv_bytes_per_layer(meta) -> int:
    return 2 * meta.n_kv_heads * meta.head_dim * N_CTX


@pytest.mark.parametrize(
    ("make", "kv_layers"),
    [
        (make_qwen35_gguf, 1),
        (make_lfm2_gguf, 1),
        (make_nemotron_h_gguf, None),
        (make_granite_hybrid_gguf, 1),
        (make_mamba2_gguf, 0),
    ],
    ids=["qwen35", "lfm2", "nemotron_h", "granitehybrid", "mamba2"],
)
def test_a_hybrid_gguf_counts_its_attention_layers_only(tmp_path, make, kv_layers):
    meta = read_metadata(resolve(make(str(tmp_path / "m.gguf"))))
    _, kv = estimate_memory(meta, N_CTX)
    if kv_layers is None:  # Nemotron-H: the file's per-layer KV heads say which layers attend
        kv_layers = meta.kv_layers
        assert 0 < kv_layers < meta.n_layers
    assert meta.kv_layers == kv_layers
    assert kv == kv_layers * kv_bytes_per_layer(meta) * 2  # float16 cache on llama.cpp


@pytest.mark.parametrize(
    ("arch", "kv_layers"), [("qwen3_5", 1), ("lfm2", 2), ("nemotron_h", 1), ("granitemoehybrid", 1)]
)
def test_a_hybrid_folder_counts_its_attention_layers_only(tmp_path, arch, kv_layers):
    meta = read_metadata(resolve(make_hybrid_model(tmp_path / arch, arch)))
    assert meta.n_layers == 4 and meta.kv_layers == kv_layers  # Nemotron-H's config names no layer count
    _, kv = estimate_memory(meta, N_CTX, "float32")
    assert kv == kv_layers * kv_bytes_per_layer(meta) * 4
