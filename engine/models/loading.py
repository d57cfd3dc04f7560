"""From what a user typed ("default", a path, a repo id) to a loaded backend or drafter."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from engine.backends.base import Backend, LoadProgress
from engine.drafters.base import Drafter
from engine.errors import ConfigError, IncompatiblePairError
from engine.models.memory_errors import model_out_of_memory, unexplained_allocation_failure
from engine.models.locate import resolve

if TYPE_CHECKING:
    import torch

BACKENDS = ("auto", "torch", "llama.cpp")
DRAFTERS = ("none", "ngram", "model", "medusa", "eagle", "lookahead", "early-exit")
HEAD_DRAFTERS = ("medusa", "eagle")  # drafters that read trained heads (--heads)
# Drafters that need the PyTorch backend (hidden states, tree masks, or the target's layers).
TORCH_DRAFTERS = frozenset({"medusa", "eagle", "lookahead", "early-exit"})


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
    progress: LoadProgress | None = None,
) -> Backend:
    """Load a model: GGUF files go to llama.cpp and folders to PyTorch unless `backend` says otherwise.
    `progress` hears what the load is doing and the fraction of it done."""
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
        return LlamaCppBackend(ref.path, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=gpu_layers, name=ref.name,
                               progress=progress)  # fmt: skip

    from engine.backends.hf.backend import TorchBackend

    # A GGUF file goes through transformers' gguf_file loading (dequantized). Named as gguf_file, since
    # an Ollama blob ("sha256-<hex>") lacks the .gguf ending that would otherwise say it is one.
    gguf = {"gguf_file": ref.path} if ref.kind == "gguf" else {}
    return TorchBackend(
        ref.path, device=device, dtype=dtype, n_ctx=n_ctx, name=ref.name, trust_remote_code=trust_remote_code,
        progress=progress, **gguf,
    )


def refuse_incompatible_pair(target: Backend, draft: str) -> None:
    """Run the pair doctor before the draft model loads: the rule compares p and q by token id,
    so a draft whose ids mean other words than the target's cannot be used at all."""
    from engine.models.doctor import check_pair

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
    heads: str | None = None,
    tree_depth: int | None = None,
    lookahead: tuple[int | str, int | str, int | str] = ("auto", "auto", "auto"),
    exit_layer: int | str = "auto",
    **load_options,
) -> Drafter | None:
    """The drafter a user asked for; `draft` (a model spec) implies kind "model".

    `heads` is the Medusa heads or EAGLE head folder (kinds "medusa", "eagle"); without
    one, the heads shipped for the target (resources/heads/<kind>-<model>/), if any.
    `tree_depth`: EAGLE's deepest tree level (None = its default). `lookahead`: the
    window W, n-gram size N and candidates G of lookahead decoding ("auto" = from the
    verify-cost curve). `exit_layer`: the early-exit drafter's L ("auto" = measured).
    """
    if draft is not None:
        kind = "model"
    if kind not in DRAFTERS:
        raise ConfigError(f"Unknown drafter {kind!r}: choose one of {', '.join(DRAFTERS)}.")
    if kind == "none":
        return None
    if kind == "ngram":
        from engine.drafters.ngram import NgramDrafter

        return NgramDrafter(max_ngram=ngram_max)
    if kind == "medusa":
        return make_medusa_drafter(target, heads)
    if kind == "eagle":
        return make_eagle_drafter(target, heads, tree_depth)
    if kind == "lookahead":
        from engine.drafters.lookahead import LookaheadDrafter

        window, ngram, candidates = lookahead
        return LookaheadDrafter(target, window=window, ngram=ngram, candidates=candidates)
    if kind == "early-exit":
        from engine.drafters.early_exit import EarlyExitDrafter

        return EarlyExitDrafter(target, layers=exit_layer)
    if draft is None:
        raise ConfigError("The model drafter needs a draft model: give one with --draft.")
    from engine.drafters.model import ModelDrafter

    refuse_incompatible_pair(target, draft)
    draft_model = load_backend(draft, backend=draft_backend, **load_options)
    try:
        return ModelDrafter(draft_model, target.vocab_size)
    except Exception:
        draft_model.close()
        raise


def make_medusa_drafter(target: Backend, heads: str | None) -> Drafter:
    """Medusa heads on `target`'s hidden states, cast to the target's device and dtype."""
    if not target.supports_features:
        raise ConfigError(
            f"Medusa heads read the target's hidden states, which the {target.name} backend does not "
            f"expose: load {target.info.name} with the PyTorch backend (--backend torch, or a Hugging "
            "Face model folder), or choose another drafter (n-gram or a draft model)."
        )
    folder = _heads_folder("medusa", "Medusa heads", target, heads)
    from engine.drafters.medusa import MedusaDrafter
    from engine.heads.medusa import load_heads

    lm_head = target.lm_head
    with _heads_memory("the Medusa heads", folder, target):
        loaded = load_heads(folder, target.hidden_size, target.vocab_size, lm_head)
        device, dtype = _placement(lm_head)
        return MedusaDrafter(loaded.to(device=device, dtype=dtype), target)


def make_eagle_drafter(target: Backend, heads: str | None, tree_depth: int | None = None) -> Drafter:
    """An EAGLE head on `target`'s features, in the target's device and dtype."""
    if not target.supports_features or not target.supports_tree:
        raise ConfigError(
            f"EAGLE reads the target's hidden states and drafts trees, which the {target.name} backend "
            f"cannot serve: load {target.info.name} with the PyTorch backend (--backend torch, or a Hugging "
            "Face model folder), or choose another drafter (n-gram or a draft model)."
        )
    folder = _heads_folder("eagle", "EAGLE head", target, heads)
    from engine.drafters.eagle import MAX_DEPTH, EagleDrafter
    from engine.heads.eagle import EagleConfig, load_head

    with _heads_memory("the EAGLE head", folder, target):
        head = load_head(folder, EagleConfig.for_target(target.text_config))
        device, dtype = _placement(target.lm_head)
        return EagleDrafter(head.to(device=device, dtype=dtype), target, max_depth=tree_depth or MAX_DEPTH)


@contextmanager
def _heads_memory(what: str, folder: str, target: Backend) -> Iterator[None]:
    """A failed allocation while loading draft heads, said as OutOfMemoryError with what the
    target already holds (the heads come on top of it)."""
    try:
        yield
    except Exception as error:
        if not unexplained_allocation_failure(error):
            raise
        raise model_out_of_memory(
            f"load {what} in {folder} beside {target.info.name}", target.info, target.n_ctx
        ) from error


def _heads_folder(kind: str, what: str, target: Backend, heads: str | None) -> str:
    """The heads folder asked for, else the one shipped for this target; a ConfigError saying
    how to get one when there is neither."""
    from engine.models.shipped import default_heads_dir

    folder = heads or default_heads_dir(kind, target.info)
    if folder is None:
        raise ConfigError(
            f"No {what} for {target.info.name}: train some with "
            f"`specdeck-cli train-heads --kind {kind} ...` or pass --heads DIR."
        )
    return folder


def _placement(module) -> tuple[torch.device | None, torch.dtype | None]:
    """Device and compute dtype of the target's LM head (an int8 head computes in its
    `compute_dtype`; its weights are int8 buffers, not parameters)."""
    tensors = [*module.parameters(), *module.buffers()]
    device = tensors[0].device if tensors else None
    dtype = getattr(module, "compute_dtype", None)
    if dtype is None:
        dtype = next((t.dtype for t in tensors if t.is_floating_point()), None)
    return device, dtype
