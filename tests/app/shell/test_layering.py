"""app/'s modules import each other one way: the window builds its actions, exports and dialogs,
and none of them imports the window back (not even for a type, not even inside a function);
and app/ uses the engine through its public API, what `engine/__init__.py` exports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import app
from tests.source_imports import imported_modules

APP = Path(app.__file__).resolve().parent


def app_imports() -> dict[str, set[str]]:
    """Every module of app/ -> the app modules it imports anywhere in its source (functions and
    `if TYPE_CHECKING:` blocks included: an import moved there to dodge a cycle is still one)."""
    modules = {}
    for path in APP.rglob("*.py"):
        parts = path.relative_to(APP.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {name: {m for m in imported_modules(path) if m in modules and m != name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                found.append(stack[stack.index(other) :] + [other])
            elif other not in state:
                visit(other)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_no_two_app_modules_import_each_other():
    assert cycles(app_imports()) == []


def test_the_windows_parts_do_not_import_the_window():
    graph = app_imports()
    assert "app.shell.main_window" in graph
    users = sorted(name for name, imported in graph.items() if "app.shell.main_window" in imported)
    assert users == ["app.__main__"]  # only the entry point, which opens it
    assert {"app.shell.actions", "app.shell.file_dialogs", "app.bench.dialog"} <= graph["app.shell.main_window"]


def test_app_imports_the_engines_public_api_only():
    import engine

    public = set(engine.__all__)
    outside = {}
    for path in sorted(APP.rglob("*.py")):
        for module in imported_modules(path):
            head, _, rest = module.partition(".")
            # "engine.X" is `from engine import X`; "engine.figures.X" a name of a public module's
            if head == "engine" and rest and rest not in public and rest.split(".")[0] not in engine._MODULES:
                outside.setdefault(str(path.relative_to(APP.parent)), []).append(module)
    assert outside == {}


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_no_app_module_loads_torch_transformers_or_llama_cpp_when_imported():
    """They load in the engine process; the window's own process only reads its stream (a module that
    needs one imports it inside the function that runs the engine in process, e.g. the benchmark)."""
    modules = sorted(name for name in app_imports() if name != "app.__main__")
    heavy = {"torch", "transformers", "llama_cpp"}
    code = (
        f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy!r}))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        cwd=APP.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip().splitlines()[-1] == "[]"
