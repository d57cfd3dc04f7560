"""Shared fixtures: real models are loaded once per test session."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def default_gguf() -> str:
    from engine.models.locate import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def default_llama(default_gguf):
    """The embedded SmolLM2-135M-Instruct on llama.cpp, shared by every test that only reads it."""
    from engine.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(default_gguf, n_ctx=2048)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def embedded_hf_dir(default_gguf, tmp_path_factory) -> str:
    """The embedded model as a float32 safetensors folder.

    transformers takes ~20 s to load the GGUF (it parses the file three times);
    converting once per session lets every torch test load it in about a second.
    """
    from engine.backends.hf.backend import TorchBackend

    folder = tmp_path_factory.mktemp("smollm2-fp32")
    backend = TorchBackend(default_gguf, dtype="float32")
    backend._model.save_pretrained(folder)
    backend._tok.save_pretrained(folder)
    backend.close()
    return str(folder)
