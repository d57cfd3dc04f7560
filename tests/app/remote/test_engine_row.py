"""The pair dialog's Engine row: where the pair runs is saved and restored, Test connection asks a real
server on a worker thread, and Load waits for a test of exactly the choice shown."""

from __future__ import annotations

import time

from PySide6.QtWidgets import QApplication, QLineEdit

from app.pair.dialog import SERVER_PAIR, PairDialog
from app.shell import settings as keys
from app.shell.settings import LOCAL, EngineChoice
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG
TEST_TIMEOUT_MS = 30_000


def choose(dialog, choice: EngineChoice) -> None:
    """Fill the row in as a user would: the kind, then the fields."""
    row = dialog.engine_row
    row.kind.setCurrentIndex(row.kind.findData(choice.kind))
    for field, text in ((row.url, choice.url), (row.api_key, choice.api_key), (row.vanilla_url, choice.vanilla_url)):
        field.setText(text)


def run_test(qtbot, dialog) -> bool:
    with qtbot.waitSignal(dialog.engine_row.sig_tested, timeout=TEST_TIMEOUT_MS) as tested:
        dialog.engine_row.test_button.click()
    return tested.args[0]


def test_settings_without_an_engine_choice_read_as_local_and_a_damaged_one_says_so(settings):
    assert keys.engine_choice(settings) == LOCAL
    settings.setValue(keys.ENGINE_CHOICE, '{"kind": "quantum-server", "url": 7}')
    resets: list[str] = []
    assert keys.engine_choice(settings, resets) == LOCAL and resets == [keys.ENGINE_CHOICE]
    assert "engine choice" in keys.describe_resets(resets)


def test_local_is_the_default_and_shows_no_server_fields(dialog):
    row = dialog.engine_row
    assert dialog.engine_choice() == LOCAL and row.kind.currentText() == "Local"
    assert [row.kind.itemText(i) for i in range(row.kind.count())] == [
        "Local",
        "SpecDeck server",
        "llama-server",
        "vLLM",
        "SGLang",
    ]
    assert not row.url.isVisibleTo(dialog) and not row.test_button.isVisibleTo(dialog)
    assert dialog.form.models_box.isEnabled()


def test_a_specdeck_server_answers_the_test_and_the_choice_is_saved_and_restored(
    qtbot, dialog, settings, specdeck_server
):
    choice = EngineChoice("specdeck", specdeck_server.url, specdeck_server.key)
    choose(dialog, choice)
    assert not dialog.load_button.isEnabled()  # not tested yet
    assert dialog.engine_row.api_key.echoMode() == QLineEdit.EchoMode.Password
    assert not dialog.engine_row.vanilla_url.isVisibleTo(dialog)  # a SpecDeck server compares on its own

    started = time.monotonic()
    dialog.engine_row.test_button.click()
    assert time.monotonic() - started < 0.5  # the window never waits for the network
    qtbot.waitUntil(dialog.load_button.isEnabled, timeout=TEST_TIMEOUT_MS)
    assert f"SpecDeck server at {specdeck_server.url}" in dialog.engine_row.status.text()
    assert dialog.form.models_box.isEnabled()  # the pair below is loaded on the server

    dialog.accept()
    assert keys.engine_choice(settings) == choice
    again = PairDialog(settings=settings)
    qtbot.addWidget(again)
    assert again.engine_choice() == choice
    assert not again.load_button.isEnabled()  # a test speaks for the dialog it ran in


def test_where_nothing_listens_the_test_shows_why_and_load_stays_disabled(qtbot, dialog, nowhere):
    choose(dialog, EngineChoice("specdeck", nowhere))
    assert not run_test(qtbot, dialog)
    status = dialog.engine_row.status.text()
    assert f"Nothing answers at {nowhere}" in status and "start the server" in status
    assert not dialog.load_button.isEnabled()
    dialog.accept()  # Enter with Load disabled tests again, and loads nothing
    assert dialog.result() == 0 and keys.engine_choice(dialog.settings) == LOCAL


def test_a_wrong_key_is_refused_in_the_servers_words(qtbot, dialog, specdeck_server):
    choose(dialog, EngineChoice("specdeck", specdeck_server.url, "not-the-key"))
    assert not run_test(qtbot, dialog)
    assert "The API key is wrong" in dialog.engine_row.status.text()
    assert not dialog.load_button.isEnabled()


def test_an_edit_after_a_test_voids_it(qtbot, dialog, specdeck_server):
    choose(dialog, EngineChoice("specdeck", specdeck_server.url, specdeck_server.key))
    assert run_test(qtbot, dialog) and dialog.load_button.isEnabled()

    dialog.engine_row.api_key.setText("another")
    assert not dialog.load_button.isEnabled()
    assert "Changed since the last test" in dialog.engine_row.status.text()
    dialog.engine_row.api_key.setText(specdeck_server.key)  # back to what was tested
    assert dialog.load_button.isEnabled() and "SpecDeck server at" in dialog.engine_row.status.text()


def test_a_server_with_its_own_model_disables_the_pair_and_keeps_the_sampling(qtbot, dialog, nowhere):
    choose(dialog, EngineChoice("llama-server", nowhere, "", "http://127.0.0.1:9"))
    assert not dialog.form.models_box.isEnabled() and not dialog.form.hardware_box.isEnabled()
    assert not dialog.form.length_box.isEnabled() and dialog.form.temperature.isEnabled()
    assert dialog.server_pair.isVisibleTo(dialog) and dialog.server_pair.text() == SERVER_PAIR
    assert not dialog.check_button.isEnabled() and dialog.engine_row.vanilla_url.isVisibleTo(dialog)
    assert dialog.engine_choice().vanilla_url == "http://127.0.0.1:9"

    assert not run_test(qtbot, dialog)
    assert "Nothing answers at" in dialog.engine_row.status.text() and not dialog.load_button.isEnabled()

    dialog.engine_row.kind.setCurrentIndex(0)  # Local: the pair is used again
    assert dialog.form.models_box.isEnabled() and not dialog.server_pair.isVisibleTo(dialog)
    assert dialog.engine_choice() == LOCAL
    QApplication.processEvents()
