"""A Gemma 4 assistant: the small drafter Google ships beside a Gemma 4 model, told apart by its config.

An assistant folder (transformers' `gemma4_assistant`, Gemma4AssistantForCausalLM) holds a few
decoder layers with no key or value projections of their own: every layer attends to the
target's keys and values (the last layer of each attention type, full and sliding), and its
input is the target's embedding of the last token beside the target's last hidden state
(`pre_projection`: 2 x backbone_hidden_size -> hidden_size). So an assistant fits one target
only: the same hidden size (backbone_hidden_size), vocabulary and attention shapes.

These checks read config.json dicts only (no torch, no weights): the model discovery lists
an assistant beside its target with them, and the drafter refuses a wrong pair before loading.

    is_assistant_config(config)                  -> whether config.json is an assistant's
    assistant_mismatch(target_cfg, assistant_cfg) -> None when it fits, else a sentence naming what differs
    find_assistant(target_folder, target_cfg)    -> the folder of a fitting assistant beside the target, or None
    load_assistant(folder)                       -> the transformers model (safetensors only), float32 on the CPU

Where an assistant is found when none is named: `assistant/` inside the target's folder, then a
folder beside it named after it with "assistant" in the name (google/gemma-4-e2b-it downloaded
next to google/gemma-4-e2b-it-assistant), the first whose config fits.
"""

from __future__ import annotations

import json
import os

from engine.errors import ModelLoadError

ASSISTANT_TYPES = ("gemma4_assistant",)
TARGET_TYPES = ("gemma4", "gemma4_text")  # the multimodal wrapper and the text-only model
ATTENTION_TYPES = ("full_attention", "sliding_attention")


def is_assistant_config(config: dict) -> bool:
    """Whether a config.json dict describes a Gemma 4 assistant (a drafter, not a model to chat with)."""
    if not isinstance(config, dict):
        return False
    if str(config.get("model_type") or "") in ASSISTANT_TYPES:
        return True
    return any("Gemma4Assistant" in str(name) for name in config.get("architectures") or ())


def text_part(config: dict) -> dict:
    """The language model's settings: `text_config` of a wrapper (gemma4, the assistant), else the config."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def assistant_mismatch(target_config: dict, assistant_config: dict) -> str | None:
    """None when the assistant (config.json dict) drafts for the target (config.json dict); else one
    sentence naming what differs (model type, hidden size, vocabulary size, attention shapes), the
    target's value and the assistant's, and what to do."""
    if not is_assistant_config(assistant_config):
        kind = assistant_config.get("model_type") if isinstance(assistant_config, dict) else None
        return f"This folder is not a Gemma 4 assistant (its model_type is {kind or 'missing'}, not gemma4_assistant)."
    target_type = str(target_config.get("model_type") or "")
    if target_type not in TARGET_TYPES:
        return (
            f"A Gemma 4 assistant drafts for its own Gemma 4 model only, and the target is {target_type or 'of an unknown type'} "
            "(model_type differs: gemma4 or gemma4_text expected): choose the target it was made for, or another drafter."
        )
    target, mine = text_part(target_config), text_part(assistant_config)
    differences = []
    backbone, hidden = assistant_config.get("backbone_hidden_size"), target.get("hidden_size")
    if backbone is not None and hidden is not None and int(backbone) != int(hidden):
        differences.append(f"hidden size {hidden} (the assistant reads hidden states of size {backbone})")
    vocab_target, vocab_mine = target.get("vocab_size"), mine.get("vocab_size")
    if vocab_target is not None and vocab_mine is not None and int(vocab_target) != int(vocab_mine):
        differences.append(f"vocabulary size {vocab_target} (the assistant's is {vocab_mine})")
    for kind in ATTENTION_TYPES:
        theirs, ours = _attention_shape(target, kind, last=True), _attention_shape(mine, kind, last=False)
        if ours is None:
            continue
        if theirs is None:
            differences.append(f"no {kind.replace('_', ' ')} layer (the assistant attends to one)")
        elif theirs != ours:
            differences.append(
                f"{kind.replace('_', ' ')} keys of {theirs[0]} heads x {theirs[1]} "
                f"(the assistant reads {ours[0]} heads x {ours[1]})"
            )
    if not differences:
        return None
    return (
        "This Gemma 4 assistant was made for another model: the target has "
        + "; ".join(differences)
        + ". Use the assistant published with this target, or another drafter."
    )


def _attention_shape(text: dict, kind: str, last: bool) -> tuple[int, int] | None:
    """(key-value heads, head size) of a layer of type `kind`: the target's last one (whose keys the
    assistant reads) or the assistant's first; None when there is no such layer or it is not said."""
    types = text.get("layer_types")
    if not isinstance(types, list) or kind not in types:
        return None
    index = len(types) - 1 - types[::-1].index(kind) if last else types.index(kind)
    overrides = text.get("per_layer_config") or {}
    layer = overrides.get(str(index), overrides.get(index, {})) if isinstance(overrides, dict) else {}
    heads = layer.get("num_key_value_heads", text.get("num_key_value_heads"))
    size = layer.get("head_dim", text.get("head_dim"))
    if heads is None or size is None:
        return None
    return int(heads), int(size)


