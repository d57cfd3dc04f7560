"""The PyTorch backend as a loader and two backends: what each declares, what they share.

TorchBackend loads once (engine/backends/hf/loader.py) and returns the backend that
runs the model: NativeBackend (every capability) or TransformersBackend (the model's
parts only). Training loads through the same loader, so a base model's chat, its EOS
ids and its rotary embedding are the ones decoding sees.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from engine.backends.capabilities import (
    CachedKV,
    HiddenFeatures,
    LayerExit,
    LayerFeatures,
    ModelParts,
    Slots,
    TreeForward,
    has,
)
from engine.backends.hf.backend import TorchBackend
from engine.backends.hf.base import HFBackend
from engine.backends.hf.loader import load
from engine.backends.hf.native_backend import NativeBackend
from engine.backends.hf.transformers_backend import TransformersBackend
from engine.core.text import plain_chat
from engine.errors import ModelLoadError
from tests.factories.fake import MarkovBackend, random_transition
from tests.factories.hf_models import make_tiny_llama

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
ALL = (TreeForward, HiddenFeatures, LayerFeatures, LayerExit, ModelParts)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("split") / "target", seed=0, n_layers=1)


@pytest.fixture(scope="module")
def base_dir(tiny_dir, tmp_path_factory) -> str:
    """The tiny model without a chat template: a base model."""
    folder = tmp_path_factory.mktemp("split") / "base"
    shutil.copytree(tiny_dir, folder)
    (folder / "chat_template.jinja").unlink()
    return str(folder)


def test_each_backend_class_declares_its_own_capabilities():
    assert NativeBackend.capabilities == frozenset({*ALL, Slots})  # more sequences on its weights
    assert TransformersBackend.capabilities == frozenset({ModelParts, HiddenFeatures, CachedKV})
    from engine.backends.llama_cpp import LlamaCppBackend

    assert LlamaCppBackend.capabilities == frozenset()
    assert all(issubclass(cls, HFBackend) for cls in (NativeBackend, TransformersBackend))


def test_the_entry_point_picks_the_path_and_the_flags_follow_the_capabilities(tiny_dir):
    native = TorchBackend(tiny_dir, dtype="float32")  # "auto": native for a llama
    plain = TorchBackend(tiny_dir, dtype="float32", impl="transformers")
    try:
        assert type(native) is NativeBackend and type(plain) is TransformersBackend
        assert all(has(native, c) for c in ALL)
        assert has(plain, ModelParts) and has(plain, HiddenFeatures)
        assert not any(has(plain, c) for c in (TreeForward, LayerExit))
        assert (native.supports_tree, native.supports_features, native.supports_early_exit) == (True, True, True)
        assert (plain.supports_tree, plain.supports_features, plain.supports_early_exit) == (False, True, False)
        # The model's parts agree on both paths: the same embeddings, rotary embedding and head.
        ids, positions = torch.tensor([5, 17, 300]), torch.arange(3)
        torch.testing.assert_close(native.embed(ids), plain.embed(ids))
        for got, want in zip(native.rope(positions), plain.rope(positions)):
            torch.testing.assert_close(got, want)
        hidden = torch.randn(2, native.hidden_size)
        torch.testing.assert_close(native.lm_head(hidden), plain.lm_head(hidden))
        # And the same final-norm hidden states, of the rows just run and of every cached token.
        prompt = [1, 5, 17, 300, 42, 7]
        for backend in (native, plain):
            backend.prefill(prompt[:4])
            backend.forward(prompt[4:])
            backend.rollback(5)
        torch.testing.assert_close(native.last_features(), plain.last_features(), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(native.cached_features(), plain.cached_features(), atol=1e-4, rtol=1e-4)
        assert plain.cached_features().shape == (5, plain.hidden_size)
    finally:
        native.close()
        plain.close()


def test_setting_a_flag_on_an_instance_changes_that_instance_only():
    one, other = (MarkovBackend(random_transition(4, seed=0)) for _ in range(2))
    one.supports_tree = True
    assert has(one, TreeForward) and one.supports_tree
    assert not has(other, TreeForward) and not other.supports_tree
    one.supports_tree = False
    assert not has(one, TreeForward)


def test_without_a_template_every_path_renders_the_same_plain_lines(base_dir):
    from engine.training.target import load_target

    native = TorchBackend(base_dir, dtype="float32")
    plain = TorchBackend(base_dir, dtype="float32", impl="transformers")
    target = load_target(base_dir, device="cpu", dtype="float32")
    try:
        assert native.chat_template is None
        ids = native.apply_chat_template(CHAT)
        assert native.detokenize(ids) == plain_chat(CHAT) == "system: Be brief.\nuser: hi\nassistant:"
        assert plain.apply_chat_template(CHAT) == ids
        assert target.encode_chat(CHAT, reply=True) == ids  # training reads what decoding will see
        assert native.detokenize(target.encode_chat(CHAT)) == plain_chat(CHAT, reply=False)
    finally:
        native.close()
        plain.close()
        target.close()


def test_with_a_template_training_and_decoding_render_the_chat_alike(tiny_dir):
    from engine.training.target import load_target

    backend = TorchBackend(tiny_dir, dtype="float32")
    target = load_target(tiny_dir, device="cpu", dtype="float32")
    try:
        assert target.encode_chat(CHAT, reply=True) == backend.apply_chat_template(CHAT)
        assert target.stop_ids() == backend.eos_ids == frozenset({2})
        for got, want in zip(target.rope(torch.arange(4)), backend.rope(torch.arange(4))):
            torch.testing.assert_close(got, want)
    finally:
        backend.close()
        target.close()


def test_training_loads_through_the_loader_and_never_runs_a_pickle(tiny_dir, tmp_path):
    from engine.training.target import load_target

    folder = tmp_path / "bin"
    shutil.copytree(tiny_dir, folder)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    torch.save({"model.embed_tokens.weight": _Exploit(str(marker))}, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError):
        load_target(str(folder), device="cpu", dtype="float32")
    assert not marker.exists()


def test_a_loaded_model_states_its_facts_once(tiny_dir):
    loaded = load(tiny_dir, device="cpu", dtype="int8", n_ctx=64)
    try:
        assert (loaded.n_ctx, loaded.context_length, loaded.weights) == (64, 2048, "int8")
        assert loaded.dtype_label.startswith("int8 (weights) / ")
        assert loaded.eos_ids == frozenset({2}) and loaded.vocab_size == 49152
        element = torch.empty(0, dtype=loaded.dtype).element_size()
        assert loaded.weight_bytes == element * loaded.n_params  # the float weights as loaded
    finally:
        loaded.release()
    assert loaded.model is None


class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))
