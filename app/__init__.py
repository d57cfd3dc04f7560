"""SpecDeck's desktop app (PySide6): chat with coloured tokens, live charts, side-by-side runs.

Start it with `specdeck` or `python -m app`. Everything that decodes lives in
`engine/` (no Qt); this package only shows it, on the GUI thread, and runs the
engine on worker threads (app/runtime/: worker.py and engine_controller.py).
"""

__version__ = "0.1.0"

from app.shell import refcount_workaround as _refcount_workaround  # noqa: E402 - before any signal is emitted

_refcount_workaround.apply()
