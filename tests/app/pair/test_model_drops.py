"""Models dropped from the file manager, and models from Ollama and llama.cpp's cache in the pair dialog's lists.

Drops are real QDropEvents carrying file URLs, sent to the widget a user would
drop on; the Ollama store and the llama.cpp cache are written in a temporary
folder by tests/factories/model_stores.py.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import QMimeData, QPointF, QSettings, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app.pair.dialog import PairDialog
from tests.app.conftest import STRICT_QT_LOG
from tests.factories.model_stores import add_llama_cache_file, add_ollama_model, write_quant_gguf

pytestmark = STRICT_QT_LOG


@pytest.fixture(autouse=True)
def model_stores(tmp_path, monkeypatch):
    """An Ollama store and a llama.cpp cache with one model each; nothing of the user's is listed."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("SPECDECK_MODEL_DIRS", raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama.cpp"))
    add_ollama_model(tmp_path / "ollama", "tiny:1b", write_quant_gguf(tmp_path / "a.gguf", "Q4_K_M"))
    add_llama_cache_file(tmp_path / "llama.cpp", "org", "Small-GGUF", write_quant_gguf(tmp_path / "s.gguf", "Q8_0"))


@pytest.fixture
def dialog(qtbot, tmp_path):
    d = PairDialog(settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    qtbot.addWidget(d)
    return d


def drag(*paths, text: str | None = None) -> QMimeData:
    mime = QMimeData()
    if paths:
        mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    if text is not None:
        mime.setText(text)
    return mime


def drop(widget, mime: QMimeData, modifiers=Qt.KeyboardModifier.NoModifier) -> tuple[bool, bool]:
    """Drag `mime` over `widget` and drop it, as the file manager would; (enter accepted, drop accepted)."""
    at = QPointF(widget.rect().center())
    enter = QDragEnterEvent(at, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, modifiers)
    QApplication.sendEvent(widget, enter)
    event = QDropEvent(at, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, modifiers)
    QApplication.sendEvent(widget, event)
    return enter.isAccepted(), event.isAccepted()


def labels(picker) -> dict[str, str]:
    return {picker.combo.itemData(i): picker.combo.itemText(i) for i in range(picker.combo.count())}


# -- the lists ---------------------------------------------------------------------------


def test_model_lists_show_ollama_and_llama_cpp_models_with_their_quantization(dialog):
    for picker in (dialog.form.target, dialog.form.field("model", "draft")):
        shown = labels(picker)
        assert shown["ollama:tiny:1b"].startswith("tiny:1b  (Ollama, Q4_K_M, ")
        cached = next(text for spec, text in shown.items() if spec.endswith("org_Small-GGUF_s.gguf"))
        assert cached.startswith("org_Small-GGUF_s  (llama.cpp cache, Q8_0, ")
        assert "(built-in, Q4_1, " in shown["default"]


# -- drops on the pair dialog ---------------------------------------------------------------


def test_a_gguf_dropped_on_the_dialog_becomes_the_target(dialog, tmp_path):
    path = write_quant_gguf(tmp_path / "dropped.gguf", "Q5_K_M")
    with_drafter = dialog.form.drafter.currentData()
    assert drop(dialog, drag(path)) == (True, True)
    assert dialog.form.target.spec() == path
    assert dialog.form.drafter.currentData() == with_drafter  # the drafter is left as it was


def test_a_model_folder_dropped_on_the_target_field_becomes_the_target(dialog, tmp_path):
    folder = tmp_path / "Some-GGUF"
    folder.mkdir()
    write_quant_gguf(folder / "some-q4.gguf")
    drop(dialog.form.target.combo.lineEdit(), drag(folder))
    assert dialog.form.target.spec() == str(folder)


def test_a_drop_on_the_draft_field_or_with_shift_sets_the_draft_model(dialog, tmp_path):
    first = write_quant_gguf(tmp_path / "draft-1.gguf", "Q4_0")
    second = write_quant_gguf(tmp_path / "draft-2.gguf", "Q4_1")
    target = dialog.form.target.spec()
    drop(dialog, drag(first), Qt.KeyboardModifier.ShiftModifier)  # the draft field is hidden: n-gram is chosen
    assert (dialog.form.field("model", "draft").spec(), dialog.form.drafter.currentData()) == (first, "model")
    drop(dialog.form.field("model", "draft").combo.lineEdit(), drag(second))  # now it shows, and takes drops
    assert dialog.form.field("model", "draft").spec() == second
    assert dialog.form.target.spec() == target


def test_other_files_are_refused_with_the_reason(dialog, tmp_path):
    target = dialog.form.target.spec()
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    assert drop(dialog, drag(notes)) == (True, True)  # taken, so that the refusal can be said
    assert "notes.txt was not opened: it is not a model" in dialog.findings.verdict
    drop(dialog, drag(notes, write_quant_gguf(tmp_path / "x.gguf")))
    assert "drop one model at a time" in dialog.findings.verdict
    assert dialog.form.target.spec() == target


def test_dragged_text_is_left_to_the_field(dialog):
    entered, _ = drop(dialog, drag(text="just words"))
    assert not entered  # not a file: the dialog does not take it
    field = dialog.form.target.combo.lineEdit()
    field.clear()
    drop(field, drag(text="org/name"))
    assert field.text() == "org/name"  # the field takes dragged text as it always did


# -- drops on the main window ---------------------------------------------------------------


def test_a_gguf_dropped_on_the_window_opens_the_pair_dialog_with_it(qtbot, make_window, tmp_path):
    window = make_window(load=False)
    path = write_quant_gguf(tmp_path / "on-window.gguf", "Q6_K")
    assert window.pair_dialog is None
    assert drop(window, drag(path)) == (True, True)
    assert window.pair_dialog is not None and window.pair_dialog.isVisible()
    assert window.pair_dialog.form.target.spec() == path
    window.pair_dialog.reject()


def test_a_file_that_is_not_a_model_is_refused_in_the_status_bar(qtbot, make_window, tmp_path):
    window = make_window(load=False)
    picture = tmp_path / "cat.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n")
    drop(window, drag(picture))
    assert window.pair_dialog is None
    assert window.statusBar().currentMessage().startswith("cat.png was not opened: it is not a model.")


def test_drops_on_the_chat_reach_the_window_and_the_input_keeps_other_files(qtbot, make_window, tmp_path):
    window = make_window(load=False)
    path = write_quant_gguf(tmp_path / "on-chat.gguf", "Q4_0")
    drop(window.chat_view.transcript.viewport(), drag(path))  # read-only: passes the drop up to the window
    assert window.pair_dialog.form.target.spec() == path
    window.pair_dialog.reject()

    composer = window.chat_view.composer
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    drop(composer.viewport(), drag(notes))
    assert window.pair_dialog is None and not window.statusBar().currentMessage()
    assert "notes.txt" in composer.toPlainText()  # what a text field does with a file, as before
    drop(composer.viewport(), drag(path))
    assert window.pair_dialog is not None and window.pair_dialog.form.target.spec() == path
    window.pair_dialog.reject()
