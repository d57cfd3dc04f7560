"""Reading draft-head folders: config.json, and the weights (safetensors, or a pickle read with weights_only)."""

from __future__ import annotations

import json
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


def read_head_json(folder: str, what: str, weight_files: str) -> tuple[str, dict]:
    """(the path of folder/config.json, its contents) for a folder said to hold a `what` ("EAGLE")
    head; ModelLoadError when there is no such folder or file, it is not JSON, or it describes
    Medusa heads. `weight_files` names the weights the folder should hold, for the message."""
    if not os.path.isdir(folder):
        raise ModelLoadError(
            f"{what} head folder not found: {folder}. Give the folder holding config.json and {weight_files}."
        )
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{folder} has no config.json, so it is not an {what} head folder.")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"{path} is not an {what} head config: {short_reason(error)}.") from error
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not an {what} head config: it holds no JSON object.")
    if "medusa_num_heads" in data:
        raise ModelLoadError(f"{folder} holds Medusa heads, not an {what} head: choose the Medusa drafter for it.")
    return path, data


def check_weights(weights: dict, expected: dict, folder: str, what: str, hint: dict | None = None) -> None:
    """A ModelLoadError unless `weights` has every tensor of `expected` in its shape; `hint` adds what a
    wrong shape of some tensor means (name -> words)."""
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ModelLoadError(
            f"The {what} weights in {folder} are incomplete: {len(missing)} tensors missing "
            f"(first: {missing[0]}). Copy, download or train them again."
        )
    for name, tensor in expected.items():
        if tuple(weights[name].shape) != tuple(tensor.shape):
            more = f" ({hint[name]})" if hint and name in hint else ""
            raise ModelLoadError(
                f"The {what} weight {name} in {folder} has shape {tuple(weights[name].shape)}, expected "
                f"{tuple(tensor.shape)}{more}: the config and the weights disagree."
            )


def save_head(weights: dict[str, torch.Tensor], config: dict, folder: str, dtype: torch.dtype | None) -> None:
    """folder/model.safetensors with `weights` (floats in `dtype`; None keeps their own) and
    folder/config.json with `config`."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    weights = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v) for k, v in weights.items()}
    save_file(weights, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
