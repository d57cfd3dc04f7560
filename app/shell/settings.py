"""What the app remembers between runs, read and written through plain `QSettings()`.

The organization and application names are set once (application.py), so every
`QSettings()` here opens the same store, and tests point it at a temporary
folder. Reads are typed (`value(key, default, type)`), as in Frescobaldi.

The model pair and sampling settings are frozen dataclasses; they are stored as
JSON of their fields, and anything unreadable (an older version's keys, a hand
edit) falls back to the defaults rather than stopping the app from starting.

Every read goes through `read` (or `_read` for the dataclasses), which checks
the stored value's type itself instead of trusting Qt's conversion: PySide6
raises on some wrong-typed values and silently turns others into 0 or False.
A read that falls back adds the key to `resets`, for the window to say what
was reset.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import TypeVar

from PySide6.QtCore import QByteArray, QSettings

from engine import ConfigError, EngineConfig, SamplingConfig

ENGINE_CONFIG = "engine/config"
SAMPLING_CONFIG = "engine/sampling"
GEOMETRY = "window/geometry"
WINDOW_STATE = "window/state"
CURRENT_TAB = "window/tab"
COLOUR_TOKENS = "chat/colour_tokens"
MARKDOWN = "chat/markdown"
DEFAULT_SYSTEM_PROMPT = "chat/system_prompt"
CURRENT_CONVERSATION = "chat/conversation"
EXPORT_FOLDER = "files/export_folder"

# How the window's banner names a setting it had to reset.
LABELS = {
    ENGINE_CONFIG: "model pair",
    SAMPLING_CONFIG: "sampling settings",
    GEOMETRY: "window size and position",
    WINDOW_STATE: "panel layout",
    CURRENT_TAB: "open tab",
    COLOUR_TOKENS: "token colours",
    MARKDOWN: "Markdown replies",
    DEFAULT_SYSTEM_PROMPT: "default system prompt",
    CURRENT_CONVERSATION: "open conversation",
    EXPORT_FOLDER: "export folder",
}

# What a first start uses: the embedded SmolLM2-135M-Instruct with the n-gram drafter on llama.cpp.
DEFAULT_ENGINE_CONFIG = EngineConfig()
DEFAULT_SAMPLING = SamplingConfig()  # greedy, seed 0, up to 256 tokens: the pair dialog's defaults too

T = TypeVar("T")


def _write(settings: QSettings, key: str, config) -> None:
    settings.setValue(key, json.dumps(dataclasses.asdict(config)))


_MISSING = object()


def read(settings: QSettings, key: str, default: T, resets: list[str] | None = None) -> T:
    """The stored value as the type of `default` (str, int, bool or QByteArray), else `default`.

    A value that is there but unreadable (a hand edit, another program's junk) has
    its key added to `resets`; a missing one is simply the default.
    """
    if not settings.contains(key):
        return default
    try:
        value = _convert(settings.value(key), type(default))
    except Exception:  # noqa: BLE001 - whatever a broken value does inside Qt's conversion
        value = _MISSING
    if value is _MISSING:
        reset(key, resets)
        return default
    return value


def reset(key: str, resets: list[str] | None) -> None:
    """Note that the setting `key` fell back to its default."""
    if resets is not None and key not in resets:
        resets.append(key)


def describe_resets(resets: list[str]) -> str:
    """The banner's sentence: which settings were unreadable and are back to their defaults."""
    names = ", ".join(LABELS.get(key, key) for key in resets)
    return f"Some saved settings could not be read and were reset to their defaults: {names}."


def _convert(raw, kind: type):
    # INI files give back str (or a list of str for "a, b"); native formats give typed values.
    if kind is QByteArray:
        return raw if isinstance(raw, QByteArray) else _MISSING
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower() if isinstance(raw, (str, int)) else ""
        return {"true": True, "1": True, "false": False, "0": False}.get(text, _MISSING)
    if kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            try:
                return int(raw.strip())
            except ValueError:
                return _MISSING
        return _MISSING
    if kind is str:
        return raw if isinstance(raw, str) else _MISSING
    raise TypeError(f"settings of type {kind.__name__} are not supported")


def _read(settings: QSettings, key: str, cls: type[T], default: T, resets: list[str] | None = None) -> T:
    raw = read(settings, key, "", resets)
    if not raw:
        return default
    try:
        fields = json.loads(raw)
        hints = typing.get_type_hints(cls)
        values = {name: value for name, value in fields.items() if name in hints}
        for name in ("stop", "lookahead"):  # JSON has no tuples
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        if all(_fits(value, hints[name]) for name, value in values.items()):
            return cls(**values)
    except (ValueError, TypeError, AttributeError, ConfigError):
        pass
    reset(key, resets)
    return default


def _fits(value, hint) -> bool:
    """Whether a JSON value has the field's annotated type (a wrong one would fail only later, in the engine)."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_fits(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is tuple or hint is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(item, args[0]) for item in value)
        return all(isinstance(item, (str, int, float)) and not isinstance(item, bool) for item in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def engine_config(settings: QSettings | None = None, resets: list[str] | None = None) -> EngineConfig:
    return _read(settings or QSettings(), ENGINE_CONFIG, EngineConfig, DEFAULT_ENGINE_CONFIG, resets)


def set_engine_config(config: EngineConfig, settings: QSettings | None = None) -> None:
    _write(settings or QSettings(), ENGINE_CONFIG, config)


def sampling_config(settings: QSettings | None = None, resets: list[str] | None = None) -> SamplingConfig:
    return _read(settings or QSettings(), SAMPLING_CONFIG, SamplingConfig, DEFAULT_SAMPLING, resets)


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
        if config.min_p > 0:
            mode += f", min-p {config.min_p:g}"
    return f"{mode}, seed {config.seed}, up to {config.max_tokens} tokens"
