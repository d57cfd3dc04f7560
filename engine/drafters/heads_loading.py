"""Loading trained draft heads (Medusa, EAGLE, EAGLE-3) beside a loaded target: which folder, where, and
a failed allocation said as what it is."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from engine.errors import ConfigError
from engine.models.memory_errors import model_out_of_memory, unexplained_allocation_failure


def heads_folder(kind: str, what: str, target, heads: str | None) -> str:
    """The heads folder asked for, else the one shipped for this target; a ConfigError saying
    how to get one when there is neither."""
    from engine.models.shipped import default_heads_dir

    folder = heads or default_heads_dir(kind, target.info)
    if folder is None:
        raise ConfigError(
            f"No {what} for {target.info.name}: train some (in the window: Models > Train heads…; in a terminal: "
            f"`specdeck-cli train-heads --kind {kind} ...`), then choose their folder (the pair dialog's heads "
            f"field, or --heads DIR)."
        )
    return folder


@contextmanager
def heads_memory(what: str, folder: str, target) -> Iterator[None]:
    """A failed allocation while loading draft heads, said as OutOfMemoryError with what the
    target already holds (the heads come on top of it)."""
    try:
        yield
    except Exception as error:
        if not unexplained_allocation_failure(error):
            raise
        raise model_out_of_memory(
            f"load {what} in {folder} beside {target.info.name}", target.info, target.n_ctx
        ) from error


def placement(module):
    """Device and compute dtype of the target's LM head (an int8 head computes in its
    `compute_dtype`; its weights are int8 buffers, not parameters)."""
    tensors = [*module.parameters(), *module.buffers()]
    device = tensors[0].device if tensors else None
    dtype = getattr(module, "compute_dtype", None)
    if dtype is None:
        dtype = next((t.dtype for t in tensors if t.is_floating_point()), None)
    return device, dtype


def describe_heads(folder: str) -> str:
    """One line about a folder of trained heads (Medusa heads, an EAGLE or EAGLE-3 head): what, for
    which model, how well they did; the engine's message when it cannot be read."""
    import json
    import os

    from engine.errors import SpecDeckError
    from engine.heads.kinds import heads_config_kind

    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            kind = heads_config_kind(json.load(f))
    except (OSError, ValueError, TypeError, AttributeError):
        kind = "medusa"  # read_config says what is wrong with the folder
    try:
        if kind == "medusa":
            from engine.heads.medusa import read_config

            config = read_config(folder)
            return describe_config(config, f"{config.num_heads} heads", None)
        if kind == "eagle3":
            from engine.heads.eagle3 import read_config as read_eagle3

            config = read_eagle3(folder)
            return describe_config(config, f"EAGLE-3 head over {config.draft_vocab_size:,} draft tokens", "depth")
        from engine.heads.eagle import read_config as read_eagle

        return describe_config(read_eagle(folder), "EAGLE head", "depth")
    except SpecDeckError as error:
        return str(error)


def describe_config(config, text: str, unit: str | None) -> str:
    """One line about trained heads: what they are (`text`), for which model, how well they did."""
    if config.base_model:
        text += f" for {config.base_model}"
    facts = config.training
    if facts.get("steps"):
        text += f", {facts['steps']} training steps"
    accuracy = facts.get("validation_head_accuracy")
    if accuracy:
        parts = (f"{unit} {k} {a:.0%}" if unit else f"{a:.0%}" for k, a in enumerate(accuracy, 1))
        text += "; held-out top-1 agreement " + ", ".join(parts)
    return text
