"""The EAGLE drafter's registry entry: a head in the target's feature space (eagle.py is the algorithm)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.backends.capabilities import HiddenFeatures, ModelParts, TreeForward
from engine.drafters.medusa_spec import HEADS_HELP
from engine.drafters.registry import AUTO, DrafterSpec, DrafterStats, auto_or_int, setting, stat

MAX_DEPTH = 8  # the tree's deepest level when tree_depth is "auto" (eagle.py's MAX_DEPTH)


@dataclass(frozen=True)
class EagleOptions:
    heads: str | None = setting(None, label="EAGLE head", help=HEADS_HELP, cli="--heads", kind="path")
    tree_depth: int | str = setting(AUTO, label="Tree depth", minimum=1, auto=True,
                                    help="eagle: deepest level of the draft tree (default auto: 8)")


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
    depth = auto_or_int(value, "The EAGLE tree depth", 1, None,
                        f"Leave it on auto ({MAX_DEPTH} levels) or give a whole number of 1 or more.")
    return MAX_DEPTH if depth is None else depth


def make(target, options: EagleOptions, load):
    """An EAGLE head on `target`'s features, in the target's device and dtype."""
    from engine.drafters.heads_loading import heads_folder, heads_memory, placement

    depth = tree_depth(options.tree_depth)
    folder = heads_folder("eagle", "EAGLE head", target, options.heads)
    from engine.drafters.eagle import EagleDrafter
    from engine.heads.eagle import EagleConfig, load_head

    with heads_memory("the EAGLE head", folder, target):
        head = load_head(folder, EagleConfig.for_target(target.text_config))
        device, dtype = placement(target.lm_head)
        return EagleDrafter(head.to(device=device, dtype=dtype), target, max_depth=depth)


def preflight(ctx, options: EagleOptions) -> list:
    """EAGLE needs a head made for the target's hidden size and vocabulary, and a tree depth of 1 or more."""
    from engine.drafters.heads_loading import describe_config
    from engine.errors import ConfigError, SpecDeckError
    from engine.heads.eagle import read_config
    from engine.models.doctor import Finding

    findings = []
    try:
        tree_depth(options.tree_depth)
    except ConfigError:
        findings.append(Finding(
            "error", "The tree depth must be 1 or more",
            f"The EAGLE tree depth is the deepest level drafted; {options.tree_depth} cannot be used. Leave it on "
            f"auto ({MAX_DEPTH} levels) or give a whole number of 1 or more.",
        ))  # fmt: skip
    meta = ctx.meta()
    if isinstance(meta, Finding):
        return findings + [meta]
    target = ctx.target
    heads = (options.heads or "").strip()
    folder = heads or ctx.shipped_heads("eagle")
    if not folder:
        return findings + [Finding(
            "error", f"No EAGLE head ships for {target.name}",
            "SpecDeck ships an EAGLE head for its built-in model only. Train one for this target "
            "(Models ▸ Train heads…, Kind EAGLE), or choose an EAGLE head folder.",
        )]  # fmt: skip
    try:
        config = read_config(folder)
    except SpecDeckError as e:
        return findings + [Finding("error", "Cannot use this EAGLE head", str(e))]
    mismatch = []
    if meta.hidden_size and config.hidden_size != meta.hidden_size:
        mismatch.append(f"a hidden size of {config.hidden_size} ({target.name} has {meta.hidden_size})")
    if meta.vocab_size and config.vocab_size and config.vocab_size != meta.vocab_size:
        mismatch.append(f"a vocabulary of {config.vocab_size} tokens ({target.name} has {meta.vocab_size})")
    if mismatch:
        return findings + [Finding(
            "error", "This EAGLE head belongs to another model",
            f"It was trained for {config.base_model or 'another model'} with {' and '.join(mismatch)}. "
            "Train a head for this target (Models ▸ Train heads…, Kind EAGLE).",
        )]  # fmt: skip
    where = "shipped with SpecDeck" if not heads else folder
    auto = str(options.tree_depth).strip().lower() == AUTO
    depth = f"up to {MAX_DEPTH} levels (auto)" if auto else f"up to {options.tree_depth} levels"
    return findings + [Finding(
        "ok", "The EAGLE head fits the target",
        f"{describe_config(config, 'EAGLE head', 'depth')} ({where}). Draft trees grow {depth}, "
        "where the head is most confident.",
    )]  # fmt: skip


DRAFTER = DrafterSpec(
    name="eagle", label="EAGLE", choice_label="EAGLE head",
    summary="A one-layer EAGLE head runs in the target's feature space and drafts a tree (PyTorch only).",
    options=EagleOptions, needs=(HiddenFeatures, TreeForward, ModelParts), make=make, preflight=preflight,
    stats=EagleStats,
    torch_reason=("An EAGLE head reads the target's hidden states and drafts a tree of candidates; "
                  "llama.cpp exposes neither."),
    trees=True,
)  # fmt: skip
