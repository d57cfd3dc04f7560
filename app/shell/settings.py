"""What the app remembers between runs, read and written through plain `QSettings()`.

The organization and application names are set once (application.py), so every
`QSettings()` here opens the same store, and tests point it at a temporary
folder. Reads are typed (`value(key, default, type)`), as in Frescobaldi.

The model pair is ONE key, `engine/config`: the engine's own versioned JSON
(`EngineConfig.to_dict()`), which the window loads, the pair dialog edits and
the presets keep. Sampling is `engine/sampling`; without it, a chat samples as the
saved target recommends, else as llama.cpp does (`SamplingConfig.for_chat`), never greedily:
Regenerate must be able to write another reply. Where the pair runs (the
window's own engine process, or a server) is `engine/choice`, an `EngineChoice`;
a store without it reads as Local, so adding it needed no version step. Anything unreadable (a hand
edit, a newer version's config) falls back to the defaults rather than
stopping the app from starting.

The store itself has a version (`settings/version`). Older stores are brought
up to date once, before the first read, by `migrate`: one small function per
version step, each reading the old keys, writing the new ones and removing
the old ones.

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

from engine import ConfigError, EngineConfig, SamplingConfig, config_from_legacy

VERSION = "settings/version"  # which of MIGRATIONS this store has been through
ENGINE_CONFIG = "engine/config"  # the model pair: EngineConfig.to_dict(), versioned by the engine
SAMPLING_CONFIG = "engine/sampling"
ENGINE_CHOICE = "engine/choice"  # where the pair runs: EngineChoice as JSON; missing = Local
PRESETS = "pair/presets"  # named pairs: {name: {"config": ..., "sampling": ...}}
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
    ENGINE_CHOICE: "engine choice",
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
DEFAULT_SAMPLING = (
    SamplingConfig.for_chat()
)  # temperature 0.8, seed 0, up to 256 tokens: the pair dialog's defaults too
# What a first start saved before issue 36 (greedy, as DEFAULT_SAMPLING was then): see _v1_to_v2.
_V1_DEFAULT_SAMPLING = SamplingConfig(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, max_tokens=256)

T = TypeVar("T")

# The kinds of engine the window can run on, in the pair dialog's order, with their names there.
ENGINE_KINDS = {
    "local": "Local",
    "specdeck": "SpecDeck server",
    "llama-server": "llama-server",
    "vllm": "vLLM",
    "sglang": "SGLang",
}
SERVER_ADAPTERS = ("llama-server", "vllm", "sglang")  # servers with their own model and speculation


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """Where the window's pair runs: its own engine process ("local"), or a server at `url`.

    "specdeck": a SpecDeck server, which loads the dialog's pair (its paths are the server's);
    "llama-server", "vllm", "sglang": a server that serves its own model, and for the side by
    side's vanilla run `vanilla_url`, a second server of that model without speculation.
    The API key is kept in the settings as typed, like the rest of them."""

    kind: str = "local"
    url: str = ""
    api_key: str = ""
    vanilla_url: str = ""

    @property
    def remote(self) -> bool:
        return self.kind != "local"

    @property
    def adapter(self) -> bool:
        """A server that brings its own model: the dialog's pair is not used."""
        return self.kind in SERVER_ADAPTERS

    def label(self) -> str:
        return ENGINE_KINDS.get(self.kind, self.kind)


LOCAL = EngineChoice()


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
    fields = _json_object(raw)
    value = _from_fields(cls, fields) if fields is not None else None
    if value is None:
        reset(key, resets)
        return default
    return value


