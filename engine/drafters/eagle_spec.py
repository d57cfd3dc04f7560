"""The EAGLE drafter's registry entry: a head in the target's feature space (eagle.py is the algorithm)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.backends.capabilities import HiddenFeatures, ModelParts, TreeForward
from engine.drafters.medusa_spec import HEADS_HELP
from engine.drafters.registry import AUTO, DrafterSpec, DrafterStats, auto_or_int, heads_ready, setting, stat
from engine.lazy import named

MAX_DEPTH = 8  # the tree's deepest level when tree_depth is "auto" (eagle.py's MAX_DEPTH)
TREE_DEPTH_HELP = "eagle, eagle3: deepest level of the draft tree (default auto: 8)"


@dataclass(frozen=True)
class EagleOptions:
    heads: str | None = setting(None, label="EAGLE head", help=HEADS_HELP, cli="--heads", kind="path")
    tree_depth: int | str = setting(AUTO, label="Tree depth", minimum=1, auto=True, help=TREE_DEPTH_HELP)


@dataclass(frozen=True)
class EagleStats(DrafterStats):
    nodes: int = stat(label="Tree nodes", chart=False)
    depth: int = stat(label="Tree depth", chart=False)
    rounds: int = stat(label="Growth rounds", chart=False)
    top_k: int = stat(label="Children per node", chart=False)
    draft_vocab: int = stat(label="Draft vocabulary", unit="tokens", chart=False)
    calibration: float = stat(label="Calibration", chart=False)  # accepted / the draft's own estimate


def tree_depth(value) -> int:
    """The deepest tree level: MAX_DEPTH for "auto", else a whole number of 1 or more."""
    depth = auto_or_int(
        value,
        "The EAGLE tree depth",
        1,
        None,
        f"Leave it on auto ({MAX_DEPTH} levels) or give a whole number of 1 or more.",
    )
    return MAX_DEPTH if depth is None else depth


def make(target, options: EagleOptions, load):
    """An EAGLE head on `target`'s features, in the target's device and dtype."""
    from engine.drafters.heads_loading import heads_folder, heads_memory, placement

    depth = tree_depth(options.tree_depth)
    folder = heads_folder("eagle", "EAGLE head", target, options.heads)
    from engine.heads.eagle import EagleConfig, load_head

    EagleDrafter = named("engine.drafters.eagle:EagleDrafter")  # eagle.py imports this module

    with heads_memory("the EAGLE head", folder, target):
        head = load_head(folder, EagleConfig.for_target(target.text_config))
        device, dtype = placement(target.lm_head)
        return EagleDrafter(head.to(device=device, dtype=dtype), target, max_depth=depth)


def preflight(ctx, options: EagleOptions) -> list:
    """EAGLE needs a head made for the target's hidden size and vocabulary, and a tree depth of 1 or more."""
    from engine.heads.eagle import read_config

    return head_findings(
        ctx,
        options,
        HeadKind(
            "eagle",
            "EAGLE",
            read_config,
            "SpecDeck ships an EAGLE head for its built-in model only. Train one for this target "
            "(Models ▸ Train heads…, Kind EAGLE), or choose an EAGLE head folder.",
            "Models ▸ Train heads…, Kind EAGLE",
        ),
    )


@dataclass(frozen=True)
class HeadKind:
    """What the findings of a tree-drafting head (EAGLE, EAGLE-3) say about it."""

    name: str  # the drafter's and the shipped folder's kind: "eagle"
    label: str  # "EAGLE"
    read_config: Callable  # folder -> the head's config (a SpecDeckError when it cannot be used)
    none_shipped: str  # what to do when no head ships for the target
    train_hint: str  # where the app trains one
    # (config, target metadata) -> what else differs from the target, each as "a hidden size of ..."
    mismatches: Callable = lambda config, meta: []
    describe: Callable = lambda config: "EAGLE head"  # what the head is, for the "fits" finding


def head_findings(ctx, options, kind: HeadKind) -> list:
    """The findings for a head of `kind` on the target: the tree depth, whether a head is there,
    readable and made for the target's hidden size and vocabulary (and what `kind` checks besides)."""
    from engine.drafters.heads_loading import describe_config
    from engine.errors import ConfigError, SpecDeckError
    from engine.models.doctor import Finding

    findings = []
    try:
        tree_depth(options.tree_depth)
    except ConfigError:
        findings.append(
            Finding(
                "error",
                "The tree depth must be 1 or more",
                f"The {kind.label} tree depth is the deepest level drafted; {options.tree_depth} cannot be used. Leave "
                f"it on auto ({MAX_DEPTH} levels) or give a whole number of 1 or more.",
            )
        )
    meta = ctx.meta()
    if isinstance(meta, Finding):
        return findings + [meta]
    target = ctx.target
    heads = (options.heads or "").strip()
    folder = heads or ctx.shipped_heads(kind.name)
    if not folder:
        return findings + [Finding("error", f"No {kind.label} head ships for {target.name}", kind.none_shipped)]
    try:
        config = kind.read_config(folder)
    except SpecDeckError as e:
        return findings + [Finding("error", f"Cannot use this {kind.label} head", str(e))]
    mismatch = []
    if meta.hidden_size and config.hidden_size != meta.hidden_size:
        mismatch.append(f"a hidden size of {config.hidden_size} ({target.name} has {meta.hidden_size})")
    if meta.vocab_size and config.vocab_size and config.vocab_size != meta.vocab_size:
        mismatch.append(f"a vocabulary of {config.vocab_size} tokens ({target.name} has {meta.vocab_size})")
    mismatch += kind.mismatches(config, meta)
    if mismatch:
        return findings + [
            Finding(
                "error",
                f"This {kind.label} head belongs to another model",
                f"It was trained for {config.base_model or 'another model'} with {' and '.join(mismatch)}. "
                f"Train a head for this target ({kind.train_hint}).",
            )
        ]
    where = "shipped with SpecDeck" if not heads else folder
    auto = str(options.tree_depth).strip().lower() == AUTO
    depth = f"up to {MAX_DEPTH} levels (auto)" if auto else f"up to {options.tree_depth} levels"
    return findings + [
        Finding(
            "ok",
            f"The {kind.label} head fits the target",
            f"{describe_config(config, kind.describe(config), 'depth')} ({where}). Draft trees grow {depth}, "
            "where the head is most confident.",
        )
    ]


DRAFTER = DrafterSpec(
    name="eagle",
    label="EAGLE",
    choice_label="EAGLE head",
    summary="A one-layer EAGLE head runs in the target's feature space and drafts a tree (PyTorch only).",
    options=EagleOptions,
    needs=(HiddenFeatures, TreeForward, ModelParts),
    make=make,
    preflight=preflight,
    stats=EagleStats,
    torch_reason=(
        "An EAGLE head reads the target's hidden states and drafts a tree of candidates; llama.cpp exposes neither."
    ),
    trees=True,
    order=50,
    short_name="EAGLE head",
    reads_weights=True,
    ready=heads_ready("eagle"),
)