def read_config(folder: str, what: str = "model") -> dict:
    """A folder's config.json as a dict, or a ModelLoadError naming the folder and what to do."""
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as error:
        raise ModelLoadError(
            f"Cannot read the {what}'s config.json in {folder} ({error}): give the folder that holds it."
        ) from error
    if not isinstance(config, dict):
        raise ModelLoadError(f"The {what}'s config.json in {folder} is not a JSON object.")
    return config


def candidate_folders(target_folder: str) -> list[str]:
    """Where an assistant of the target in `target_folder` may lie, in the order they are tried."""
    target_folder = os.path.abspath(target_folder)
    inside = os.path.join(target_folder, "assistant")
    parent, name = os.path.split(target_folder)
    try:
        siblings = sorted(os.listdir(parent))
    except OSError:
        siblings = []
    beside = [
        os.path.join(parent, other)
        for other in siblings
        if other != name and "assistant" in other.lower() and other.lower().startswith(name.lower())
    ]
    return [folder for folder in (inside, *beside) if os.path.isfile(os.path.join(folder, "config.json"))]


def find_assistant(target_folder: str, target_config: dict) -> str | None:
    """The first folder beside the target (candidate_folders) holding an assistant that fits it, or None."""
    for folder in candidate_folders(target_folder):
        try:
            config = read_config(folder, "assistant")
        except ModelLoadError:
            continue
        if is_assistant_config(config) and assistant_mismatch(target_config, config) is None:
            return folder
    return None


def load_assistant(folder: str):
    """The assistant in `folder` as transformers' Gemma4AssistantForCausalLM, float32 on the CPU (the
    caller places it). Safetensors only: a pickle is never read."""
    import torch

    if not any(name.endswith(".safetensors") for name in os.listdir(folder)):
        raise ModelLoadError(
            f"{folder} holds no safetensors files: an assistant is read from safetensors only. "
            "Download the assistant's model.safetensors into that folder."
        )
    try:
        from transformers import Gemma4AssistantForCausalLM
    except ImportError as error:
        raise ModelLoadError(
            f"This transformers cannot build a Gemma 4 assistant ({error}): install transformers 5.25 or newer."
        ) from error
    try:
        model = Gemma4AssistantForCausalLM.from_pretrained(
            folder, local_files_only=True, use_safetensors=True, dtype=torch.float32
        )
    except Exception as error:  # every failure gets a message naming the folder
        raise ModelLoadError(
            f"Could not load the Gemma 4 assistant in {folder}: the files may be incomplete (download them "
            f"again) or need a newer transformers ({type(error).__name__}: {str(error)[:300]})."
        ) from error
    return model.eval()
