"""The pair dialog's check, asked of an engine process: what the user sees when that process
cannot start, or stops during the check (an error finding in the dialog's words, the dialog
still working), and that the controller's check gives the engine's answer."""

from __future__ import annotations

import stat

import pytest
from PySide6.QtCore import QSettings

from app.pair.dialog import PairDialog
from app.runtime.engine_controller import EngineController
from engine import EngineConfig, EngineProcess, EngineUnavailable, preflight
from tests.app.conftest import STRICT_QT_LOG

CHECK_TIMEOUT_MS = 60_000  # the first check in a fresh engine process imports torch and llama.cpp there

pytestmark = STRICT_QT_LOG


def make_dialog(qtbot, tmp_path, check) -> PairDialog:
    dialog = PairDialog(settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat), check=check)
    qtbot.addWidget(dialog)
    return dialog


def run_check(qtbot, dialog) -> bool:
    with qtbot.waitSignal(dialog.sig_check_finished, timeout=CHECK_TIMEOUT_MS) as blocker:
        dialog.check()
    return blocker.args[0]


def the_error(dialog):
    errors = [f for f in dialog.findings_list() if f.severity == "error"]
    assert len(errors) == 1, dialog.findings_list()
    return errors[0]


def fake_python(tmp_path, body: str) -> str:
    """An executable that stands in for the engine process's interpreter."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def controller():
    made: list[EngineController] = []

    def make(process: EngineProcess) -> EngineController:
        made.append(EngineController(process=process))
        return made[-1]

    yield make
    for c in made:
        c.shutdown()
        c.process.stop()


def test_an_engine_process_that_cannot_start_is_a_finding_and_the_dialog_keeps_working(qtbot, tmp_path, controller):
    engine = controller(EngineProcess(python=str(tmp_path / "no-such-python")))
    dialog = make_dialog(qtbot, tmp_path, engine.preflight)

    assert not run_check(qtbot, dialog)
    error = the_error(dialog)
    assert error.title == "The engine could not check this pair"
    assert "Cannot start the engine process" in error.detail and error.detail.endswith("Press Check pair to try again.")
    assert "Traceback" not in dialog.findings.toPlainText() and not dialog.load_button.isEnabled()
    assert "The engine could not check this pair" in dialog.findings.toPlainText()


def test_an_engine_process_that_stops_during_the_check_is_a_finding_that_says_how(qtbot, tmp_path, controller):
    # It says where it listens (a port where nothing does), then exits: the check's request finds no one.
    python = fake_python(tmp_path, "echo SPECDECK_LISTENING 127.0.0.1:9\nexit 3")
    dialog = make_dialog(qtbot, tmp_path, controller(EngineProcess(python=python)).preflight)

    assert not run_check(qtbot, dialog)
    error = the_error(dialog)
    assert error.title == "The engine could not check this pair"
    assert "The engine process stopped: it exited with code 3." in error.detail


def test_after_a_failed_check_the_next_one_can_pass(qtbot, tmp_path):
    answers = [EngineUnavailable("Nothing answers at http://127.0.0.1:9 (connection refused)."), None]

    def check(config: EngineConfig):
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return preflight(config)

    dialog = make_dialog(qtbot, tmp_path, check)
    assert not run_check(qtbot, dialog)
    assert "connection refused" in the_error(dialog).detail
    assert run_check(qtbot, dialog) and dialog.load_button.isEnabled()


def test_a_bug_in_the_check_is_a_finding_not_a_traceback(qtbot, tmp_path):
    def check(config):
        raise KeyError("findings")

    dialog = make_dialog(qtbot, tmp_path, check)
    assert not run_check(qtbot, dialog)
    assert the_error(dialog).title == "The check failed" and "KeyError" in the_error(dialog).detail


def test_the_controllers_check_is_the_engine_processs_answer(qtbot, tmp_path, engine_process):
    engine = EngineController(process=engine_process)
    try:
        dialog = make_dialog(qtbot, tmp_path, engine.preflight)
        assert run_check(qtbot, dialog)
        assert engine_process.running  # started by the check when no window had started it
        assert [f.title for f in dialog.findings_list()] == [
            f.title for f in preflight(dialog.engine_config()).findings
        ]
    finally:
        engine.shutdown()  # a process given to the controller keeps running for the session's windows
