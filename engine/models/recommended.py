"""The sampling a model's authors recommend, where its files say so.

GGUF files may carry `general.sampling.temp`, `.top_k`, `.top_p` and `.min_p`
(llama.cpp writes them from the source model, and reads them as its defaults);
a Hugging Face folder may carry them in `generation_config.json` (`temperature`,
`top_k`, `top_p`, `min_p`, and `do_sample: false` for greedy). Only values that
make a valid `SamplingConfig` are returned: a file's typo never stops a run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from engine.models.locate import resolve
from engine.models.metadata import gguf_values

_GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
}
_HF_KEYS = ("temperature", "top_k", "top_p", "min_p")


def recommended_sampling(spec: str) -> dict:
    """SamplingConfig fields the model recommends ({} when it recommends nothing), e.g.
    {"temperature": 0.6, "top_p": 0.95}. Reads at most the model's header or its config file."""
    ref = resolve(spec)
    if ref.kind == "gguf":
        values = {
            _GGUF_KEYS[key]: value
            for key, value in gguf_values(ref.path, "general.sampling.").items()
            if key in _GGUF_KEYS
        }
    else:
        values = _generation_config(Path(ref.path))
    return _valid(values)


def describe(fields: dict) -> str:
    """'temperature 0.6, top-p 0.95' for the UI."""
    names = {"temperature": "temperature", "top_k": "top-k", "top_p": "top-p", "min_p": "min-p"}
    return ", ".join(f"{names[key]} {value:g}" for key, value in fields.items())


def _generation_config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    if config.get("do_sample") is False:
        return {"temperature": 0.0}
    return {key: config[key] for key in _HF_KEYS if key in config}


def _valid(values: dict) -> dict:
    checks = {
        "temperature": lambda v: 0.0 <= v < 100.0,
        "top_k": lambda v: v >= 0 and float(v).is_integer(),
        "top_p": lambda v: 0.0 < v <= 1.0,
        "min_p": lambda v: 0.0 <= v < 1.0,
    }
    out = {}
    for key in ("temperature", "top_k", "top_p", "min_p"):
        value = values.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if checks[key](value):
            out[key] = int(value) if key == "top_k" else round(float(value), 6)
    if out.get("top_k") == 0:
        del out["top_k"]  # "off", the default anyway
    return out
