"""The early-exit drafter's registry entry: the target's own first L layers draft (early_exit.py is the algorithm)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.backends.capabilities import LayerExit
from engine.drafters.registry import AUTO, DrafterSpec, DrafterStats, setting, stat
from engine.lazy import named


@dataclass(frozen=True)
class EarlyExitOptions:
    exit_layer: int | str = setting(
        AUTO, label="Exit layer", minimum=1, auto=True, help="early-exit: draft with the first L layers (default auto)"
    )


@dataclass(frozen=True)
class ExitCandidate:
    """One candidate exit's measurements."""

    layer: int
    acceptance: float | None  # measured; None: not yet
    tested: float
    steps: int
    ms_per_token: float | None
    cost_ratio: float
    predicted_speedup: float


@dataclass(frozen=True)
class EarlyExitStats(DrafterStats):
    exit_layer: int = stat(label="Exit layer", unit="layers")
    n_layers: int = stat(label="Layers of the target", chart=False)
    layers: int | str = stat(label="Exit chosen", chart=False)  # "auto" or the fixed exit
    candidates: tuple[ExitCandidate, ...] = stat(label="Candidate exits", chart=False)


def make(target, options: EarlyExitOptions, load):
    EarlyExitDrafter = named("engine.drafters.early_exit:EarlyExitDrafter")  # early_exit.py imports this module

    return EarlyExitDrafter(target, layers=options.exit_layer)


def preflight(ctx, options: EarlyExitOptions) -> list:
    """Early exit needs the native PyTorch implementation and an exit below the last layer."""
    from engine.models.doctor import Finding

    meta = ctx.meta()
    if isinstance(meta, Finding):
        return [meta]
    target, exit_layer = ctx.target, options.exit_layer
    auto = str(exit_layer).strip().lower() == AUTO
    findings = []
    arch, n = meta.architecture, int(meta.n_layers or 0)
    native = ctx.native_architectures()
    if arch and arch != "unknown" and arch not in native:
        findings.append(
            Finding(
                "error",
                "Early exit cannot run this target",
                f"Early exit drafts with the target's own first layers, which needs SpecDeck's native PyTorch "
                f"implementation ({', '.join(native)} models); {target.name} is a {arch} model. "
                "Choose another drafter.",
            )
        )
    if 0 < n < 2:
        findings.append(
            Finding(
                "error",
                "Early exit needs at least 2 layers",
                f"{target.name} has {n} layer: early exit drafts with fewer layers than the target. "
                "Choose another drafter.",
            )
        )
    elif not auto and not _in_range(exit_layer, n):
        top = f"from 1 to {n - 1} ({target.name} has {n} layers)" if n else "of 1 or more"
        findings.append(
            Finding(
                "error",
                "The exit layer is out of range",
                f"The early-exit layer must be auto or a whole number {top}, got {exit_layer}: the draft runs "
                "that many of the target's layers, then its LM head. Use auto to let the drafter pick it.",
            )
        )
    if "layerskip" in f"{target.name} {target.path}".lower():
        findings.append(
            Finding(
                "ok",
                "Trained for early exit",
                "This looks like a LayerSkip model, trained so that its early layers already predict well: "
                "early exit should be accepted often.",
            )
        )
    else:
        findings.append(
            Finding(
                "warning",
                "Acceptance is usually low",
                "Ordinary models are not trained to predict from their early layers, so the first layers' guesses "
                "often miss and decoding may be no faster than plain. Models trained for early exit (LayerSkip) "
                "do much better.",
            )
        )
    if not any(f.severity == "error" for f in findings):
        layers = (
            f"a few exits between 1/4 and 3/4 of the {n} layers, the best by measured acceptance and cost"
            if auto
            else f"layers 1 to {exit_layer} of {n or 'the'}"
        )
        findings.append(
            Finding(
                "ok",
                "Early exit drafts with the target itself",
                f"No draft model and nothing extra in memory: the draft runs {layers}.",
            )
        )
    return findings


def _in_range(value, n: int) -> bool:
    try:
        if isinstance(value, bool) or float(value) != int(value):
            return False
        layer = int(value)
    except (TypeError, ValueError):
        return False
    return layer >= 1 and not (n and layer >= n)


DRAFTER = DrafterSpec(
    name="early-exit",
    label="Early exit",
    choice_label="Early exit: the target's first layers",
    summary="The target's own first layers draft, its full depth verifies (PyTorch only).",
    options=EarlyExitOptions,
    needs=(LayerExit,),
    make=make,
    preflight=preflight,
    stats=EarlyExitStats,
    torch_reason="Early exit stops the target's forward after its first layers, which llama.cpp cannot do.",
    order=90,
    short_name="early exit",
)