def _fits(value, hint) -> bool:
    """Whether a JSON value has the field's annotated type (a wrong one would fail only later, in the engine)."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_fits(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is tuple:  # tuple[str, ...], as SamplingConfig.stop
        return isinstance(value, tuple) and all(_fits(item, typing.get_args(hint)[0]) for item in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def engine_config(settings: QSettings | None = None, resets: list[str] | None = None) -> EngineConfig:
    """The saved model pair; the default pair when there is none, or it cannot be read (then `resets` says so)."""
    settings = settings or QSettings()
    migrate(settings)
    raw = read(settings, ENGINE_CONFIG, "", resets)
    if not raw:
        return DEFAULT_ENGINE_CONFIG
    config = config_from_json(raw)
    if config is None:
        reset(ENGINE_CONFIG, resets)
        return DEFAULT_ENGINE_CONFIG
    return config


def set_engine_config(config: EngineConfig, settings: QSettings | None = None) -> None:
    settings = settings or QSettings()
    migrate(settings)
    settings.setValue(ENGINE_CONFIG, json.dumps(config.to_dict()))


def config_from_json(raw) -> EngineConfig | None:
    """An `EngineConfig` from its saved JSON (text or already parsed); None for a damaged value or a
    newer version's (the engine's `from_dict` refuses those with a message; the app falls back)."""
    try:
        return EngineConfig.from_dict(json.loads(raw) if isinstance(raw, str) else raw)
    except (ValueError, TypeError, AttributeError, KeyError, ConfigError):
        return None


def engine_choice(settings: QSettings | None = None, resets: list[str] | None = None) -> EngineChoice:
    """The saved engine choice; Local when there is none, or it cannot be read (then `resets` says so)."""
    settings = settings or QSettings()
    migrate(settings)
    choice = _read(settings, ENGINE_CHOICE, EngineChoice, LOCAL, resets)
    if choice.kind not in ENGINE_KINDS:  # a newer SpecDeck's kind, or a hand edit
        reset(ENGINE_CHOICE, resets)
        return LOCAL
    return choice


def set_engine_choice(choice: EngineChoice, settings: QSettings | None = None) -> None:
    settings = settings or QSettings()
    migrate(settings)
    _write(settings, ENGINE_CHOICE, choice)


def sampling_config(settings: QSettings | None = None, resets: list[str] | None = None) -> SamplingConfig:
    """The saved sampling; with none saved (or none readable), what the saved target recommends
    in its files, else DEFAULT_SAMPLING (`SamplingConfig.for_chat`)."""
    settings = settings or QSettings()
    migrate(settings)
    saved = _read(settings, SAMPLING_CONFIG, SamplingConfig, None, resets)
    return saved if saved is not None else recommended_chat_sampling(engine_config(settings))


def recommended_chat_sampling(config: EngineConfig) -> SamplingConfig:
    """The chat sampling for `config`'s target: its files' recommendation on top of DEFAULT_SAMPLING.
    Reads the GGUF header or generation_config.json (a tenth of a second), on a first start only."""
    from engine import recommended_sampling

    try:
        return SamplingConfig.for_chat(recommended_sampling(config.target))
    except Exception:  # noqa: BLE001 - a target that cannot be read recommends nothing; its load says why
        return DEFAULT_SAMPLING


def set_sampling_config(config: SamplingConfig, settings: QSettings | None = None) -> None:
    settings = settings or QSettings()
    migrate(settings)
    _write(settings, SAMPLING_CONFIG, config)


def sampling_from_dict(data) -> SamplingConfig | None:
    """A `SamplingConfig` from its saved fields (a preset's), or None when they do not make one."""
    if not isinstance(data, dict):
        return None
    return _from_fields(SamplingConfig, data)


def _from_fields(cls: type[T], fields: dict) -> T | None:
    """`cls(**fields)` when every known field has its annotated type, else None (unknown fields are ignored)."""
    try:
        hints = typing.get_type_hints(cls)
        values = {name: value for name, value in fields.items() if name in hints}
        for name in ("stop",):  # JSON has no tuples
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        if all(_fits(value, hints[name]) for name, value in values.items()):
            return cls(**values)
    except (ValueError, TypeError, AttributeError, ConfigError):
        pass
    return None


# -- presets: named pairs, each the engine config and its sampling ------------------------------------


def presets(settings: QSettings | None = None) -> dict[str, dict]:
    """The saved presets as stored: {name: {"config": EngineConfig.to_dict(), "sampling": {...}}}.

    One JSON object under one key: a name may hold any character, even "/" that QSettings
    would read as a group separator. A damaged value reads as no presets.
    """
    settings = settings or QSettings()
    migrate(settings)
    try:
        data = json.loads(read(settings, PRESETS, ""))
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(name): value for name, value in data.items() if isinstance(value, dict)}


