"""The EAGLE-3 drafter's registry entry: a head fed by three target layers, with its own draft
vocabulary (eagle3.py is the algorithm, eagle.py's tree)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.backends.capabilities import LayerFeatures, ModelParts, TreeForward
from engine.drafters.eagle_spec import TREE_DEPTH_HELP, EagleStats, HeadKind, head_findings, tree_depth
from engine.drafters.medusa_spec import HEADS_HELP
from engine.drafters.registry import AUTO, DrafterSpec, heads_ready, setting
from engine.lazy import named

TRAIN_HINT = "Models ▸ Train heads…, Kind EAGLE-3"


@dataclass(frozen=True)
class Eagle3Options:
    heads: str | None = setting(None, label="EAGLE-3 head", help=HEADS_HELP, cli="--heads", kind="path")
    tree_depth: int | str = setting(AUTO, label="Tree depth", minimum=1, auto=True, help=TREE_DEPTH_HELP)


def make(target, options: Eagle3Options, load):
    """An EAGLE-3 head on `target`'s layers, in the target's device and dtype."""
    from engine.drafters.heads_loading import heads_folder, heads_memory, placement

    depth = tree_depth(options.tree_depth)
    folder = heads_folder("eagle3", "EAGLE-3 head", target, options.heads)
    from engine.heads.eagle3 import load_head

    Eagle3Drafter = named("engine.drafters.eagle3:Eagle3Drafter")  # eagle3.py imports this module

    with heads_memory("the EAGLE-3 head", folder, target):
        head = load_head(folder, target.text_config)
        device, dtype = placement(target.lm_head)
        return Eagle3Drafter(head.to(device=device, dtype=dtype), target, max_depth=depth)


def preflight(ctx, options: Eagle3Options) -> list:
    """EAGLE-3 needs a head made for the target: its hidden size, vocabulary and layers."""
    from engine.heads.eagle3 import default_layers, read_config

    def layers(config, meta) -> tuple[int, ...]:
        return config.layers or (default_layers(meta.n_layers) if meta.n_layers else ())

    def outside(config, meta) -> list[str]:
        if meta.n_layers and any(not 0 <= i < meta.n_layers for i in layers(config, meta)):
            return [f"target layers {list(layers(config, meta))} ({ctx.target.name} has {meta.n_layers})"]
        return []

    return head_findings(
        ctx,
        options,
        HeadKind(
            "eagle3",
            "EAGLE-3",
            read_config,
            f"Train one for this target ({TRAIN_HINT}), or choose an EAGLE-3 head folder (SafeAILab's EAGLE-3 "
            "heads for Llama-family models load as they are published).",
            TRAIN_HINT,
            outside,
            lambda config: (
                f"EAGLE-3 head over {config.draft_vocab_size:,} draft tokens, reading layers "
                f"{list(config.layers) or 'the default'}"
            ),
        ),
    )


DRAFTER = DrafterSpec(
    name="eagle3",
    label="EAGLE-3",
    choice_label="EAGLE-3 head",
    summary="A one-layer EAGLE-3 head reads three of the target's layers and drafts a tree over its own draft "
    "vocabulary (PyTorch only).",
    options=Eagle3Options,
    needs=(LayerFeatures, TreeForward, ModelParts),
    make=make,
    preflight=preflight,
    stats=EagleStats,
    torch_reason=(
        "An EAGLE-3 head reads the inputs of three of the target's layers and drafts a tree of "
        "candidates; llama.cpp exposes neither."
    ),
    trees=True,
    order=60,
    short_name="EAGLE-3 head",
    reads_weights=True,
    ready=heads_ready("eagle3"),
)
