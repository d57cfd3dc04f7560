"""`EngineConfig`: one choice of target, drafter and settings, as the engine, the CLI and the app hold it.

A config without a drafter (`EngineConfig()`, `EngineConfig(target=...)`: nothing chosen) gets the
one measured fastest on the backend that runs (`default_drafter_for`); a drafter given is kept.

The chosen drafter's settings are one frozen options object (`options`, the type its
registry spec names; None = its defaults), so a new drafter adds no field here. The draft
model is the "model" drafter's option: what used to be `EngineConfig(draft=M)` is
`EngineConfig(drafter="model", options=ModelOptions(draft=M))`, or
`EngineConfig().with_drafter("model", draft=M)` (the CLI's --draft implies --drafter model).

Construction checks nothing: the app keeps what the user typed (even "0" for an
"auto"-or-number setting), and `engine.preflight` and the drafter's `make` say what is
wrong with the engine's own messages. `to_dict` / `from_dict` are plain JSON-able data
with a version, for the app's settings and a future engine service.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.errors import ConfigError

CONFIG_VERSION = 1
MODEL_DRAFTER = "model"  # the drafter of a draft model; a config with a draft model uses it

# What the load options accept, without importing the backends (torch): the app's choices.
BACKENDS = ("auto", "torch", "llama.cpp")
DEVICES = ("auto", "cpu", "cuda", "mps")  # engine/backends/hf/device.py's DEVICES, plus auto
DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")  # device.py's DTYPE_CHOICES, without the aliases
# The PyTorch native forward's path (engine/backends/hf/static.py): auto = eager on every device (CUDA graphs
# have not run on a GPU yet: opt-in); on = static shapes on any device, with CUDA graphs on CUDA; off = eager.
COMPILES = ("auto", "off", "on")


@dataclass(frozen=True)
class EngineConfig:
    target: str = "default"
    # A registry name (engine.drafters.registry.all_drafters()), or a chain: "suffix+model". None (nothing
    # chosen): the drafter measured fastest on the backend that runs (`default_drafter_for`), set at construction.
    drafter: str | None = None
    options: Any = None  # the drafter's options (its spec's `options` type); None = its defaults
    backend: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    compile: str = "auto"  # one of COMPILES (PyTorch backend; a draft model follows the target)
    n_ctx: int | None = None
    threads: int | None = None
    gpu_layers: int | str = "auto"  # llama.cpp: "auto" (none until offload has run on a GPU: opt-in) or a count
    k: int | str = "auto"
    k_max: int = 16
    measure_costs: bool = True  # time the target's verify-cost curve (and the drafter's token cost) at load
    parallel: int = 1  # sequences decoded together (a server's --parallel: engine/core/batch.py), each with its n_ctx

    def __post_init__(self) -> None:
        # None means the drafter's defaults: filled in, so that equal choices compare equal. So do
        # another drafter's untouched defaults (`replace(config, drafter=...)` switches drafters).
        from engine.drafters.registry import drafter_spec, is_drafter, option_settings

        if self.drafter is None:
            object.__setattr__(self, "drafter", default_drafter_for(self.target, self.backend))
        if not is_drafter(self.drafter):
            return  # an unknown drafter (or a chain that cannot be made): the load and preflight say so
        spec = drafter_spec(self.drafter)
        if isinstance(self.options, spec.options):
            return
        owner = _owner(type(self.options)) if self.options is not None else None
        untouched = owner is not None and all(
            getattr(self.options, s.name) == s.default for s in option_settings(owner)
        )
        if self.options is None or untouched:
            object.__setattr__(self, "options", spec.options())

    def drafter_options(self):
        """The drafter's options, its defaults filled in; a ConfigError for an unknown drafter or
        options that belong to another drafter."""
        from engine.drafters.registry import drafter_spec, option_settings

        spec = drafter_spec(self.drafter)
        if self.options is None:
            return spec.options()
        if isinstance(self.options, spec.options):
            return self.options
        owner = _owner(type(self.options))
        if owner is None:
            raise ConfigError(
                f"The {self.drafter} drafter's options must be {spec.options.__name__}, "
                f"got {type(self.options).__name__}."
            )
        given = [s for s in option_settings(owner) if getattr(self.options, s.name) != s.default]
        if not given:  # another drafter's defaults (replace(config, drafter=...)): nothing was set
            return spec.options()
        flag = given[0].flags[-1]
        if owner.name == MODEL_DRAFTER:
            raise ConfigError(
                f"{flag} sets up a draft model, but none is loaded: give one with --draft, or drop {flag}."
            )
        raise ConfigError(
            f"{flag} is an option of the {owner.name} drafter, but the drafter is {self.drafter}: "
            f"choose --drafter {owner.name}, or drop {flag}."
        )

    def with_drafter(self, name: str, **option_changes) -> EngineConfig:
        """This config with drafter `name` and its options: the current ones when they are that
        drafter's, else its defaults, with `option_changes` applied."""
        from engine.drafters.registry import drafter_spec

        spec = drafter_spec(name)
        base = self.options if isinstance(self.options, spec.options) else spec.options()
        try:
            options = dataclasses.replace(base, **option_changes)
        except TypeError:
            names = ", ".join(f.name for f in dataclasses.fields(spec.options)) or "none"
            raise ConfigError(
                f"The {name} drafter has no option among {sorted(option_changes)}; its options: {names}."
            ) from None
        return dataclasses.replace(self, drafter=name, options=options)

    @property
    def draft(self) -> str | None:
        """The draft model of the "model" drafter, else None."""
        return getattr(self.options, "draft", None) if self.drafter == MODEL_DRAFTER else None

    @property
    def heads(self) -> str | None:
        """The heads folder of a drafter that reads trained heads (Medusa, EAGLE), else None."""
        return getattr(self.options, "heads", None)

    # -- plain data ----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """JSON-able data: every field, the options as a dict of the drafter's option fields."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "options"}
        data["options"] = _plain(dataclasses.asdict(self.drafter_options()))
        return {"version": CONFIG_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict) -> EngineConfig:
        """The config `to_dict` wrote. Raises ConfigError naming the field and what to do for an
        unknown drafter or field, a wrong type, or a newer version than this SpecDeck reads."""
        from engine.drafters.registry import drafter_names, drafter_spec, is_drafter

        if not isinstance(data, dict):
            raise ConfigError(f"A saved engine configuration must be a JSON object, got {type(data).__name__}.")
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ConfigError(f"The saved engine configuration has no valid version ({version!r}): save it again.")
        if version > CONFIG_VERSION:
            raise ConfigError(
                f"The saved engine configuration is version {version}, newer than this SpecDeck reads "
                f"({CONFIG_VERSION}): update SpecDeck, or choose the pair again."
            )
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known) - {"version"})
        if unknown:
            raise ConfigError(
                f"The saved engine configuration has an unknown field {unknown[0]!r}: "
                "remove it, or choose the pair again."
            )
        drafter = data.get("drafter") or default_drafter_for(
            data.get("target", cls.target), data.get("backend", "auto")
        )
        if not is_drafter(drafter):
            raise ConfigError(
                f"The saved drafter {drafter!r} is not one this SpecDeck knows ({', '.join(drafter_names())}, "
                "or a chain of them such as suffix+model): choose another drafter, or install the module "
                "that provides it."
            )
        values = {}
        for name in known:
            if name in ("options", "drafter") or name not in data:
                continue
            values[name] = _checked(name, data[name], _FIELD_TYPES[name])
        if values.get("compile", "auto") not in COMPILES:
            raise ConfigError(
                f"The saved compile setting must be one of {', '.join(COMPILES)}, got "
                f"{values['compile']!r}: fix it, or choose the pair again."
            )
        spec = drafter_spec(drafter)
        options = data.get("options") or {}
        if not isinstance(options, dict):
            raise ConfigError(f"The saved {drafter} options must be a JSON object, got {type(options).__name__}.")
        return cls(drafter=drafter, options=options_from_dict(spec, options), **values)