def set_presets(presets: dict[str, dict], settings: QSettings | None = None) -> None:
    settings = settings or QSettings()
    migrate(settings)
    settings.setValue(PRESETS, json.dumps(presets, sort_keys=True))


def preset_value(config: EngineConfig, sampling: SamplingConfig) -> dict:
    return {"config": config.to_dict(), "sampling": dataclasses.asdict(sampling)}


# -- migrations: one function per version step -------------------------------------------------------


def migrate(settings: QSettings) -> None:
    """Bring a store written by an older SpecDeck up to SETTINGS_VERSION, once.

    A store from a newer SpecDeck is left as it is: its values are read where they
    can be, and what cannot be falls back to the defaults (the readers say so).
    """
    version = read(settings, VERSION, 0)
    if version >= SETTINGS_VERSION:
        return
    for step in MIGRATIONS[max(version, 0) :]:
        step(settings)
    settings.setValue(VERSION, SETTINGS_VERSION)


# The pair dialog's own keys before version 1 (pair_dialog/<field>, written by its save_choice), with
# the default each had: an INI file gives back text, so the default's type says how to read it.
_V0_PAIR_FIELDS = {
    "target": "default",
    "drafter": "ngram",
    "draft": "default",
    "heads": "",
    "eagle_heads": "",
    "tree_depth": "auto",
    "lookahead_window": "auto",
    "lookahead_ngram": "auto",
    "lookahead_candidates": "auto",
    "exit_layer": "auto",
    "backend": "auto",
    "draft_backend": "auto",
    "k_auto": True,
    "k": 4,
    "k_max": 16,
    "ngram_max": 3,
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "seed": 0,
    "max_tokens": 512,
    "device": "auto",
    "dtype": "auto",
    "threads": 0,
    "gpu_layers": 0,
    "n_ctx": 0,
}
_V0_PREFIX = "pair_dialog"
_V0_PRESETS = "pair_dialog/presets"
_V0_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens")


def _v0_to_v1(settings: QSettings) -> None:
    """Issue 13: one model pair under one key. Before, the window kept `engine/config` (the flat
    EngineConfig of that time, unversioned) and the pair dialog its own `pair_dialog/<field>` keys,
    so after "Use the built-in model" the dialog still showed the pair that had failed.

    The window's key wins: it is what loaded last. The dialog's keys count only where the window
    saved nothing. Presets (PairChoice dicts under pair_dialog/presets) become config + sampling.
    A value that cannot be converted is left for the reader, which falls back and says so.
    """
    dialog = {
        name: settings.value(f"{_V0_PREFIX}/{name}")
        for name in _V0_PAIR_FIELDS
        if settings.contains(f"{_V0_PREFIX}/{name}")
    }
    raw = settings.value(ENGINE_CONFIG)
    if isinstance(raw, str) and raw:
        flat = _json_object(raw)
        if flat is not None and "version" not in flat:
            converted = _v0_engine_dict(flat)
            if converted is not None:
                settings.setValue(ENGINE_CONFIG, json.dumps(converted))
    elif dialog:
        converted = _v0_engine_dict(_v0_choice_to_flat(_v0_choice(dialog)))
        if converted is not None:
            settings.setValue(ENGINE_CONFIG, json.dumps(converted))
    if dialog and not settings.contains(SAMPLING_CONFIG):
        settings.setValue(SAMPLING_CONFIG, json.dumps(_v0_choice_sampling(_v0_choice(dialog))))
    old_presets = _json_object(settings.value(_V0_PRESETS) if settings.contains(_V0_PRESETS) else "")
    if old_presets:
        new = {}
        for name, value in old_presets.items():
            if isinstance(value, dict):
                choice = _v0_choice(value)
                engine = _v0_engine_dict(_v0_choice_to_flat(choice))
                if engine is not None:
                    new[str(name)] = {"config": engine, "sampling": _v0_choice_sampling(choice)}
        if new:
            settings.setValue(PRESETS, json.dumps(new, sort_keys=True))
    for name in (*_V0_PAIR_FIELDS, "presets"):
        settings.remove(f"{_V0_PREFIX}/{name}")


