"""Packages whose names are imported on first use: `engine.bench` and `engine.training` export records
that load no torch beside functions that do, so `from engine.bench import BenchReport` must not
import the runner; `engine` itself imports none of its modules until a name is used. And `named`:
what a module names above its own layer, imported when used (docs/architecture.md, "The layers of
the engine")."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module


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


def function_over_module(package: str, name: str) -> None:
    """Make `package.name` the function `name` of the submodule `package.name`, imported on first use.

    `engine.preflight` is both a module and its function. Whoever first imports the module
    (`from engine.preflight import Preflight`, anywhere) makes the import system bind it to the
    package's attribute of that name, and `engine.preflight(config)` would then call a module.
    A property of the package's class outranks that binding: the name always gives the function.
    Another value set on it (a test's monkeypatch) is kept until deleted or set back."""
    module = sys.modules[package]
    submodule, replaced = f"{package}.{name}", {}

    def get(self):
        return replaced[name] if name in replaced else getattr(import_module(submodule), name)

    def set_(self, value) -> None:
        if value is not sys.modules.get(submodule):  # the import system binding the submodule: ignored
            replaced[name] = value

    def delete(self) -> None:
        replaced.pop(name, None)

    cls = type(module)
    module.__class__ = type(cls.__name__, (cls,), {name: property(get, set_, delete)})


def named(path: str):
    """What `path`, "package.module:name", names, imported now (once imported, Python's cache).

    For a module that names code above its own layer, which imports it: a drafter's spec names the
    algorithm that makes its drafter (`make`), and the algorithm imports its spec for its statistics
    and limits. An import there would be a cycle; tests/engine/test_layering.py checks that every
    name given to `named` in engine/ is defined where it says."""
    module, _, name = path.partition(":")
    return getattr(import_module(module), name)
