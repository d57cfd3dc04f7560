"""A drafter from one new module shows in the pair dialog: its name, its option as a field, its check.

The module is written to a temporary folder put on `engine.drafters.__path__`, the
way a new `engine/drafters/<name>_spec.py` file registers itself; no app file names it.
"""

from __future__ import annotations

import sys

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QSpinBox

from app.pair.dialog import PairDialog
from app.shell import settings as keys
from tests.app.conftest import STRICT_QT_LOG
from tests.app.pair.test_pair_dialog import run_check, severities

pytestmark = STRICT_QT_LOG

ECHO_SPEC = '''
"""A toy drafter: it proposes the last token again, `repeats` times."""

from dataclasses import dataclass

from engine import Finding
from engine.drafters.registry import DrafterSpec, setting


@dataclass(frozen=True)
class EchoOptions:
    repeats: int = setting(2, label="Repeats", minimum=1, maximum=8,
                           help="echo: how many copies of the last token are proposed")


def make(target, options, load):
    raise NotImplementedError("the dialog never loads it")


def preflight(ctx, options):
    return [Finding("ok", "Echo drafts the last token again", f"{options.repeats} copies of it each step.")]


DRAFTER = DrafterSpec(name="echo", label="Echo (a toy)", summary="Proposes the last token again.",
                      options=EchoOptions, make=make, preflight=preflight)
'''


@pytest.fixture
def echo_drafter(tmp_path, monkeypatch):
    import engine.drafters as package
    from engine.drafters import registry

    folder = tmp_path / "more_drafters"
    folder.mkdir()
    (folder / "echo_spec.py").write_text(ECHO_SPEC, encoding="utf-8")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    registry.rescan()
    yield
    monkeypatch.undo()
    sys.modules.pop("engine.drafters.echo_spec", None)
    registry.rescan()


@pytest.fixture
def settings(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)


def test_a_drafter_from_one_new_module_is_listed_with_its_option_and_checked(qtbot, echo_drafter, settings):
    dialog = PairDialog(settings=settings)
    qtbot.addWidget(dialog)
    combo = dialog.form.drafter

    index = combo.findData("echo")
    assert index >= 0 and combo.itemText(index) == "Echo (a toy)"
    assert combo.itemData(index, Qt.ToolTipRole) == "Proposes the last token again."
    assert combo.itemData(combo.count() - 1) == "none"  # plain decoding stays last
    repeats = dialog.form.field("echo", "repeats")
    assert isinstance(repeats, QSpinBox) and (repeats.minimum(), repeats.maximum(), repeats.value()) == (1, 8, 2)
    assert repeats.toolTip() == "echo: how many copies of the last token are proposed"
    assert not repeats.isVisibleTo(dialog.form)  # shown while it is chosen

    combo.setCurrentIndex(index)
    repeats.setValue(3)
    assert repeats.isVisibleTo(dialog.form)
    assert dialog.form._models_form.labelForField(repeats).text() == "Repeats:"
    config = dialog.engine_config()
    assert (config.drafter, config.options.repeats) == ("echo", 3)

    assert run_check(qtbot, dialog) is True, dialog.findings_list()
    assert severities(dialog)["Echo drafts the last token again"] == "ok"
    assert "3 copies of it each step." in dialog.findings.toPlainText()

    dialog.accept()  # saved as the one pair, and shown again by the next dialog
    assert keys.engine_config(settings) == config
    again = PairDialog(settings=settings)
    qtbot.addWidget(again)
    assert again.engine_config() == config and again.form.drafter.currentData() == "echo"


def test_the_toy_drafter_is_gone_once_its_module_is(qtbot, settings):
    dialog = PairDialog(settings=settings)
    qtbot.addWidget(dialog)
    assert dialog.form.drafter.findData("echo") == -1  # the fixture took it away again
