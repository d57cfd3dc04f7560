"""Can the installed transformers build a model folder's architecture? Said before anything loads.

The torch backend loads a folder with transformers' AutoModelForCausalLM, which picks the
model's code by config.json's `model_type` ("llama") from its table of text generators
(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES). A model type missing from that table fails the load:
a model newer than the installed transformers, one that ships its own code, or one that
does not generate text (a BERT). SpecDeck never runs a folder's own code unless asked:
`trust_remote_code` is off by default (engine/models/loading.py).

The table is read from transformers' source (models/auto/modeling_auto.py) rather than
imported: importing it imports torch (seconds), and the doctor must answer at once.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
from functools import lru_cache
from pathlib import Path

_TABLE = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"


def transformers_problem(folder: str | Path) -> str | None:
    """Why the installed transformers cannot load the model folder as a text generator, in words
    that name the architecture and say what to do; None when it can (or this cannot tell)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the metadata reader says what is wrong with the folder
    if not isinstance(config, dict):
        return None
    known = causal_lm_types()
    if known is None:
        return None
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in known:
        return None
    if not isinstance(model_type, str) and any(t in str(folder) for t in known):
        return None  # transformers falls back on a model type in the folder's path
    architectures = [a for a in config.get("architectures") or () if isinstance(a, str)]
    named = (f"model type {model_type!r}" if isinstance(model_type, str) else "a config.json without a model_type") + (
        f" ({', '.join(architectures)})" if architectures else ""
    )
    own_code = (
        " The folder ships its own model code (auto_map in config.json): that code runs only with "
        "trust_remote_code, which SpecDeck leaves off; turn it on (the Python API's load_backend) "
        "only for code you have read and trust."
        if config.get("auto_map")
        else ""
    )
    return (
        f"transformers {_version()} cannot load this architecture: {named} is not one of the text "
        "generators it knows. Update transformers (pip install -U transformers) if a newer release "
        "supports it, or use a GGUF of this model on the llama.cpp backend." + own_code
    )


def causal_lm_types() -> frozenset[str] | None:
    """The model types the installed transformers' AutoModelForCausalLM loads; None when transformers
    is missing or its table cannot be read."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "models", "auto", "modeling_auto.py")
    try:
        return _read_table(path, os.stat(path).st_mtime_ns)
    except Exception:  # missing, or written another way in another release: the load will say
        return None


@lru_cache(maxsize=2)
def _read_table(path: str, _mtime: int) -> frozenset[str]:
    source = Path(path).read_text(encoding="utf-8")
    # Only the table's own statement is parsed: the whole module takes ~70 ms.
    start = re.search(rf"^{_TABLE}\s*=", source, re.MULTILINE)
    if start is None:
        raise ValueError(f"no {_TABLE} in {path}")
    end = re.compile(r"^\)", re.MULTILINE).search(source, start.end())
    if end is None:
        raise ValueError(f"{_TABLE} in {path} does not end")
    call = ast.parse(source[start.start() : end.end()]).body[0].value  # OrderedDict([(type, class), ...])
    return frozenset(str(model_type) for model_type, _ in ast.literal_eval(call.args[0]))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return "(version unknown)"
