"""The QApplication: names, icon and display settings, set once before any window.

The organization and application names decide where `QSettings()` and
`QStandardPaths` store things; they are set here and nowhere else (tests set
their own, test-only names instead of calling `create_application`).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QSocketNotifier, Qt
from PySide6.QtGui import QGuiApplication, QIcon
from PySide6.QtWidgets import QApplication

import app

ORGANIZATION = "SpecDeck"
ORGANIZATION_DOMAIN = "specdeck.github.io"
APPLICATION = "SpecDeck"
DESKTOP_ID = "io.github.specdeck.SpecDeck"  # the .desktop file's name: Wayland matches windows to it


def resources_dir() -> Path:
    """resources/ beside the package (source checkout) or inside a PyInstaller bundle."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        return Path(bundle) / "resources"
    return Path(app.__file__).resolve().parent.parent / "resources"


def app_icon() -> QIcon:
    """The SpecDeck icon: the installed theme's if there is one, else the files in resources/."""
    icon = QIcon.fromTheme(DESKTOP_ID)
    if icon.isNull():
        icon = QIcon()
        for name in (f"{DESKTOP_ID}.svg", f"{DESKTOP_ID}.png"):
            path = resources_dir() / name
            if path.is_file():
                icon.addFile(str(path))
    return icon


def create_application(argv: list[str] | None = None) -> QApplication:
    """Make (or return) the QApplication, with names, icon and high-DPI settings."""
    existing = QApplication.instance()
    if existing is not None:
        return existing
    # Qt 6 always scales for high DPI; pass fractional factors (125 %, 150 %) through
    # instead of rounding them, so text and charts are neither blurry nor tiny.
    QGuiApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
    QCoreApplication.setOrganizationName(ORGANIZATION)
    QCoreApplication.setOrganizationDomain(ORGANIZATION_DOMAIN)
    QCoreApplication.setApplicationName(APPLICATION)
    QCoreApplication.setApplicationVersion(app.__version__)
    paint_on_the_gui_thread()
    application = QApplication(list(argv if argv is not None else sys.argv))
    QGuiApplication.setApplicationDisplayName(APPLICATION)
    QGuiApplication.setDesktopFileName(DESKTOP_ID)
    application.setWindowIcon(app_icon())
    _quit_on_interrupt(application)
    collect_garbage_on_the_gui_thread(application)
    return application


def paint_on_the_gui_thread() -> None:
    """Qt's raster painter does its fills on the GUI thread itself, not on its helper threads.

    Left to itself, Qt hands every fill of more than ~96 spans (a chart's background, an
    antialiased curve) to a pool of helper threads and waits for them: ~30 wake-ups of
    each helper per chart redraw, 700 a second while a reply streams. On a machine whose
    cores all decode, each wake-up takes a core from the engine for a moment, and
    llama.cpp's threads, which wait for each other at every operation, all lose that
    moment (docs/benchmarks.md, "The app against the CLI"). The fills of chart-sized
    shapes cost less than handing them over. Must run before the QApplication exists;
    a value the user set is kept.
    """
    os.environ.setdefault("QT_NO_GUI_THREADPOOL", "1")


def collect_garbage_on_the_gui_thread(application: QApplication):
    """Python's cycle collector runs on this thread only, from a timer (pyqtgraph's GarbageCollector).

    Left automatic, it runs in whichever thread crosses its threshold: an engine worker thread
    decoding JSON would then free a Qt object that sits in a reference cycle, and its destructor,
    taking Qt's locks off the GUI thread while that thread waits for the GIL, deadlocks the app.
    """
    from pyqtgraph.util.garbage_collector import GarbageCollector

    application.garbage_collector = GarbageCollector(interval=0.5)  # kept with the application
    return application.garbage_collector


def _quit_on_interrupt(application: QApplication) -> None:
    """Ctrl+C in the terminal closes the window properly (cancelling any generation).

    Python runs signal handlers only between bytecodes, and while Qt's event loop waits in
    C++ no bytecode runs. So the signal also wakes the loop: Python's C-level handler writes
    the signal's number to a socket (`signal.set_wakeup_fd`) that a QSocketNotifier watches,
    and the notifier's slot, Python code, lets the handler run. (A timer that woke the
    interpreter 4 times a second did the same, at the price of 4 wake-ups a second of the
    GUI thread all along, each taking a core from a local engine for a moment.)"""
    if os.name != "posix":
        return
    signal.signal(signal.SIGINT, lambda *_: application.closeAllWindows())
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, application)
    notifier.activated.connect(lambda *_: _drain(reader))
    application.interrupt_wakeup = (reader, writer, notifier)  # kept with the application


def _drain(reader: socket.socket) -> None:
    try:
        while reader.recv(64):
            pass
    except BlockingIOError:
        pass
