"""From what a user typed ("default", a path, a repo id) to a loaded backend.

Drafters are made by the registry (engine/drafters/registry.py: `make_drafter`)."""

from __future__ import annotations

from engine.backends.base import Backend, LoadProgress
from engine.config import BACKENDS
from engine.errors import ConfigError, IncompatiblePairError
from engine.models.locate import resolve


def load_backend(
    spec: str,
    *,
    backend: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
    n_ctx: int | None = None,
    threads: int | None = None,
    gpu_layers: int | str = "auto",
    compile: str = "auto",
    trust_remote_code: bool = False,
    progress: LoadProgress | None = None,
    slots: int = 1,
) -> Backend:
    """Load a model: GGUF files go to llama.cpp and folders to PyTorch unless `backend` says otherwise.
    `compile` is the PyTorch native forward's path (auto, on, off: engine/backends/hf/static.py).
    `progress` hears what the load is doing and the fraction of it done. `slots`: sequences the model
    holds at once (engine/backends/capabilities.py Slots), each with a context of `n_ctx`."""
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
        from engine.backends.llama_cpp import LlamaCppBackend

        if dtype not in ("auto", None):
            raise ConfigError(
                "The llama.cpp backend runs a GGUF file in the precision it was saved in; "
                "leave dtype on auto, or use the torch backend to choose one."
            )
        return LlamaCppBackend(
            ref.path,
            n_ctx=n_ctx,
            n_threads=threads,
            n_gpu_layers=gpu_layers,
            name=ref.name,
            progress=progress,
            **({"slots": slots} if slots != 1 else {}),
        )

    from engine.backends.hf.backend import TorchBackend

    # A GGUF file goes through transformers' gguf_file loading (dequantized). Named as gguf_file, since
    # an Ollama blob ("sha256-<hex>") lacks the .gguf ending that would otherwise say it is one.
    gguf = {"gguf_file": ref.path} if ref.kind == "gguf" else {}
    backend = TorchBackend(
        ref.path,
        device=device,
        dtype=dtype,
        n_ctx=n_ctx,
        name=ref.name,
        trust_remote_code=trust_remote_code,
        progress=progress,
        compile=compile,
        **gguf,
    )
    if slots != 1:
        from engine.backends.capabilities import Slots, has

        if not has(backend, Slots):
            backend.close()
            raise ConfigError(
                f"{ref.name} runs on transformers' own forward, which decodes one sequence at a time: "
                "serve it with --parallel 1, or choose a model of the llama, mistral, qwen2 or qwen3 "
                "architecture (the native forward batches)."
            )
        backend.max_slots = slots
    return backend


def refuse_incompatible_pair(target: Backend, draft: str) -> None:
    """Run the pair doctor before the draft model loads: the rule compares p and q by token id,
    so a draft whose ids mean other words than the target's cannot be used at all."""
    from engine.models.doctor import check_pair

    report = check_pair(target.info.path, draft, architectures=False)  # the draft's own load says
    errors = [f for f in report.findings if f.severity == "error"]
    if errors:
        reasons = " ".join(f"{f.title}: {f.detail}" for f in errors)
        raise IncompatiblePairError(f"{draft} cannot draft for {target.info.name}. {reasons}")
