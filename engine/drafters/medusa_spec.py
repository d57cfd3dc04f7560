"""The Medusa drafter's registry entry: heads on the target's hidden states (medusa.py is the algorithm)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.backends.capabilities import HiddenFeatures, ModelParts
from engine.drafters.registry import DrafterSpec, DrafterStats, heads_ready, setting, stat
from engine.lazy import named

HEADS_HELP = (
    "Medusa heads or EAGLE / EAGLE-3 head folder (implies --drafter medusa unless --drafter eagle "
    "or eagle3; default: the ones shipped for the target)"
)


@dataclass(frozen=True)
class MedusaOptions:
    heads: str | None = setting(None, label="Medusa heads", help=HEADS_HELP, cli="--heads", kind="path")


@dataclass(frozen=True)
class MedusaStats(DrafterStats):
    heads: int = stat(label="Heads", chart=False)
    candidates_per_head: int = stat(label="Candidates per head", chart=False)
    nodes: int = stat(label="Tree nodes", chart=False)
    # Per head: how often its best candidate, and any of its candidates, was right.
    head_top1: tuple[float, ...] = stat(label="Head top-1 accuracy", chart=False)
    head_top_k: tuple[float, ...] = stat(label="Head top-k accuracy", chart=False)
    scored: tuple[int, ...] = stat(label="Guesses scored per head", chart=False)


def make(target, options: MedusaOptions, load):
    """Medusa heads on `target`'s hidden states, cast to the target's device and dtype."""
    from engine.drafters.heads_loading import heads_folder, heads_memory, placement

    folder = heads_folder("medusa", "Medusa heads", target, options.heads)
    from engine.heads.medusa import load_heads

    MedusaDrafter = named("engine.drafters.medusa:MedusaDrafter")  # medusa.py imports this module

    lm_head = target.lm_head
    with heads_memory("the Medusa heads", folder, target):
        loaded = load_heads(folder, target.hidden_size, target.vocab_size, lm_head)
        device, dtype = placement(lm_head)
        return MedusaDrafter(loaded.to(device=device, dtype=dtype), target)


def preflight(ctx, options: MedusaOptions) -> list:
    """Medusa needs heads made for the target's hidden size."""
    from engine.drafters.heads_loading import describe_config
    from engine.errors import SpecDeckError
    from engine.heads.medusa import read_config
    from engine.models.doctor import Finding

    meta = ctx.meta()
    if isinstance(meta, Finding):
        return [meta]
    heads = (options.heads or "").strip()
    folder = heads or ctx.shipped_heads("medusa")
    if not folder:
        return [
            Finding(
                "error",
                f"No Medusa heads ship for {ctx.target.name}",
                "Train heads for this target (Models ▸ Train heads…), or choose a heads folder.",
            )
        ]
    try:
        config = read_config(folder)
    except SpecDeckError as e:
        return [Finding("error", "Cannot use these Medusa heads", str(e))]
    if meta.hidden_size and config.hidden_size != meta.hidden_size:
        return [
            Finding(
                "error",
                "These heads belong to another model",
                f"They were trained for a hidden size of {config.hidden_size} "
                f"({config.base_model or 'unknown base model'}); {ctx.target.name} has {meta.hidden_size}. "
                "Train heads for this target (Models ▸ Train heads…).",
            )
        ]
    where = "shipped with SpecDeck" if not heads else folder
    described = describe_config(config, f"{config.num_heads} heads", None)
    return [Finding("ok", "Medusa heads fit the target", f"{described} ({where}).")]


DRAFTER = DrafterSpec(
    name="medusa",
    label="Medusa",
    choice_label="Medusa heads (on the target's hidden states)",
    summary="Medusa heads guess the next few tokens from the target's last hidden state (PyTorch only).",
    options=MedusaOptions,
    needs=(HiddenFeatures, ModelParts),
    make=make,
    preflight=preflight,
    stats=MedusaStats,
    torch_reason="Medusa heads read the target's hidden states, which llama.cpp does not expose.",
    trees=True,
    order=40,
    short_name="Medusa heads",
    depth_label="head",
    reads_weights=True,
    ready=heads_ready("medusa"),
)
