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
"""

from __future__ import annotations

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
