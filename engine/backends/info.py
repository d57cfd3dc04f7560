"""`ModelInfo`: what a loaded model is, as plain data.

Light (no torch), so that what the engine says about a model can travel: to the
desktop app, which never imports torch, and over the engine server's wire.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    name: str  # what a user would call it: file or folder name, or repo id
    path: str  # file or folder it was loaded from
    backend: str  # "torch" | "llama.cpp"
    architecture: str  # "llama", "qwen2", ...
    n_params: int  # weights, embeddings included
    weight_bytes: int  # bytes of weights read per token (tied embeddings counted once)
    vocab_size: int  # width of the logits
    n_layers: int
    context_length: int  # what the model was trained for
    dtype: str  # "float32", "bfloat16", "Q4_1", ...
    device: str  # "cpu", "cuda", "mps", "cpu+gpu layers"...
    placement: str = ""  # where the layers went, in words, when a backend chose it: "all 30 layers on the GPU"
    forward: str = ""  # how the forward runs, where a backend has several ways: "native forward, eager"...
