"""Help > What the numbers mean in the real window works the formula through with the user's last chat reply."""

from __future__ import annotations

from app.shell.numbers_help import NO_RUN, NumbersHelpDialog
from tests.app.conftest import STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG


def test_the_page_explains_the_windows_last_reply(qtbot, make_window):
    window = make_window()
    result = send_and_wait(qtbot, window, "Copy exactly: one two three, one two three, one two three.")
    assert result is not None and result.stats.steps > 0

    window.actions.numbers_help.trigger()

    dialog = window.findChild(NumbersHelpDialog)
    assert dialog is not None and dialog.isVisible()
    assert dialog.stats == result.stats and NO_RUN not in dialog.text()
