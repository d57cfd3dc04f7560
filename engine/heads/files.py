"""Reading draft-head weights from a folder: safetensors, or a pickle read with weights_only."""

from __future__ import annotations

import os

import torch

from engine.errors import ModelLoadError
from engine.models.memory_errors import is_allocation_failure
from engine.models.pickled_code import convert_state_dict, is_refused_pickle, refused_pickle_error, short_reason


def read_weights(folder: str, safe_name: str, pickle_name: str, what: str) -> dict[str, torch.Tensor]:
    """The tensors in folder/safe_name, else folder/pickle_name; ModelLoadError naming `what`
    ("Medusa", "EAGLE") when neither is there or the file cannot be read."""
    safe = os.path.join(folder, safe_name)
    pickle = os.path.join(folder, pickle_name)
    try:
        if os.path.isfile(safe):
            from safetensors.torch import load_file

            return load_file(safe)
        if os.path.isfile(pickle):
            # Never an unrestricted pickle: weights_only refuses anything but tensors.
            data = torch.load(pickle, map_location="cpu", weights_only=True)
            if not isinstance(data, dict):
                raise ValueError("the file does not hold a dict of tensors")
            return data
    except Exception as error:  # noqa: BLE001 - every failure becomes a clear message
        if is_allocation_failure(error):
            raise  # not a broken file: the caller says what the model needs (memory_errors)
        if is_refused_pickle(error):
            raise refused_pickle_error(pickle, error, convert_state_dict(pickle, safe)) from error
        raise ModelLoadError(
            f"Could not read the {what} weights in {folder}: the file is corrupt or not a weights file "
            f"({short_reason(error)})."
        ) from error
    raise ModelLoadError(f"{folder} has no {safe_name} (or {pickle_name}): no {what} weights to load.")
