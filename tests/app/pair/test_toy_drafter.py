"""A drafter from one new module shows in the pair dialog: its name, its option as a field, its check.

The module is the engine tests' toy "repeat" drafter (tests/engine/drafters/toy/toy_spec.py),
registered for the test by putting its folder on `engine.drafters.__path__`, the way a new
`engine/drafters/<name>_spec.py` file registers itself: no app file names it.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QSpinBox

from app.pair.dialog import PairDialog
from app.shell import settings as keys
from tests.app.conftest import STRICT_QT_LOG
from tests.app.pair.test_pair_dialog import run_check, severities
from tests.engine.drafters.build import toy_drafter

pytestmark = STRICT_QT_LOG


@pytest.fixture
def settings(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)


def test_a_drafter_from_one_new_module_is_listed_with_its_option_and_checked(qtbot, settings):
    with toy_drafter():
        dialog = PairDialog(settings=settings)
        qtbot.addWidget(dialog)
        combo = dialog.form.drafter

        index = combo.findData("repeat")
        assert index >= 0 and combo.itemText(index) == "Repeat the last token"
        assert combo.itemData(index, Qt.ToolTipRole) == "Proposes the last token again (a test drafter)."
        assert combo.itemData(combo.count() - 1) == "none"  # plain decoding stays last
        copies = dialog.form.field("repeat", "copies")
        assert isinstance(copies, QSpinBox) and (copies.minimum(), copies.maximum(), copies.value()) == (1, 8, 2)
        assert copies.toolTip() == "repeat: times the last token is proposed"
        assert not copies.isVisibleTo(dialog.form)  # shown while it is chosen

        combo.setCurrentIndex(index)
        copies.setValue(3)
        assert copies.isVisibleTo(dialog.form)
        assert dialog.form._models_form.labelForField(copies).text() == "Copies:"
        config = dialog.engine_config()
        assert (config.drafter, config.options.copies) == ("repeat", 3)

        assert run_check(qtbot, dialog) is True, dialog.findings_list()
        assert severities(dialog)["The repeat drafter needs nothing"] == "ok"
        assert "It proposes the last token 3 times" in dialog.findings.toPlainText()

        dialog.accept()  # saved as the one pair, and shown again by the next dialog
        assert keys.engine_config(settings) == config
        again = PairDialog(settings=settings)
        qtbot.addWidget(again)
        assert again.engine_config() == config and again.form.drafter.currentData() == "repeat"

    gone = PairDialog(settings=settings)  # its module gone: the saved pair falls back, and the dialog says so
    qtbot.addWidget(gone)
    assert gone.form.drafter.findData("repeat") == -1
    assert gone.engine_config() == keys.DEFAULT_ENGINE_CONFIG and "model pair" in gone.notice.text()