def _v1_to_v2(settings: QSettings) -> None:
    """Issue 36: chats sample by default (Regenerate gave the same reply again). Before, the
    window saved its sampling with every pair it loaded, so a store holding exactly the old
    greedy default most likely holds a default nobody chose (greedy was no choice then: it was
    all there was unless one changed the temperature): it goes, and the new default applies. A
    store where anything differs from it (a seed, a length, a temperature) was chosen and stays,
    greedy included; from this version on, greedy saved by the user is kept as it is."""
    fields = _json_object(settings.value(SAMPLING_CONFIG)) if settings.contains(SAMPLING_CONFIG) else None
    if fields is not None and _from_fields(SamplingConfig, fields) == _V1_DEFAULT_SAMPLING:
        settings.remove(SAMPLING_CONFIG)


MIGRATIONS = (_v0_to_v1, _v1_to_v2)  # MIGRATIONS[v] takes a store from version v to v + 1
SETTINGS_VERSION = len(MIGRATIONS)


def _json_object(raw) -> dict | None:
    try:
        data = json.loads(raw) if isinstance(raw, str) and raw else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _v0_choice(values: dict) -> dict:
    """A version-0 PairChoice from stored values: each as its default's type, or the default."""
    choice = {}
    for name, default in _V0_PAIR_FIELDS.items():
        value = values.get(name, default)
        try:
            if isinstance(default, bool):
                value = value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")
            else:
                value = type(default)(value)
        except (TypeError, ValueError):
            value = default
        choice[name] = value
    return choice


def _v0_auto(text, auto):
    """A version-0 "auto or a whole number" text as the config's value: `auto`, or the int."""
    text = str(text).strip().lower().removeprefix("+")
    return int(text) if text.isdigit() and text.isascii() else auto


def _v0_choice_to_flat(c: dict) -> dict:
    """What version 0's PairChoice.engine_config made of a choice: the flat EngineConfig fields of that time."""
    drafter = c["drafter"]
    return {
        "target": c["target"].strip(),
        "drafter": drafter,
        "draft": c["draft"].strip() if drafter == "model" else None,
        "heads": {"medusa": c["heads"], "eagle": c["eagle_heads"]}.get(drafter, "").strip() or None,
        "backend": c["backend"],
        "draft_backend": c["draft_backend"],
        "device": c["device"],
        "dtype": c["dtype"],
        "n_ctx": c["n_ctx"] or None,
        "threads": c["threads"] or None,
        "gpu_layers": c["gpu_layers"],
        "k": "auto" if c["k_auto"] else c["k"],
        "k_max": c["k_max"],
        "ngram_max": c["ngram_max"],
        "tree_depth": _v0_auto(c["tree_depth"], None) if drafter == "eagle" else None,
        "lookahead": [_v0_auto(c[f"lookahead_{x}"], "auto") for x in ("window", "ngram", "candidates")],
        "exit_layer": _v0_auto(c["exit_layer"], "auto") if drafter == "early-exit" else "auto",
    }


def _v0_choice_sampling(c: dict) -> dict:
    return {name: c[name] for name in _V0_SAMPLING} | {"stop": []}


def _v0_engine_dict(flat: dict) -> dict | None:
    """Version 0's flat EngineConfig fields as today's versioned config dict (the engine's own
    conversion: each drafter's fields become its options); None when they make no config."""
    try:
        return config_from_legacy(flat).to_dict()
    except (ValueError, TypeError, AttributeError, KeyError, ConfigError):
        return None


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
