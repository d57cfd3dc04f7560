"""Files that ship with SpecDeck for the embedded model (trained drafter heads).

They live in resources/ beside the `engine` package in a source checkout, or in
the PyInstaller bundle's resources/ folder. Folder names say what the files are
for: resources/heads/{kind}-{model}/, e.g. heads/medusa-smollm2-135m/.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: discovery (engine/models/discovery.py) asks here without loading torch
    from engine.backends.base import ModelInfo

# The embedded SmolLM2-135M, recognized by name or, once converted or renamed, by shape.
_SMOLLM2_135M = "smollm2-135m"


def resources_dir() -> Path:
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        return Path(bundle) / "resources"
    return Path(__file__).resolve().parents[2] / "resources"


def model_key(info: ModelInfo) -> str | None:
    """Which shipped model this is ("smollm2-135m"), or None for any other model."""
    name = f"{info.name} {info.path}".lower().replace("_", "-")
    if _SMOLLM2_135M in name:
        return _SMOLLM2_135M
    if info.architecture == "llama" and info.vocab_size == 49152 and info.n_layers == 30:
        return _SMOLLM2_135M
    return None


def default_heads_dir(kind: str, model_info: ModelInfo) -> str | None:
    """The shipped heads of `kind` ("medusa") for this model, or None when there are none."""
    key = model_key(model_info)
    if key is None:
        return None
    folder = resources_dir() / "heads" / f"{kind}-{key}"
    return str(folder) if (folder / "config.json").is_file() else None
