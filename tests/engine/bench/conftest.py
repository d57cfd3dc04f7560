"""Fixtures the load test's modules share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    """A tiny random Llama folder (PyTorch native forward, which has Slots): made once, since making
    one imports transformers and takes seconds."""
    from tests.factories.hf_models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny", seed=0)
