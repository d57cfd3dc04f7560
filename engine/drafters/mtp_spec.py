"""The MTP drafter's registry entry: the target's own multi-token-prediction layer (mtp.py is the algorithm)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.backends.capabilities import HiddenFeatures, ModelParts
from engine.drafters.registry import DrafterSpec, DrafterStats, stat
from engine.lazy import named


@dataclass(frozen=True)
class MtpOptions:
    """No options: the layers are the model's own, found in its folder."""


@dataclass(frozen=True)
class MtpStats(DrafterStats):
    layers: int = stat(label="MTP layers shipped", chart=False)
    layout: str = stat(label="Layout", chart=False)
    acceptance: float = stat(label="Drafts accepted", chart=False)


def make(target, options: MtpOptions, load):
    """The target's first MTP layer, read from its folder's safetensors, in its device and dtype."""
    from engine.drafters.heads_loading import placement
    from engine.heads.mtp import find_mtp, load_mtp, read_model_config

    MtpDrafter = named("engine.drafters.mtp:MtpDrafter")  # mtp.py imports this module

    folder = _folder(target.info.path)
    files = find_mtp(folder, read_model_config(folder))
    head = load_mtp(folder, target.text_config, files)
    device, dtype = placement(target.lm_head)
    return MtpDrafter(head.to(device=device, dtype=dtype), target, n_layers=files.n_layers)


def _folder(path: str) -> str:
    from engine.errors import ModelLoadError

    if not os.path.isdir(path):
        raise ModelLoadError(
            f"MTP layers are read from a model folder's safetensors, and {os.path.basename(path) or path} is not "
            "a folder (a GGUF file's MTP tensors are not read): load the model's original folder, or choose "
            "another drafter."
        )
    return path


def ready(target, options: MtpOptions) -> bool:
    """Whether the loaded target's folder holds MTP layers of a known layout."""
    from engine.errors import SpecDeckError
    from engine.heads.mtp import find_mtp, read_model_config

    try:
        folder = _folder(target.info.path)
        find_mtp(folder, read_model_config(folder))
    except SpecDeckError:
        return False
    return True


def preflight(ctx, options: MtpOptions) -> list:
    """The target must be a folder whose config and safetensors hold MTP layers of a known layout."""
    from engine.errors import SpecDeckError
    from engine.heads.mtp import LAYOUTS, find_mtp, read_model_config
    from engine.models.doctor import Finding

    try:
        folder = _folder(ctx.target.path)
        files = find_mtp(folder, read_model_config(folder))
    except SpecDeckError as e:
        return [Finding("error", f"{ctx.target.name} has no MTP layers SpecDeck can draft with", str(e))]
    return [
        Finding(
            "ok",
            "The model ships its own MTP layers",
            f"{files.n_layers} MTP layer(s), {LAYOUTS[files.layout]}: the first drafts a chain of k tokens, "
            "reading the target's hidden states, with nothing to download or train.",
        )
    ]


DRAFTER = DrafterSpec(
    name="mtp",
    label="MTP layers (the model's own)",
    choice_label="MTP layers",
    summary="The model's own multi-token-prediction layer (DeepSeek-V3, GLM-4.5, Qwen3-Next, Qwen3.5 / Qwen3.6) "
    "drafts a chain from the target's hidden states (PyTorch only); it fits only the model that ships it, and "
    "layers made for another model are refused, naming the hidden or vocabulary size that differs.",
    options=MtpOptions,
    needs=(HiddenFeatures, ModelParts),
    make=make,
    preflight=preflight,
    stats=MtpStats,
    torch_reason="An MTP layer reads the target's hidden states, which llama.cpp does not expose.",
    order=70,
    short_name="MTP layers",
    reads_weights=True,
    ready=ready,
)