def options_from_dict(spec, data: dict):
    """`spec`'s options from plain data, each value checked against its field's type."""
    import typing

    hints = typing.get_type_hints(spec.options)
    fields = {f.name for f in dataclasses.fields(spec.options)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(
            f"The {spec.name} drafter has no option {unknown[0]!r}: remove it from the saved "
            "configuration, or choose the pair again."
        )
    values = {name: _checked(f"{spec.name} option {name}", value, _types(hints[name])) for name, value in data.items()}
    return spec.options(**values)


# JSON types each EngineConfig field may hold (an "auto"-or-number may hold any number the user typed).
_FIELD_TYPES = {
    "target": (str,),
    "backend": (str,),
    "device": (str,),
    "dtype": (str,),
    "compile": (str,),
    "n_ctx": (int, type(None)),
    "threads": (int, type(None)),
    "gpu_layers": (int, str),
    "k": (int, str),
    "k_max": (int,),
    "measure_costs": (bool,),
    "parallel": (int,),
}


def _types(hint) -> tuple[type, ...]:
    import types
    import typing

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(hint) for t in _types(arg))
    if hint is float:
        return (float, int)
    return (typing.get_origin(hint) or hint,) if hint is not typing.Any else (object,)


def _checked(name: str, value, allowed: tuple[type, ...]):
    ok = any(
        isinstance(value, t) and not (isinstance(value, bool) and t is not bool and bool not in allowed)
        for t in allowed
    )
    if not ok:
        names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
        raise ConfigError(f"The saved {name} must be {names}, got {value!r}: fix it, or choose the pair again.")
    return tuple(value) if isinstance(value, list) and tuple in allowed else value


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _owner(options_type: type):
    from engine.drafters.registry import options_owner

    return options_owner(options_type)


