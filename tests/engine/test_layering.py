"""engine/'s modules import each other one way, down the layers docs/architecture.md names ("The
layers of the engine"): no two modules import each other, not even inside a function, and no module
imports one of a layer above its own.

Imports are read from the source (`imports`): at the top of a module and inside functions alike, since
an import moved into a function to dodge a cycle still makes one when it runs. Only `if TYPE_CHECKING:`
blocks do not count: they never run. A module named as a string and imported when used (a drafter's
spec naming its algorithm, `engine/__init__.py`'s public names) is late binding by design, not an import.
"""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

import engine

ENGINE = Path(engine.__file__).resolve().parent

# The layers, bottom first: a module may import modules of its own layer and of the layers below.
LAYERS = (
    "foundation",  # errors, lazy imports, the terminal and Ctrl+C: what everything may use
    "contracts",  # what the parts agree on: Backend and Drafter, capabilities, a run's records, text
    "core",  # the algorithm: the step, feeds, verification, sampling, draft length; the figures
    "model files",  # finding models and reading their files; trained heads and their files
    "configuration",  # EngineConfig, the drafter registry and specs, preflight, load options: no model loaded
    "backends",  # the forwards (llama.cpp; PyTorch: transformers' and the native one), loading a model
    "drafters",  # the drafting algorithms
    "engine",  # Engine: load, stream, generate, compare
    "jobs",  # benchmark and auto-tune, training, other servers
    "service",  # the engine as a server, its client, the app's engine process
    "command line",  # specdeck-cli
    "public API",  # engine/__init__.py: every public name, imported on first use
)

# Module -> layer: the first pattern that names a module places it ("engine.x" names engine/x.py and all
# under engine/x/; a pattern may hold a * ). Exceptions first, then whole packages.
PLACES = (
    # foundation
    ("engine.errors", "foundation"),
    ("engine.lazy", "foundation"),
    ("engine.cli.interrupt", "foundation"),  # engine/__init__.py installs its Ctrl+C handler first of all
    ("engine.cli.terminal", "foundation"),
    # contracts
    ("engine.backends.base", "contracts"),
    ("engine.backends.capabilities", "contracts"),
    ("engine.backends.slots", "contracts"),  # BatchCall: what the batched step asks of a backend
    ("engine.backends.info", "contracts"),
    ("engine.backends.gpu_layers", "contracts"),
    ("engine.backends.hf.device", "contracts"),
    ("engine.backends.hf.architectures", "contracts"),
    ("engine.drafters.base", "contracts"),
    ("engine.drafters.options", "contracts"),
    ("engine.drafters.spec", "contracts"),
    ("engine.core.events", "contracts"),
    ("engine.core.costs", "contracts"),
    ("engine.core.text", "contracts"),
    ("engine.core.chat_render", "contracts"),
    ("engine.core.tree", "contracts"),
    ("engine.core.sampling_config", "contracts"),
    ("engine.heads.kinds", "contracts"),
    ("engine.service.batches", "contracts"),  # how often a stream's steps go out: the server's and foreign servers'
    # core
    ("engine.core", "core"),
    ("engine.batching", "engine"),
    ("engine.figures", "core"),
    # configuration (before the packages they sit in)
    ("engine.config", "configuration"),
    ("engine.preflight", "configuration"),
    ("engine.drafters.registry", "configuration"),
    ("engine.drafters.*_spec", "configuration"),
    ("engine.drafters.heads_loading", "configuration"),
    ("engine.models.load_options", "configuration"),
    ("engine.models.load_checks", "configuration"),
    ("engine.models.discovery*", "configuration"),  # drafter discovery asks the registry what each drafter needs
    ("engine.models.loading", "backends"),
    # model files
    ("engine.models", "model files"),
    ("engine.heads", "model files"),
    # the rest by package
    ("engine.backends", "backends"),
    ("engine.drafters", "drafters"),
    ("engine.api", "engine"),
    ("engine.bench", "jobs"),
    ("engine.training", "jobs"),
    ("engine.remote", "jobs"),
    ("engine.service", "service"),
    ("engine.cli", "command line"),
    ("engine", "public API"),
)

# Cycles not broken yet, each as the modules of one strongly connected component. Every cycle found
# must be listed here and every one listed must still be found exactly: break one, then delete its line.
# (Issue 37, part 5: they cross modules other work was changing at the time; the lead breaks them.)
KNOWN_CYCLES: tuple[frozenset[str], ...] = ()


