"""The one list of drafters: what each is called, needs, takes as options, checks and reports.

A drafter is one module and one entry here. Each spec module on this package's
path (`engine/drafters/<name>_spec.py`) defines a module-level

    DRAFTER = DrafterSpec(name="eagle", label="EAGLE head", summary="...", options=EagleOptions,
                          needs=(HiddenFeatures, TreeForward, ModelParts), make=make, preflight=preflight,
                          stats=EagleStats)

and the registry finds it by scanning the package (pkgutil over `engine.drafters.__path__`):
a new `*_spec.py` module placed there registers itself, and the CLI's flags and --drafter
choices, the pair dialog's entry and fields, the preflight text, the charts (depth bars,
trees drawn as trees, the drafter panel), auto-tune's candidates, the status line's name,
where it is listed and whether it is a backend's default drafter follow from its spec
(tests/app/pair/test_every_drafter_everywhere.py walks every drafter, and a new one, through them).
Spec modules are light (no torch at import: the CLI's `models` and `doctor` start fast,
and the app reads the registry on its GUI thread); the algorithm lives beside the spec
(eagle_spec.py beside eagle.py), and `make` names it (`engine.lazy.named`): the
algorithm imports its spec.

Options are one frozen dataclass per drafter, each field made with `setting(...)`, whose
metadata (label, help, range, "auto" allowed, choices, CLI flag, kind of value) is what
the CLI and the pair dialog build their inputs from (`option_settings`). Statistics are
one frozen dataclass per drafter too (`DrafterStats`), fields made with `stat(...)`.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.drafters.options import (  # noqa: F401 (re-exported: spec modules import them from here)
    DrafterStats,
    NoStats,
    Setting,
    Stat,
    setting,
    stat,
    stat_fields,
)
from engine.drafters.spec import DrafterSpec, Load
from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.config import EngineConfig
    from engine.drafters.base import Drafter

SPEC_SUFFIX = "_spec"  # engine/drafters/<name>_spec.py: a module that defines DRAFTER
AUTO = "auto"
FALLBACK_DRAFTER = "ngram"  # the default drafter on a backend no spec names in `default_on`


_registry: dict[str, DrafterSpec] | None = None


def all_drafters() -> tuple[DrafterSpec, ...]:
    """Every registered drafter, by its spec's `order`, then by name."""
    return tuple(_specs().values())


def default_drafter(backend: str) -> str:
    """The drafter of a user who chooses none, for a target running on `backend` ("torch",
    "llama.cpp"): the one whose spec names that backend in `default_on`, measured fastest there
    (docs/benchmarks.md: suffix decoding on PyTorch, n-gram lookup on llama.cpp); n-gram lookup
    where no spec names the backend."""
    return next((spec.name for spec in all_drafters() if backend in spec.default_on), FALLBACK_DRAFTER)


def drafter_names() -> tuple[str, ...]:
    return tuple(_specs())


def drafter_spec(name: str) -> DrafterSpec:
    """The entry of drafter `name`: a registered one, or a chain of them ("suffix+model", chain_spec.py)."""
    spec = _specs().get(name)
    if spec is None:
        from engine.drafters.chain_spec import chained_spec, is_chain

        if is_chain(name):
            return chained_spec(name, drafter_spec)
        raise ConfigError(
            f"Unknown drafter {name!r}: choose one of {', '.join(_specs())}, or chain some with '+' (suffix+model)."
        )
    return spec


def node_budget(name: str, backend: str) -> bool:
    """Whether drafter `name` on a target of `backend` takes k as a tree's node budget: a drafter of
    trees (`DrafterSpec.trees`) on a backend that verifies trees (TreeForward: PyTorch, and llama.cpp
    but for models with recurrent layers, where its trees are cut to their best branch)."""
    return drafter_spec(name).trees_on(backend)


def is_drafter(name) -> bool:
    """Whether `name` is a registered drafter or a chain of registered drafters that can be made."""
    if name in _specs():
        return True
    try:
        from engine.drafters.chain_spec import is_chain

        return is_chain(name) and drafter_spec(name) is not None
    except ConfigError:
        return False


