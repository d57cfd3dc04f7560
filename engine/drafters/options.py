"""What a drafter's options and statistics are made of: `setting(...)` and `stat(...)` fields, their
`Setting` and `Stat` metadata, and `DrafterStats`, the base of every drafter's statistics.

A leaf, below both the drafter interface (base.py: `Drafter.stats()` returns a `DrafterStats`) and
the registry (registry.py: `option_settings` and `stat_fields` read the metadata), which imports
base.py's drafters through their specs. These lived in registry.py, so base.py imported the registry
that reaches the config and the drafters: an import cycle (issue 37, part 5). registry.py re-exports
every name, as spec modules import them from there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


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
    """Base of every drafter's statistics: a frozen record whose fields are made with `stat(...)`;
    `as_dict()` is plain JSON-able data (what the charts' panels and the exports read)."""

    def as_dict(self) -> dict:
        """Plain data (tuples as lists, nested records as dicts): what stats() returned as a dict."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def describe(cls, values: dict) -> str | None:
        """A sentence for the statistics a chart cannot draw (`values`: as_dict()'s), or None:
        each uncharted number as "Label value unit" (app/charts/data.py stats_text)."""
        return None


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