def default_drafter_for(target: str, backend: str = "auto") -> str:
    """The drafter of a user who chooses none, for `target` on `backend`: the one measured fastest on the
    backend that runs (the registry's `default_drafter`: suffix decoding on PyTorch, n-gram lookup on
    llama.cpp, docs/benchmarks.md). Backend "auto" runs a GGUF file on llama.cpp and a model folder on
    PyTorch; a target that cannot be found (the load says why) gets the llama.cpp one, as the default model."""
    from engine.drafters.registry import default_drafter

    if backend == "auto":
        from engine.errors import SpecDeckError
        from engine.models.locate import resolve

        try:
            backend = "llama.cpp" if resolve(str(target)).kind == "gguf" else "torch"
        except (SpecDeckError, OSError, ValueError):
            backend = "llama.cpp"
    return default_drafter(backend)


def target_backend(config: EngineConfig) -> str:
    """The backend for the target: as asked, except that "auto" means PyTorch for drafters
    that need what only it has (hidden states, tree masks, the target's own layers: the
    spec's `needs`); a GGUF target then loads through transformers, dequantized."""
    from engine.drafters.registry import drafter_spec

    if config.backend == "auto" and drafter_spec(config.drafter).needs_torch:
        return "torch"
    return config.backend


# -- the flat configuration of SpecDeck before CONFIG_VERSION 1 ------------------------------------

# Old flat field -> (drafter, option) it became; "draft*" fields are the model drafter's.
LEGACY_OPTIONS = {
    "draft": ("model", "draft"),
    "draft_backend": ("model", "backend"),
    "draft_device": ("model", "device"),
    "draft_dtype": ("model", "dtype"),
    "draft_threads": ("model", "threads"),
    "draft_gpu_layers": ("model", "gpu_layers"),
    "ngram_max": ("ngram", "max_ngram"),
    "heads": ("medusa|eagle", "heads"),
    "tree_depth": ("eagle", "tree_depth"),
    "exit_layer": ("early-exit", "exit_layer"),
}


def from_legacy(data: dict) -> EngineConfig:
    """An EngineConfig from the flat fields of SpecDeck before version 1 (what the app saved as
    `dataclasses.asdict(EngineConfig)`, and what EngineConfig(...) took): draft=M meant drafter
    "model"; the drafter's own fields become its options, the other drafters' are dropped.
    Unknown fields are ignored; values, and an unknown drafter, are taken as they are (the load
    and preflight say what is wrong)."""
    from engine.drafters.registry import drafter_spec, is_drafter

    drafter = "model" if data.get("draft") else data.get("drafter")
    drafter = drafter or default_drafter_for(
        str(data.get("target", EngineConfig.target)), str(data.get("backend", "auto"))
    )
    top = {f.name for f in dataclasses.fields(EngineConfig)} - {"drafter", "options"}
    values = {name: data[name] for name in top if name in data}
    if not is_drafter(drafter):  # kept as it was: the load or preflight says it is unknown
        return EngineConfig(drafter=drafter, **values)
    spec = drafter_spec(drafter)
    fields = {f.name for f in dataclasses.fields(spec.options)}
    options = {}
    for old, (owners, name) in LEGACY_OPTIONS.items():
        value = data.get(old)
        if drafter in owners.split("|") and name in fields and value is not None:
            options[name] = value
    if drafter == "lookahead" and isinstance(data.get("lookahead"), (list, tuple)):
        options.update(zip(("window", "ngram", "candidates"), data["lookahead"]))
    if drafter == "eagle" and options.get("tree_depth") is None:
        options.pop("tree_depth", None)
    stray = {
        name: data[old]
        for old, (owner, name) in LEGACY_OPTIONS.items()
        if owner == "model" and old not in ("draft", "draft_backend") and data.get(old) is not None
    }
    if drafter != "model" and stray:  # draft options without a draft: kept, so that the load refuses them
        return EngineConfig(drafter=drafter, options=drafter_spec("model").options(**stray), **values)
    return EngineConfig(drafter=drafter, options=spec.options(**options), **values)
