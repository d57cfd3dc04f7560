"""engine/ never imports Qt: the CLI, the tests and other front ends use it without a GUI."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import engine

GUI_MODULES = ("PySide6", "shiboken6", "pyqtgraph", "app")


def test_engine_imports_no_gui_module():
    modules = sorted(m.name for m in pkgutil.walk_packages(engine.__path__, "engine."))
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
