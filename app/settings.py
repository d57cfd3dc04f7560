"""What the app remembers between runs, read and written through plain `QSettings()`.

The organization and application names are set once (application.py), so every
`QSettings()` here opens the same store, and tests point it at a temporary
folder. Reads are typed (`value(key, default, type)`), as in Frescobaldi.

The model pair and sampling settings are frozen dataclasses; they are stored as
JSON of their fields, and anything unreadable (an older version's keys, a hand
edit) falls back to the defaults rather than stopping the app from starting.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TypeVar

from PySide6.QtCore import QSettings

from engine import ConfigError, EngineConfig, SamplingConfig

ENGINE_CONFIG = "engine/config"
SAMPLING_CONFIG = "engine/sampling"
GEOMETRY = "window/geometry"
WINDOW_STATE = "window/state"
CURRENT_TAB = "window/tab"
COLOUR_TOKENS = "chat/colour_tokens"
CURRENT_CONVERSATION = "chat/conversation"
EXPORT_FOLDER = "files/export_folder"

# What a first start uses: the embedded SmolLM2-135M-Instruct with the n-gram drafter on llama.cpp.
DEFAULT_ENGINE_CONFIG = EngineConfig()
DEFAULT_SAMPLING = SamplingConfig()  # greedy, seed 0, up to 256 tokens: the pair dialog's defaults too

T = TypeVar("T")


def _write(settings: QSettings, key: str, config) -> None:
    settings.setValue(key, json.dumps(dataclasses.asdict(config)))


def _read(settings: QSettings, key: str, cls: type[T], default: T) -> T:
    raw = settings.value(key, "", type=str)
    if not raw:
        return default
    try:
        fields = json.loads(raw)
        known = {f.name for f in dataclasses.fields(cls)}
        values = {name: value for name, value in fields.items() if name in known}
        for name in ("stop", "lookahead"):  # JSON has no tuples
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)
    except (ValueError, TypeError, AttributeError, ConfigError):
        return default


def engine_config(settings: QSettings | None = None) -> EngineConfig:
    return _read(settings or QSettings(), ENGINE_CONFIG, EngineConfig, DEFAULT_ENGINE_CONFIG)


def set_engine_config(config: EngineConfig, settings: QSettings | None = None) -> None:
    _write(settings or QSettings(), ENGINE_CONFIG, config)


def sampling_config(settings: QSettings | None = None) -> SamplingConfig:
    return _read(settings or QSettings(), SAMPLING_CONFIG, SamplingConfig, DEFAULT_SAMPLING)


def set_sampling_config(config: SamplingConfig, settings: QSettings | None = None) -> None:
    _write(settings or QSettings(), SAMPLING_CONFIG, config)


def describe_sampling(config: SamplingConfig) -> str:
    """One line for the UI: 'greedy, seed 0, up to 512 tokens'."""
    if config.greedy:
        mode = "greedy"
    else:
        mode = f"temperature {config.temperature:g}"
        if config.top_k:
            mode += f", top-k {config.top_k}"
        if config.top_p < 1:
            mode += f", top-p {config.top_p:g}"
    return f"{mode}, seed {config.seed}, up to {config.max_tokens} tokens"
