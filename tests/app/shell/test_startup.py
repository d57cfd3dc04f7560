"""The app always starts: unreadable settings, an unusable data folder; the banner says what was reset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from app.shell import settings as keys
from engine import EngineConfig
from tests.app.conftest import QT_NOISE, STRICT_QT_LOG, send_and_wait
from tests.disks import make_read_only, small_disk

pytestmark = STRICT_QT_LOG

# What a hand edit, a disk error or another program can leave in the settings file.
GARBAGE_INI = r"""[window]
geometry=42
state=@Rect(0 0 10 10)
tab=abc

[chat]
colour_tokens=maybe
conversation=../../etc/passwd

[engine]
config="{\"target\": \"default\", \"n_ctx\": \"big\"}"
sampling="{\"seed\": \"x\"}"
"""


def write_settings_file(text: str) -> None:
    path = Path(QSettings().fileName())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    QSettings().sync()  # drop what Qt cached of the file before it changed


def test_garbage_settings_fall_back_to_defaults_and_the_banner_names_them(make_window, monkeypatch):
    write_settings_file(GARBAGE_INI)

    window = make_window(load=False)
    loads = []
    monkeypatch.setattr(window.controller, "load", lambda config, choice=None: loads.append(config))
    window.start()

    assert window.isVisible()
    text = window.banner.text()
    for name in (
        "window size and position",
        "panel layout",
        "open tab",
        "token colours",
        "open conversation",
        "model pair",
        "sampling settings",
    ):
        assert name in text, (name, text)
    assert window.tabs.currentWidget() is window.chat_view
    assert window.actions.colour_tokens.isChecked()
    assert window.chats.conversation is None and window.windowTitle() == "New chat"
    # The built-in pair loads, not a config that fails later with "Unexpected error ... Please report it".
    assert loads == [keys.DEFAULT_ENGINE_CONFIG]
    assert keys.sampling_config() == keys.DEFAULT_SAMPLING


def test_settings_are_reset_once_the_next_start_is_quiet(make_window):
    write_settings_file(GARBAGE_INI)
    make_window(load=False).close()

    second = make_window(load=False)

    assert second.banner.text() == ""


def test_a_wrong_typed_model_pair_is_not_an_unexpected_error():
    """The saved pair has a string where a number belongs: the built-in pair loads instead."""
    keys.set_engine_config(EngineConfig(measure_costs=False, n_ctx="big"))  # what a hand edit leaves

    resets = []
    assert keys.engine_config(resets=resets) == keys.DEFAULT_ENGINE_CONFIG
    assert resets == [keys.ENGINE_CONFIG]


@pytest.mark.parametrize("value", ["@ByteArray(\\x1\\x2junk)", "@Variant(\\0\\0\\0\\x7f\\0\\0\\0\\x1bjunk)"])
@pytest.mark.qt_log_ignore(QT_NOISE, r"QVariant::load: unknown user type")  # Qt reading the junk: not ours
def test_unreadable_window_geometry_bytes_are_reset(make_window, value):
    write_settings_file(f"[window]\ngeometry={value}\nstate={value}\n")

    window = make_window(load=False)

    assert window.isVisible() and window.width() > 200
    assert "window size and position" in window.banner.text()


def test_a_saved_conversation_that_is_a_path_opens_an_empty_chat(make_window, data_dir):
    settings = QSettings()
    settings.setValue(keys.CURRENT_CONVERSATION, str(data_dir.parent / "elsewhere" / "conversations.db"))
    settings.sync()

    window = make_window(load=False)

    assert window.chats.conversation is None
    assert "open conversation" in window.banner.text()


def test_an_unknown_but_valid_conversation_id_opens_quietly(make_window):
    settings = QSettings()
    settings.setValue(keys.CURRENT_CONVERSATION, "0" * 32)  # deleted since: nothing to report
    settings.sync()

    window = make_window(load=False)

    assert window.chats.conversation is None and window.banner.text() == ""


def test_a_data_folder_on_a_read_only_disk_starts_with_unsaved_chats(qtbot, make_window, tmp_path, monkeypatch):
    with small_disk(tmp_path / "disk") as disk:
        make_read_only(disk)
        monkeypatch.setenv("SPECDECK_DATA_DIR", str(disk / "conversations"))
        window = make_window()

    assert window.banner.kind == "error"
    assert "kept only until SpecDeck closes" in window.banner.text() and "read-only" in window.banner.text()
    reply = send_and_wait(qtbot, window, "Hello?")
    assert reply.text and window.conversation_panel.titles() == ["Hello?"]  # chats work, in memory
    assert "read-only" in window.banner.text()  # the load did not hide what start-up found


def test_the_store_notices_are_shown_at_start(make_window, data_dir, monkeypatch):
    journal = data_dir / ("a" * 32 + ".jsonl")
    data_dir.mkdir(parents=True)
    head = {"type": "conversation", "version": 1, "id": "a" * 32, "title": "Old chat", "created": 1.0}
    journal.write_text(json.dumps(head) + "\n" + json.dumps({"type": "user", "content": "hi"}) + "\n{torn\n")

    window = make_window(load=False)

    assert window.banner.kind == "info" and "Imported 1" in window.banner.text()
    window.conversation_panel.sig_selected.emit("a" * 32)
    assert "1 damaged record" in window.banner.text()
    window.close()

    again = make_window(load=False)  # reopens it: says so again, and the load does not hide it
    monkeypatch.setattr(again.controller, "load", lambda config, choice=None: None)
    again.start()
    assert again.chats.conversation.title == "Old chat" and "1 damaged record" in again.banner.text()


@pytest.mark.qt_log_ignore(QT_NOISE, r"QVariant::load: unknown user type")
def test_the_model_pair_dialog_opens_whatever_its_saved_geometry_holds(make_window):
    write_settings_file("[pair_dialog]\ngeometry=42\nbrowse_dir=a, b\nk=@Rect(0 0 1 1)\n")
    window = make_window(load=False)

    window.choose_models()

    assert window.pair_dialog is not None and window.pair_dialog.isVisible()
    assert window.pair_dialog.width() >= 400


def test_an_unreadable_export_folder_suggests_the_documents_folder(make_window, monkeypatch):
    from PySide6.QtCore import QStandardPaths
    from PySide6.QtWidgets import QFileDialog

    write_settings_file("[files]\nexport_folder=a, b\n")  # a list, not a folder
    window = make_window(load=False)
    suggested = []
    monkeypatch.setattr(
        QFileDialog, "getSaveFileName", lambda parent, caption, path, filter: suggested.append(path) or ("", "")
    )

    window.actions.export_csv.trigger()

    documents = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    assert len(suggested) == 1 and suggested[0].startswith(documents), suggested
