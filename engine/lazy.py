"""Packages whose names are imported on first use: `engine.bench` and `engine.training` export records
that load no torch beside functions that do, so `from engine.bench import BenchReport` must not
import the runner."""

from __future__ import annotations

from importlib import import_module
from typing import Callable


def lazy_getattr(package: str, table: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: name -> the submodule (of `package`) that defines it.
    Once imported, a name becomes an ordinary attribute of the package."""

    def __getattr__(name: str):
        if name in table:
            value = getattr(import_module(f".{table[name]}", package), name)
            setattr(import_module(package), name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
