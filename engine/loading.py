"""From what a user typed ("default", a path, a repo id) to a loaded backend or drafter."""

from __future__ import annotations

import os

from .backends.base import Backend
from .drafters.base import Drafter
from .errors import ConfigError, IncompatiblePairError
from .models import resolve

BACKENDS = ("auto", "torch", "llama.cpp")
DRAFTERS = ("none", "ngram", "model")


def load_backend(
    spec: str,
    *,
    backend: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
    n_ctx: int | None = None,
    threads: int | None = None,
    gpu_layers: int = 0,
    trust_remote_code: bool = False,
) -> Backend:
    """Load a model: GGUF files go to llama.cpp and folders to PyTorch unless `backend` says otherwise."""
    if backend not in BACKENDS:
        raise ConfigError(f"Unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}.")
    ref = resolve(spec)
    chosen = backend if backend != "auto" else ("llama.cpp" if ref.kind == "gguf" else "torch")
    if chosen == "llama.cpp":
        if ref.kind != "gguf":
            raise ConfigError(
                f"{ref.name} is a Hugging Face folder; llama.cpp needs a GGUF file. "
                "Use the torch backend, or convert the model to GGUF."
            )
        from .backends.llama_backend import LlamaCppBackend

        if dtype not in ("auto", None):
            raise ConfigError(
                "The llama.cpp backend runs a GGUF file in the precision it was saved in; "
                "leave dtype on auto, or use the torch backend to choose one."
            )
        return LlamaCppBackend(ref.path, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=gpu_layers, name=ref.name)

    from .backends.torch_backend import TorchBackend

    if ref.kind == "gguf":
        folder, filename = os.path.split(ref.path)
        return TorchBackend(folder, gguf_file=filename, device=device, dtype=dtype, n_ctx=n_ctx, name=ref.name)
    return TorchBackend(
        ref.path, device=device, dtype=dtype, n_ctx=n_ctx, name=ref.name, trust_remote_code=trust_remote_code
    )


def check_vocabularies(target: Backend, draft: Backend) -> None:
    """Refuse a pair whose token ids mean different things (the rule compares p and q by id)."""
    n = min(target.vocab_size, draft.vocab_size)
    for token_id in range(n):
        if target.token_text(token_id) != draft.token_text(token_id):
            raise IncompatiblePairError(
                f"{draft.info.name} cannot draft for {target.info.name}: their vocabularies differ "
                f"(token {token_id} is {target.token_text(token_id)!r} for the target and "
                f"{draft.token_text(token_id)!r} for the draft). Pick a draft model from the target's family."
            )


def make_drafter(
    kind: str,
    target: Backend,
    *,
    draft: str | None = None,
    draft_backend: str = "auto",
    ngram_max: int = 3,
    **load_options,
) -> Drafter | None:
    """The drafter a user asked for; `draft` (a model spec) implies kind "model"."""
    if draft is not None:
        kind = "model"
    if kind not in DRAFTERS:
        raise ConfigError(f"Unknown drafter {kind!r}: choose one of {', '.join(DRAFTERS)}.")
    if kind == "none":
        return None
    if kind == "ngram":
        from .drafters.ngram import NgramDrafter

        return NgramDrafter(max_ngram=ngram_max)
    if draft is None:
        raise ConfigError("The model drafter needs a draft model: give one with --draft.")
    from .drafters.model import ModelDrafter

    draft_model = load_backend(draft, backend=draft_backend, **load_options)
    try:
        check_vocabularies(target, draft_model)
        return ModelDrafter(draft_model, target.vocab_size)
    except Exception:
        draft_model.close()
        raise
