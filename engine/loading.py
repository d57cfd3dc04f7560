"""From what a user typed ("default", a path, a repo id) to a loaded backend or drafter."""

from __future__ import annotations

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

    # A GGUF file goes through transformers' gguf_file loading (dequantized).
    return TorchBackend(
        ref.path, device=device, dtype=dtype, n_ctx=n_ctx, name=ref.name, trust_remote_code=trust_remote_code
    )


def refuse_incompatible_pair(target: Backend, draft: str) -> None:
    """Run the pair doctor before the draft model loads: the rule compares p and q by token id,
    so a draft whose ids mean other words than the target's cannot be used at all."""
    from .doctor import check_pair

    report = check_pair(target.info.path, draft)
    errors = [f for f in report.findings if f.severity == "error"]
    if errors:
        reasons = " ".join(f"{f.title}: {f.detail}" for f in errors)
        raise IncompatiblePairError(f"{draft} cannot draft for {target.info.name}. {reasons}")


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

    refuse_incompatible_pair(target, draft)
    draft_model = load_backend(draft, backend=draft_backend, **load_options)
    try:
        return ModelDrafter(draft_model, target.vocab_size)
    except Exception:
        draft_model.close()
        raise
