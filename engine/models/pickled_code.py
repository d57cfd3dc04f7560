"""A checkpoint that weights-only loading refuses, said as what it is.

SpecDeck reads `.bin` / `.pt` checkpoints with `torch.load(weights_only=True)`,
which unpickles tensors and plain containers only. A file that names any other
Python object (a function such as `os.system`, a custom class) is refused before
anything in it runs. That file is not corrupt: it holds pickled code, which
SpecDeck never runs. The message says so, names the file and tells a user who
trusts it how to convert it to safetensors once.
"""

from __future__ import annotations

import os
import pickle
import re

from engine.errors import ModelLoadError

_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
# What torch's weights-only unpickler says when a pickle names code or a class it refuses.
_REFUSALS = ("unsupported global", "can only build tensor", "trying to call reduce for")


def is_refused_pickle(error: BaseException | None) -> bool:
    """True when `error` (or an exception it was raised from) is torch's weights-only loader
    refusing a Python object the pickle names. Other weights-only failures ("Unsupported
    operand" and the like) are bytes that are no pickle at all: a corrupt file."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error).lower()
        if isinstance(error, pickle.UnpicklingError) and any(reason in text for reason in _REFUSALS):
            return True
        error = error.__cause__ or error.__context__
    return False


def refused_pickle_error(path: str, error: BaseException, convert: str) -> ModelLoadError:
    """The ModelLoadError for the refused pickle `path`; `convert` is the command that
    turns a trusted copy into safetensors (`convert_state_dict` or `convert_model_folder`)."""
    found = _GLOBAL.search(_chain_text(error))
    names = f" (it refers to {found.group(1)})" if found else ""
    return ModelLoadError(
        f"{path} contains pickled code{names}, which could run anything on this machine, so SpecDeck "
        "did not open it. SpecDeck loads only safetensors files and weights-only PyTorch checkpoints "
        "(plain tensors). The file is not necessarily damaged: if you trust it and where it came from, "
        f"convert it once to safetensors, then load it again: {convert}"
    )


def convert_state_dict(pickle_path: str, safetensors_path: str) -> str:
    """A command that converts a pickled dict of tensors (heads, a one-file checkpoint)."""
    return (
        'python -c "import torch; from safetensors.torch import save_file; '
        f"state = torch.load({pickle_path!r}, weights_only=False); "
        f"save_file({{k: v.clone().contiguous() for k, v in state.items()}}, {safetensors_path!r}, "
        "metadata={'format': 'pt'})\""
    )


def convert_model_folder(folder: str) -> str:
    """A command that rewrites a model folder's pickled weights as safetensors (shards too)."""
    return (
        'python -c "from transformers import AutoModelForCausalLM as M; '
        f'M.from_pretrained({folder!r}, weights_only=False).save_pretrained({folder!r})"'
    )


def pickle_files(folder: str) -> list[str]:
    """The pickled weight files of a Hugging Face model folder, in name order."""
    names = sorted(os.listdir(folder))
    return [
        os.path.join(folder, n)
        for n in names
        if n == "pytorch_model.bin" or re.fullmatch(r"pytorch_model-.*\.bin", n) or n.endswith(".pt")
    ]


def short_reason(error: BaseException, limit: int = 200) -> str:
    """`error` as "Type: message" short enough for a sentence. For torch's weights-only
    failures, only the unpickler's own reason ("Unsupported operand 110"): the rest of its
    text suggests weights_only=False, advice that must not reach a user about an unknown file."""
    text = str(error)
    if "WeightsUnpickler error:" in text:
        after = text.split("WeightsUnpickler error:", 1)[1]
        text = next((line.strip() for line in after.splitlines() if line.strip()), "")
    text = re.sub(r"\x1b\[[0-9;]*m", "", text).strip()
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _chain_text(error: BaseException | None) -> str:
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        parts.append(str(error))
        error = error.__cause__ or error.__context__
    return "\n".join(parts)