def module_names() -> dict[str, Path]:
    modules = {}
    for path in ENGINE.rglob("*.py"):
        parts = path.relative_to(ENGINE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(name: str, path: Path, modules) -> set[str]:
    """The engine modules the module `name` imports anywhere but in `if TYPE_CHECKING:` blocks.
    `from a import b` imports the module a.b where there is one, else a (b is a name in it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {module for module in found if module in modules and module != name}


def engine_imports() -> dict[str, set[str]]:
    """Every module of engine/ -> the engine modules it imports."""
    modules = module_names()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The groups of two or more modules that import each other, directly or around a cycle (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = set()
            while not group or module not in group:
                group.add(stack.pop())
            on_stack.difference_update(group)
            if len(group) > 1:
                groups.append(frozenset(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(groups, key=sorted)


def cycle_through(graph: dict[str, set[str]], group: frozenset[str]) -> list[str]:
    """One cycle through a group's first module, for the message: a -> b -> a."""
    start = min(group)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for other in sorted(graph[path[-1]] & group):
            if other == start:
                return [*path, start]
            if other not in seen:
                seen.add(other)
                paths.append([*path, other])
    return []


def place(module: str) -> tuple[str, str]:
    """The first (pattern, layer) of PLACES that names `module`; a package whose `__init__.py` holds
    nothing but a docstring is a folder, at the bottom (importing it runs nothing)."""
    if _folder(module):
        return "(a folder)", LAYERS[0]
    for pattern, layer in PLACES:
        if module == pattern or module.startswith(pattern + ".") or ("*" in pattern and fnmatchcase(module, pattern)):
            return pattern, layer
    raise AssertionError(f"{module} is in no layer: add it to PLACES (tests/engine/test_layering.py)")


def _folder(module: str) -> bool:
    path = ENGINE.parent.joinpath(*module.split("."), "__init__.py")
    if not path.is_file():
        return False
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def layer_of(module: str) -> str:
    return place(module)[1]


def test_no_engine_modules_import_each_other():
    graph = engine_imports()
    found = strongly_connected(graph)
    new = [
        f"{' -> '.join(cycle_through(graph, group))} (of {len(group)}: {', '.join(sorted(group))})"
        for group in found
        if group not in KNOWN_CYCLES
    ]
    gone = [sorted(group) for group in KNOWN_CYCLES if group not in found]
    assert new == [], "import cycles (counting imports inside functions):\n" + "\n".join(new)
    assert gone == [], "listed in KNOWN_CYCLES but no longer a cycle (delete them there):\n" + "\n".join(map(str, gone))


def test_every_module_imports_its_own_layer_or_below():
    graph = engine_imports()
    rank = {layer: n for n, layer in enumerate(LAYERS)}
    allowed = {(a, b) for group in KNOWN_CYCLES for a in group for b in group}
    upward = sorted(
        f"{module} ({layer_of(module)}) imports {other} ({layer_of(other)})"
        for module, imported in graph.items()
        for other in imported
        if rank[layer_of(other)] > rank[layer_of(module)] and (module, other) not in allowed
    )
    assert upward == []


def test_every_place_places_a_module():
    """A pattern no module reaches is left from a module that moved or went: PLACES says what is."""
    assert {layer for _, layer in PLACES} == set(LAYERS)
    used = {place(module)[0] for module in module_names()}
    assert [pattern for pattern, _ in PLACES if pattern not in used] == []


def names_given_to_named() -> list[tuple[str, str]]:
    """(module, "package.module:name") for every `named("...")` call in engine/ (engine/lazy.py)."""
    found = []
    for module, path in module_names().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "named":
                assert node.args and isinstance(node.args[0], ast.Constant), f"{module}: named() takes a literal"
                found.append((module, node.args[0].value))
    return found


def test_what_a_module_names_above_itself_is_there():
    """A module below the code it names (`engine.lazy.named`: a drafter's spec naming its algorithm)
    names something that exists, in a module above its own layer or in it (else it imports it)."""
    modules, rank = module_names(), {layer: n for n, layer in enumerate(LAYERS)}
    wrong = []
    for module, path in names_given_to_named():
        target, _, name = path.partition(":")
        if target not in modules:
            wrong.append(f"{module}: no module {target}")
            continue
        tree = ast.parse(modules[target].read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))} | {
            t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
        }
        if name not in defined:
            wrong.append(f"{module}: {target} defines no {name}")
        if rank[layer_of(target)] < rank[layer_of(module)]:
            wrong.append(f"{module}: {target} is below it, import it")
    assert wrong == []


def test_the_cycle_finder_finds_cycles_and_what_is_read_as_an_import(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    groups = strongly_connected(graph)
    assert groups == [frozenset("abc")]
    assert cycle_through(graph, groups[0]) == ["a", "b", "c", "a"]

    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import p.top\n"
        "from p import sub, name\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    import p.annotations_only\n"
        "def f():\n    from p.inside import g\n",
        encoding="utf-8",
    )
    modules = {name: None for name in ("p", "p.m", "p.top", "p.sub", "p.sibling", "p.annotations_only", "p.inside")}
    assert imports("p.m", source, modules) == {"p", "p.top", "p.sub", "p.sibling", "p.inside"}
