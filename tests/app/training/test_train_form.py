"""What the train dialog shows before a run: the bar counts the form's steps; the target's own replies are
a check box with a count of replies beside it."""

from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QCheckBox

from app.training.dialog import TrainDialog
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG


def make_dialog(qtbot) -> TrainDialog:
    dialog = TrainDialog(settings=QSettings(), target="default")
    qtbot.addWidget(dialog)
    dialog.form.out_dir.setText("/tmp/heads-out")
    return dialog


def test_the_bar_shows_the_forms_steps_from_the_start(qtbot):
    dialog = make_dialog(qtbot)
    assert dialog.progress.text() == "0 / 500 steps"  # it read "0 / 1 steps" while Steps said 500
    dialog.form.steps.setValue(1200)
    assert dialog.progress.text() == "0 / 1200 steps"


def test_the_targets_own_replies_are_a_check_box_with_a_count_of_replies(qtbot):
    dialog = make_dialog(qtbot)
    form = dialog.form
    assert isinstance(form.self_generate_on, QCheckBox) and not form.self_generate_on.isChecked()
    assert not form.self_generate.isEnabled() and form.options()["self_generate"] == 0
    form.self_generate_on.setChecked(True)
    form.self_generate.setValue(40)
    assert form.self_generate.isEnabled() and form.self_generate.text() == "40 replies"
    assert form.options()["self_generate"] == 40
    form.data_kind.setCurrentIndex(form.data_kind.findData("none"))  # the replies are all the data: required
    assert form.self_generate_on.isChecked() and not form.self_generate_on.isEnabled()
