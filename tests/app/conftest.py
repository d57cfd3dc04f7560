"""Fixtures for the desktop app's tests.

Nothing here may touch a user's settings or conversations (qutebrowser's rule):
the application gets test-only names, QSettings writes INI files into a
temporary folder, QStandardPaths is in test mode, and every test gets its own
conversation folder through SPECDECK_DATA_DIR.

Real models: the embedded SmolLM2 on llama.cpp loads in about a second without
the cost measurement, so each window loads its own; replies are kept short so
the whole suite stays in minutes on two busy cores. The engine runs in an
engine process, as in the app, but one process serves every window of the
session (starting one costs seconds: Python, torch, the server): each window
finds it with nothing loaded and loads its pair there. A test that kills the
engine, or needs its own, asks make_window for one (`own_engine=True`).
"""

from __future__ import annotations

import gc

import pytest
from PySide6.QtCore import QCoreApplication, QSettings, QStandardPaths

import app  # noqa: F401 - applies the PySide6 6.12 / Python 3.11 refcount workaround before any signal
from engine import EngineConfig, EngineProcess, SamplingConfig

TEST_ORGANIZATION = "SpecDeckTests"
TEST_APPLICATION = "specdeck-app-tests"

# k fixed at 4: automatic k decodes plainly on a small CPU model (verifying n tokens
# costs about n decodes there), and these tests need drafted tokens to colour.
FAST_CONFIG = EngineConfig(measure_costs=False, k=4)
SHORT_REPLY = SamplingConfig(max_tokens=24)
LOAD_TIMEOUT_MS = 120_000  # a second when idle; much more on a loaded CI machine
REPLY_TIMEOUT_MS = 180_000

# The offscreen platform says this about docks, dialogs and tooltips; it is not our warning.
QT_NOISE = r"This plugin does not support (propagateSizeHints|raise)\(\)"
STRICT_QT_LOG = [pytest.mark.qt_log_level_fail("WARNING"), pytest.mark.qt_log_ignore(QT_NOISE)]


@pytest.fixture(scope="session", autouse=True)
def isolated_settings(qapp, tmp_path_factory):
    QStandardPaths.setTestModeEnabled(True)
    QCoreApplication.setOrganizationName(TEST_ORGANIZATION)
    QCoreApplication.setOrganizationDomain("tests.specdeck.invalid")
    QCoreApplication.setApplicationName(TEST_APPLICATION)
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    folder = tmp_path_factory.mktemp("qsettings")
    for scope in (QSettings.Scope.UserScope, QSettings.Scope.SystemScope):
        QSettings.setPath(QSettings.Format.IniFormat, scope, str(folder))
    yield folder


@pytest.fixture(autouse=True)
def fresh_settings_and_data(isolated_settings, tmp_path, monkeypatch):
    """Each test starts with no settings and an empty conversation folder."""
    # Other tests in this folder may set their own application name; ours is put back.
    QCoreApplication.setOrganizationName(TEST_ORGANIZATION)
    QCoreApplication.setApplicationName(TEST_APPLICATION)
    QSettings().clear()
    QSettings().sync()
    data = tmp_path / "data"
    monkeypatch.setenv("SPECDECK_DATA_DIR", str(data))
    yield data
    QSettings().clear()


@pytest.fixture(autouse=True)
def garbage_collected_on_the_gui_thread(qapp):
    """As in the app (application.py): cycles are collected on this thread, never in a worker,
    where freeing a Qt object deadlocks against the GUI thread. The rest of the suite keeps gc on."""
    from app.shell.application import collect_garbage_on_the_gui_thread

    collector = collect_garbage_on_the_gui_thread(qapp)
    yield
    collector.timer.stop()
    gc.collect()
    gc.enable()


@pytest.fixture
def data_dir(fresh_settings_and_data):
    return fresh_settings_and_data


@pytest.fixture(scope="session")
def engine_process():
    """The engine process the session's windows share (started by the first load)."""
    process = EngineProcess()
    yield process
    process.stop()


def unloaded(process: EngineProcess) -> EngineProcess:
    """`process` holding no models, as a freshly started one: a window's load then really loads."""
    if process.running:
        process.client.unload()
    return process


@pytest.fixture
def make_window(qtbot, engine_process):
    """make_window(config=FAST_CONFIG, sampling=SHORT_REPLY, load=True, own_engine=False) -> a shown
    MainWindow on the session's engine process, or (own_engine) on one it starts and stops itself."""
    from app.shell.main_window import MainWindow

    def make(
        config: EngineConfig | None = FAST_CONFIG,
        sampling: SamplingConfig = SHORT_REPLY,
        load: bool = True,
        own_engine: bool = False,
    ):
        window = MainWindow(engine_process=None if own_engine else unloaded(engine_process))
        qtbot.addWidget(window)  # closed at teardown: closeEvent cancels and joins the worker
        window.sampling = sampling
        window.show()
        if load:
            with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
                window.start(config)
        return window

    return make


def send_and_wait(qtbot, window, text: str, timeout: int = REPLY_TIMEOUT_MS):
    """Send a chat message and wait until its reply has ended; returns the run's result."""
    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=timeout) as blocker:
        window.send_message(text)
    return blocker.args[1]


@pytest.fixture
def settings(tmp_path) -> QSettings:
    """A settings file of the test's own, for the dialogs that take one."""
    return QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat)


@pytest.fixture
def dialog(qtbot, settings):
    """The pair dialog on the test's own settings (a test module may define its own `dialog`)."""
    from app.pair.dialog import PairDialog

    d = PairDialog(settings=settings)
    qtbot.addWidget(d)
    return d
