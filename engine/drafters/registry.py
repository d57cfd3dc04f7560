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
(eagle_spec.py beside eagle.py) and is imported inside `make`.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.config import EngineConfig
    from engine.drafters.base import Drafter
    from engine.models.doctor import Finding
    from engine.preflight import PreflightContext

SPEC_SUFFIX = "_spec"  # engine/drafters/<name>_spec.py: a module that defines DRAFTER
AUTO = "auto"
FALLBACK_DRAFTER = "ngram"  # the default drafter on a backend no spec names in `default_on`


# -- options and statistics: field metadata ------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One drafter option as the CLI and the app see it (`option_settings` fills in name and default)."""

    label: str
    help: str
    minimum: int | float | None = None
    maximum: int | float | None = None
    auto: bool = False  # "auto" is allowed besides a number
    choices: tuple | None = None
    cli: tuple[str, ...] = ()  # the flags, e.g. ("-md", "--draft"); () = "--" + the name with dashes
    kind: str | None = None  # what the value is, for the app's input: "path", "model", "backend", "device", "dtype",
    #                        "gpu-layers" (llama.cpp's: auto, all or a count)
    name: str = ""
    default: Any = None

    @property
    def flags(self) -> tuple[str, ...]:
        return self.cli or ("--" + self.name.replace("_", "-"),)

    @property
    def dest(self) -> str:
        """The argparse destination: the long flag without dashes (shared by drafters with one flag)."""
        return self.flags[-1].lstrip("-").replace("-", "_")


def setting(
    default,
    *,
    label: str,
    help: str,
    minimum=None,
    maximum=None,
    auto: bool = False,
    choices=None,
    cli: str | tuple[str, ...] | None = None,
    kind: str | None = None,
):
    """A dataclass field for a drafter option, carrying its `Setting`."""
    flags = (cli,) if isinstance(cli, str) else tuple(cli or ())
    meta = Setting(label, help, minimum, maximum, auto, tuple(choices) if choices else None, flags, kind)
    return field(default=default, metadata={"setting": meta})


@dataclass(frozen=True)
class Stat:
    """One drafter statistic: how the app labels and charts it."""

    label: str
    unit: str | None = None
    chart: bool = True  # drawn over the run (a number per step); False: shown as text only
    name: str = ""


def stat(*, label: str, unit: str | None = None, chart: bool = True, default=dataclasses.MISSING):
    """A dataclass field for a drafter statistic, carrying its `Stat`."""
    return field(default=default, metadata={"stat": Stat(label, unit, chart)})


@dataclass(frozen=True)
class DrafterStats:
    """Base of every drafter's statistics. `as_dict()` is plain JSON-able data; `keys()` and
    `[name]` read it as the dict `Drafter.stats()` used to return (`dict(stats)` works)."""

    def as_dict(self) -> dict:
        """Plain data (tuples as lists, nested records as dicts): what stats() returned as a dict."""
        return _plain(dataclasses.asdict(self))

    def keys(self):
        return [f.name for f in dataclasses.fields(self)]

    def __getitem__(self, name: str):
        return self.as_dict()[name]

    def get(self, name: str, default=None):
        return self.as_dict().get(name, default)

    @classmethod
    def describe(cls, values: dict) -> str | None:
        """A sentence for the statistics a chart cannot draw (`values`: as_dict()'s), or None:
        each uncharted number as "Label value unit" (app/charts/data.py stats_text)."""
        return None

    def __contains__(self, name: str) -> bool:
        return name in self.keys()


def _plain(value):
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class NoStats(DrafterStats):
    """A drafter with nothing of its own to report."""


def stat_fields(stats: type | DrafterStats) -> tuple[Stat, ...]:
    """The statistics a stats type (or value) carries, with their names, in field order."""
    return tuple(
        dataclasses.replace(f.metadata["stat"], name=f.name) for f in dataclasses.fields(stats) if "stat" in f.metadata
    )


# -- the spec ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """What `make` gets besides the target and the options: the target's load options (a draft
    model follows them where its own are unset) and the progress of a draft model's load."""

    target_options: dict
    progress: Callable[[str, float], None] | None = None


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # the CLI's and the config's value: "eagle"
    label: str  # for people: "EAGLE head"
    summary: str  # one sentence, for the pair dialog
    options: type  # a frozen dataclass of `setting` fields; its defaults are the drafter's defaults
    make: Callable[[Backend, Any, Load], Drafter | None]
    needs: tuple[type, ...] = ()  # capability protocols of engine/backends/capabilities.py
    preflight: Callable[[PreflightContext, Any], list[Finding]] | None = None  # metadata-only checks
    stats: type = NoStats  # the DrafterStats subclass its Drafter.stats() returns
    loads_model: bool = False  # loads a model of its own (the draft model): a share of the load's progress
    torch_reason: str = ""  # why the target must run on PyTorch, one sentence (a spec with `needs`)
    choice_label: str = ""  # how the pair dialog lists it, where that says more than `label` ("" = label)
    trees: bool = False  # drafts trees where the target verifies them (`node_budget`): k is then a node budget
    draft_probabilities: bool = False  # its drafts carry the drafter's probabilities q (a request's p_min applies)
    order: int = 1000  # where lists put it (lower first; equal orders by name): a new drafter comes last
    short_name: str = ""  # what the status bar calls it once loaded ("n-gram drafter"; "" = label)
    depth_label: str = ""  # what the charts' per-depth acceptance bars count: "head", "depth" or "position"
    #                        ("" = "depth" for a drafter of trees, else "position")
    # Whether a loaded target can serve it with these options and nothing more (heads on disk, the
    # model's own MTP layers, a loaded draft model), besides `needs`: auto-tune's candidates. None: always.
    ready: Callable[[Backend, Any], bool] | None = None
    default_on: tuple[str, ...] = ()  # the backends where it is the default drafter (measured fastest there)

    @property
    def needs_torch(self) -> bool:
        """Whether the target must run on the PyTorch backend (only it has any capability)."""
        return bool(self.needs)

    def trees_on(self, backend: str) -> bool:
        """Whether it drafts trees on a target of `backend` (see `node_budget`)."""
        return self.trees and backend == "torch"

    @property
    def short(self) -> str:
        """Its name in a sentence about what is loaded: `short_name`, else `label`."""
        return self.short_name or self.label

    @property
    def depth_unit(self) -> str:
        """What one bar of the per-depth acceptance counts: "head", "depth" or "position"."""
        return self.depth_label or ("depth" if self.trees else "position")

    def can_serve(self, target: Backend, options: Any = None) -> bool:
        """Whether the loaded `target` has every capability it needs and, with `options` (None: its
        defaults), whatever else `ready` asks: what auto-tune tries."""
        from engine.backends.capabilities import has

        if not all(has(target, need) for need in self.needs):
            return False
        return self.ready is None or bool(self.ready(target, self.options() if options is None else options))


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
    trees (`DrafterSpec.trees`) on PyTorch, the backend that verifies trees (TreeForward); on
    llama.cpp its trees are cut to their best branch, and k is a draft length."""
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