def suggested_chains() -> tuple[DrafterSpec, ...]:
    """The chains a list of choices offers beside the registered drafters (those whose members exist)."""
    from engine.drafters.chain_spec import SUGGESTED

    return tuple(drafter_spec(name) for name in SUGGESTED if is_drafter(name))


def stats_specs() -> tuple[DrafterSpec, ...]:
    """Every entry whose statistics may be charted: the registered drafters, then chains' (one
    entry, "chain", for all of them: who drafted each step)."""
    from engine.drafters.chain_spec import CHAIN_STATS

    return (*all_drafters(), CHAIN_STATS)


def stats_owner(name: str | None) -> DrafterSpec | None:
    """The entry whose statistics drafter `name` reports: its own, or for a chain (and for the
    name "chain" itself) the chains' one."""
    from engine.drafters.chain_spec import CHAIN_STATS, STATS_NAME, is_chain

    if is_chain(name) or name == STATS_NAME:
        return CHAIN_STATS
    return _specs().get(name)


def options_owner(options_type: type) -> DrafterSpec | None:
    """The drafter (or chain looked up so far) whose options type this is."""
    from engine.drafters.chain_spec import made_chains

    return next((spec for spec in (*all_drafters(), *made_chains()) if spec.options is options_type), None)


def option_settings(spec: DrafterSpec | str) -> tuple[Setting, ...]:
    """The drafter's options with their metadata, names and defaults, in field order."""
    spec = drafter_spec(spec) if isinstance(spec, str) else spec
    return tuple(
        dataclasses.replace(f.metadata["setting"], name=f.name, default=f.default)
        for f in dataclasses.fields(spec.options)
        if "setting" in f.metadata
    )


def rescan() -> None:
    """Forget the list, so that the next call scans the package again (a module added at run time)."""
    global _registry
    _registry = None


def _specs() -> dict[str, DrafterSpec]:
    global _registry
    if _registry is None:
        import engine.drafters as package

        found: dict[str, DrafterSpec] = {}
        for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            if module.ispkg or not module.name.endswith(SPEC_SUFFIX):
                continue
            spec = getattr(importlib.import_module(f"{package.__name__}.{module.name}"), "DRAFTER", None)
            if isinstance(spec, DrafterSpec):
                if spec.name in found:
                    raise ConfigError(f"Two drafter modules register the name {spec.name!r}.")
                found[spec.name] = spec
        _registry = dict(sorted(found.items(), key=lambda item: (item[1].order, item[0])))
    return _registry


# -- making one ------------------------------------------------------------------------------------


def make_drafter(
    target: Backend, config: EngineConfig, progress: Callable[[str, float], None] | None = None
) -> Drafter | None:
    """The drafter `config` asks for, on the loaded `target`: its options checked, every need of
    the spec checked once (`capabilities.require`, one message per capability), then made."""
    from engine.backends.capabilities import require
    from engine.models.load_options import target_load_options

    spec = drafter_spec(config.drafter)
    options = config.drafter_options()
    for capability in spec.needs:
        require(target, capability, spec.label)
    return spec.make(target, options, Load(target_load_options(config), progress))


# -- helpers for spec modules ------------------------------------------------------------------------


def auto_or_int(value, label: str, minimum: int, maximum: int | None, advice: str) -> int | None:
    """An "auto"-or-whole-number option as an int, None for "auto"; a ConfigError naming `label`
    and the range otherwise. A string of digits (what a user typed) counts as its number."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    if isinstance(value, str) and value.strip().lstrip("+").isdigit():
        value = int(value)
    span = f"of {minimum} or more" if maximum is None else f"from {minimum} to {maximum}"
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        raise ConfigError(f"{label} must be a whole number {span} or 'auto', got {value!r}. {advice}")
    return value


def heads_ready(kind: str) -> Callable[[Backend, Any], bool]:
    """A spec's `ready` for a drafter of trained heads: a heads folder given (its `heads` option), or
    heads of `kind` shipped for the loaded target."""

    def ready(target, options) -> bool:
        from engine.models.shipped import default_heads_dir

        return bool(getattr(options, "heads", None) or default_heads_dir(kind, target.info))

    return ready
