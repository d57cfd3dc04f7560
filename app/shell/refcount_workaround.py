"""Keep PySide6 6.12 on Python 3.11 from crashing the app after a few minutes.

PySide6 6.12.0 returns None, True and False from many calls without taking a
reference: `SignalInstance.emit()` and `disconnect()` (True), and `parent()`,
`findChild()`, `property()`, `QListWidget.currentItem()`... when they have
nothing to return (None). Each call then costs the interpreter one reference
to that singleton. On Python 3.12+ those objects are immortal and nothing
happens; on 3.11 their counts (a few thousand) run down to zero and the
process aborts with "Fatal Python error: none_dealloc" (or bool_dealloc),
wherever it happens to be: after ~600 emitted signals, i.e. a few seconds of
streaming tokens into pyqtgraph.

Fixing each call is not possible from here (pyqtgraph and pytest-qt make them
too), so we do what Python 3.12 does: give the three singletons a reference
count no leak can exhaust (2**40: a leak per microsecond would take twelve
days). They are static objects that are never freed anyway, so the only
visible effect is the number `sys.getrefcount` reports.
"""

from __future__ import annotations

import ctypes
import sys

_HEADROOM = 1 << 40


def apply() -> bool:
    """Give None, True and False a huge reference count on Python < 3.12; True if it did."""
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    for singleton in (None, True, False):
        # ob_refcnt is the first field of every CPython object (a Py_ssize_t).
        count = ctypes.c_ssize_t.from_address(id(singleton))
        if count.value < _HEADROOM:
            count.value += _HEADROOM
    return True
