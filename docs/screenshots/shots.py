"""What the screenshot scripts share: an offscreen application with throwaway settings and data,
and ways to let it run until something happens.

Import this before anything from PySide6 or app: it sets the platform and the
data folder, and `app` applies the PySide6 refcount workaround on import.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
DATA = os.environ["SPECDECK_DATA_DIR"] = tempfile.mkdtemp(prefix="specdeck-shots-")

from PySide6.QtCore import QCoreApplication, QEventLoop, QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

import app  # noqa: E402,F401 - applies the PySide6 refcount workaround first


def application() -> QApplication:
    """The QApplication, with the app's icon and settings in a temporary folder (never the user's)."""
    QCoreApplication.setOrganizationName("SpecDeckScreenshots")
    QCoreApplication.setApplicationName("SpecDeckScreenshots")
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, tempfile.mkdtemp())
    instance = QApplication(sys.argv[:1])
    from app.shell.application import app_icon

    instance.setWindowIcon(app_icon())
    return instance


def wait(instance: QApplication, condition, timeout: float = 1800.0) -> None:
    """Process events until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not get there in time")
        instance.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.01)


def settle(instance: QApplication, seconds: float = 0.5) -> None:
    """Let the charts' redraw timers and the layouts catch up."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        instance.processEvents()
        time.sleep(0.02)
