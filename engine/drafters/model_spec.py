"""The draft-model drafter's registry entry: a separate, smaller model (model.py is the algorithm).

Its options are the draft model and the draft's own load options (engine/models/load_options.py:
one left unset follows the target's where it applies). A config with a draft model is a config
with drafter "model": the CLI's --draft implies --drafter model.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.drafters.registry import DrafterSpec, setting
from engine.lazy import named

BACKENDS = ("auto", "torch", "llama.cpp")


@dataclass(frozen=True)
class ModelOptions:
    draft: str | None = setting(
        None, label="Draft model", help="a draft model (same forms as --target)", cli=("-md", "--draft"), kind="model"
    )
    backend: str = setting(
        "auto",
        label="Draft backend",
        choices=BACKENDS,
        cli="--draft-backend",
        kind="backend",
        help="the draft model's backend: auto (default), torch or llama.cpp",
    )
    device: str | None = setting(
        None,
        label="Draft device",
        cli="--draft-device",
        kind="device",
        help="the draft model's device (PyTorch draft; default: the target's --device)",
    )
    dtype: str | None = setting(
        None,
        label="Draft dtype",
        cli="--draft-dtype",
        kind="dtype",
        help="the draft model's dtype (PyTorch draft; default: the target's --dtype; "
        "a llama.cpp draft runs in its GGUF file's precision)",
    )
    threads: int | None = setting(
        None,
        label="Draft threads",
        minimum=1,
        cli="--draft-threads",
        help="CPU threads of a llama.cpp draft model (default: --threads)",
    )
    gpu_layers: int | str | None = setting(
        None,
        label="Draft GPU layers",
        minimum=-1,
        auto=True,
        cli="--draft-gpu-layers",
        kind="gpu-layers",
        help="layers of a llama.cpp draft model offloaded to the GPU: auto, "
        "-1 or all, 0 or a count (default: --gpu-layers)",
    )


def make(target, options: ModelOptions, load):
    """Refuse a draft whose token ids mean other words (the pair doctor), then load it."""
    from engine.errors import ConfigError
    from engine.models.load_options import draft_load_options

    load_backend = named("engine.models.loading:load_backend")  # loading is above the configuration
    refuse_incompatible_pair = named("engine.models.loading:refuse_incompatible_pair")

    if not options.draft:
        raise ConfigError("The model drafter needs a draft model: give one with --draft.")
    ModelDrafter = named("engine.drafters.model:ModelDrafter")  # model.py imports this module

    refuse_incompatible_pair(target, options.draft)
    progress = {"progress": load.progress} if load.progress else {}
    draft_model = load_backend(
        options.draft, backend=options.backend, **draft_load_options(options, load.target_options), **progress
    )
    try:
        return ModelDrafter(draft_model, target.vocab_size)
    except Exception:
        draft_model.close()
        raise


def preflight(ctx, options: ModelOptions) -> list:
    """The pair doctor on target and draft (the report the dialog shows), and the draft's load rules."""
    from engine.errors import SpecDeckError
    from engine.models.doctor import Finding, check_pair
    from engine.models.load_options import draft_load_options, target_load_options

    draft = ctx.resolve("draft model", options.draft or "")
    own = draft_load_options(options, target_load_options(ctx.config))
    draft_on = ctx.placement(draft, options.backend, own["device"], own["gpu_layers"])
    try:
        report = check_pair(
            ctx.target, draft, n_ctx=ctx.n_ctx, dtype=ctx.dtype, target_on=ctx.target_placement(), draft_on=draft_on
        )
    except SpecDeckError as e:
        raise ctx.stop(Finding("error", "Cannot check this pair", str(e))) from e
    ctx.report = report
    return [*report.findings, *ctx.backend_rules("draft model", draft, options.backend, options.dtype)]


DRAFTER = DrafterSpec(
    name="model",
    label="Draft model",
    summary="A separate, smaller model of the target's family drafts; the target verifies its tokens.",
    options=ModelOptions,
    make=make,
    preflight=preflight,
    loads_model=True,
    draft_probabilities=True,
    order=30,
    short_name="draft model",
    ready=lambda target, options: bool(options.draft),  # auto-tune never loads a second model
)
