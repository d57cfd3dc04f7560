"""A training run on disk: the heads folder, and beside them what resuming needs.

    out_dir/
      config.json, medusa_lm_head.safetensors   the heads, loadable at every checkpoint
      training/
        training_state.pt    step, heads and optimizer state, data position, history, settings
        corpus.pt            the token stream trained on (so a resumed run reads the same tokens)
        self_generated.jsonl replies the target wrote (when asked to)

Ship only the top level; training/ is for resuming. Everything in the .pt files
is tensors and plain Python values, saved with torch.save and read back with
`weights_only=True`, which refuses to run any code a file might carry. Files are
written beside their final name and renamed, so a crash never leaves half a
checkpoint.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from engine.errors import ConfigError
from engine.training.records import CheckpointInfo

TRAINING_DIR = "training"
STATE_FILE = "training_state.pt"
CORPUS_FILE = "corpus.pt"
REPLIES_FILE = "self_generated.jsonl"
FORMAT = 1


def training_dir(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / TRAINING_DIR


def state_path(out_dir: str | os.PathLike) -> Path:
    return training_dir(out_dir) / STATE_FILE


def save_atomically(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_file(path: Path) -> dict:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - a damaged file is a message, not a traceback
        raise ConfigError(
            f"Cannot read the training checkpoint {path} ({type(error).__name__}). Start over "
            "without --resume (the heads trained so far are replaced), or into another folder."
        ) from error
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(
            f"{path} is not a training checkpoint this version can read. Start over, or use another folder."
        )
    return data


def load_state(out_dir: str | os.PathLike) -> dict | None:
    path = state_path(out_dir)
    return load_file(path) if path.is_file() else None


def checkpoint_info(out_dir: str | os.PathLike) -> CheckpointInfo | None:
    """The saved run in `out_dir`, or None when there is none (or it cannot be read)."""
    try:
        state = load_state(out_dir)
    except ConfigError:
        return None
    if state is None:
        return None
    settings = dict(state.get("settings", {}))
    steps = int(settings.get("steps", 0))
    return CheckpointInfo(int(state["step"]), steps, bool(state.get("finished")), settings)


def save_heads(heads, out_dir: str | os.PathLike) -> None:
    """MedusaHeads.save, but into a staging folder first, then each file renamed into place."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".heads-", dir=out))
    try:
        heads.save(str(staging))
        for item in staging.iterdir():
            os.replace(item, out / item.name)
    finally:
        for item in staging.iterdir():
            item.unlink()
        staging.rmdir()
