"""engine/ never imports Qt (the CLI, the tests and other front ends use it without a GUI), and no drafter
imports a concrete backend (app/ using only the public API is tests/app/shell/test_layering.py)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import engine
from tests.source_imports import imported_modules

GUI_MODULES = ("PySide6", "shiboken6", "pyqtgraph", "app")


def test_engine_imports_no_gui_module():
    # Every module but a `__main__` (importing it runs the program).
    modules = sorted(
        m.name for m in pkgutil.walk_packages(engine.__path__, "engine.") if not m.name.endswith("__main__")
    )
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {GUI_MODULES!r})\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert {"engine.backends.llama_cpp", "engine.drafters.ngram"} <= set(modules)  # subpackages too
    assert done.stdout.strip() == "", f"engine pulled in GUI modules: {done.stdout.strip()}"


# What a drafter may use of the backends: the interface and the capability protocols (and the
# plain KV cache of a draft head), never a concrete backend. A drafter that needed llama.cpp's or
# the PyTorch backend's own code would work on that backend only, however its spec declares `needs`.
CONCRETE_BACKENDS = ("engine.backends.llama_cpp", "engine.backends.hf")


def test_no_drafter_imports_a_concrete_backend():
    from pathlib import Path

    import engine.drafters

    folder = Path(engine.drafters.__file__).parent
    offenders = {}
    for path in sorted(folder.glob("*.py")):
        bad = sorted(m for m in imported_modules(path) if m.startswith(CONCRETE_BACKENDS))
        if bad:
            offenders[path.name] = bad
    assert len(list(folder.glob("*_spec.py"))) >= 7  # the scan sees the drafters and their specs
    assert offenders == {}
