"""The Gemma 4 assistant drafter's registry entry (assistant.py is the algorithm; engine/heads/assistant.py
tells an assistant apart, says what differs from a target, finds and loads one).

An assistant fits only the Gemma 4 model it was published with: it reads that model's hidden
states and attends to its keys and values. `--drafter assistant` takes the assistant folder
from `--assistant PATH`, or finds it beside the target (`assistant/` inside the target's
folder, or a folder next to it named after it with "assistant" in the name). Not `--draft`:
that flag is the draft-model drafter's and implies `--drafter model`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.backends.capabilities import CachedKV, HiddenFeatures, ModelParts
from engine.drafters.registry import DrafterSpec, DrafterStats, setting, stat
from engine.lazy import named

ASSISTANT_HELP = (
    "the Gemma 4 assistant folder for --drafter assistant (gemma4_assistant, e.g. gemma-4-e2b-it-assistant); "
    "default: found beside the target (assistant/ inside its folder, or a folder next to it named after it "
    "with 'assistant' in the name). It fits only its own Gemma 4 model."
)


@dataclass(frozen=True)
class AssistantOptions:
    assistant: str | None = setting(None, label="Assistant", help=ASSISTANT_HELP, cli="--assistant", kind="path")


@dataclass(frozen=True)
class AssistantStats(DrafterStats):
    layers: int = stat(label="Assistant layers", chart=False)
    ordered_head: str = stat(label="Ordered LM head", chart=False)
    acceptance: float = stat(label="Drafts accepted", chart=False)


def assistant_folder(target_path: str, options: AssistantOptions) -> str:
    """The assistant folder to use for the target at `target_path`: the one given, checked against the
    target, or the one found beside it; a ModelLoadError naming what differs or what was looked for."""
    from engine.errors import ModelLoadError
    from engine.heads.assistant import (
        assistant_mismatch,
        candidate_folders,
        find_assistant,
        is_assistant_config,
        read_config,
    )

    if not os.path.isdir(target_path):
        raise ModelLoadError(
            f"A Gemma 4 assistant drafts for a Gemma 4 model folder, and {os.path.basename(target_path) or target_path} "
            "is not a folder: load the model's original folder (config.json and safetensors), or choose another drafter."
        )
    target_config = read_config(target_path, "target")
    if options.assistant:
        if not os.path.isdir(options.assistant):
            raise ModelLoadError(
                f"Assistant folder not found: {options.assistant}. Give the folder of a Gemma 4 assistant."
            )
        config = read_config(options.assistant, "assistant")
        why = assistant_mismatch(target_config, config)
        if why is not None:
            raise ModelLoadError(why)
        return options.assistant
    found = find_assistant(target_path, target_config)
    if found is not None:
        return found
    name = os.path.basename(os.path.normpath(target_path))
    for folder in candidate_folders(target_path):  # an assistant beside it, for another model: say what differs
        try:
            config = read_config(folder, "assistant")
        except ModelLoadError:
            continue
        if is_assistant_config(config):
            raise ModelLoadError(
                f"{os.path.basename(folder)}, beside {name}: {assistant_mismatch(target_config, config)}"
            )
    raise ModelLoadError(
        f"No Gemma 4 assistant for {name} was found beside it: give one with --assistant PATH (its folder "
        "holds a gemma4_assistant config.json), or choose another drafter."
    )


def make(target, options: AssistantOptions, load):
    """The assistant checked against the target before it loads, then placed on the target's device and dtype."""
    from engine.drafters.heads_loading import placement
    from engine.heads.assistant import load_assistant

    AssistantDrafter = named("engine.drafters.assistant:AssistantDrafter")  # assistant.py imports this module

    folder = assistant_folder(target.info.path, options)
    if load.progress:
        load.progress("Loading the Gemma 4 assistant", 0.9)
    device, dtype = placement(target.lm_head)
    model = load_assistant(folder).to(device=device, dtype=dtype)
    return AssistantDrafter(model, target)


def ready(target, options: AssistantOptions) -> bool:
    """Whether an assistant that fits the loaded target was given or lies beside it."""
    from engine.errors import SpecDeckError

    try:
        assistant_folder(target.info.path, options)
    except SpecDeckError:
        return False
    return True


def preflight(ctx, options: AssistantOptions) -> list:
    """The target must be a Gemma 4 folder, and the assistant (given or found beside it) must fit it."""
    from engine.errors import SpecDeckError
    from engine.models.doctor import Finding

    try:
        folder = assistant_folder(ctx.target.path, options)
    except SpecDeckError as e:
        return [Finding("error", f"No Gemma 4 assistant that fits {ctx.target.name}", str(e))]
    return [
        Finding(
            "ok",
            "The Gemma 4 assistant fits this model",
            f"{os.path.basename(os.path.normpath(folder))} reads this model's hidden states and attends to its "
            "keys and values: it drafts a chain of k tokens at the pending token's position.",
        )
    ]


DRAFTER = DrafterSpec(
    name="assistant",
    label="Gemma 4 assistant",
    choice_label="Gemma 4 assistant",
    summary="The small assistant Google publishes beside a Gemma 4 model drafts a chain from the target's last "
    "hidden state and its keys and values (PyTorch only); it fits only its own model, and an assistant for "
    "another model is refused, naming the model type, hidden size or vocabulary size that differs.",
    options=AssistantOptions,
    needs=(HiddenFeatures, ModelParts, CachedKV),
    make=make,
    preflight=preflight,
    stats=AssistantStats,
    torch_reason="A Gemma 4 assistant reads the target's hidden states and its keys and values, which llama.cpp "
    "does not expose.",
    draft_probabilities=True,
    order=75,
    short_name="Gemma 4 assistant",
    reads_weights=True,
    ready=ready,
)
