"""The main window: restarts keep settings and chats, errors become messages, the window stays usable."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QEvent, QObject, QSettings
from PySide6.QtWidgets import QDialog

from app.chat.conversations import ConversationStore
from app.shell import settings as keys
from engine import EngineConfig, SamplingConfig
from engine.core.events import Source
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG


def test_settings_and_conversations_survive_a_restart(qtbot, make_window, data_dir):
    first = make_window()
    reply = send_and_wait(qtbot, first, "Say hello to the fox.")
    first.actions.colour_tokens.setChecked(False)
    first.actions.markdown.setChecked(False)  # replies token by token: their provenance shows
    first.tabs.setCurrentWidget(first.compare_view)
    first.resize(1111, 777)
    conversation_id = first.chats.conversation.id
    first.close()

    second = make_window(load=False)

    assert second.chats.conversation is not None and second.chats.conversation.id == conversation_id
    assert second.conversation_panel.current_id() == conversation_id
    assert reply.text.strip() in second.chat_view.transcript.toPlainText().replace("\u2029", "\n")
    assert not second.actions.colour_tokens.isChecked() and not second.chat_view.transcript.colours_enabled()
    assert not second.actions.markdown.isChecked() and not second.chat_view.transcript.markdown_enabled()
    assert second.tabs.currentWidget() is second.compare_view
    # Within a frame's width: restoreGeometry() works on the frame, and offscreen fakes one.
    assert abs(second.width() - 1111) <= 16 and abs(second.height() - 777) <= 16
    # The colours come back from the journal as they were streamed.
    shown = {s for _, s in second.chat_view.transcript.character_sources(-1)}
    assert shown == {info.source.value for info in reply.token_infos if info.text.strip("\n")}


def test_a_missing_model_shows_a_message_and_the_window_stays_usable(qtbot, make_window, tmp_path):
    window = make_window(load=False)
    missing = str(tmp_path / "no-such-model.gguf")

    with qtbot.waitSignal(window.controller.sig_load_failed, timeout=LOAD_TIMEOUT_MS):
        window.start(EngineConfig(target=missing))

    assert window.banner.isVisible() and missing in window.banner.text()
    assert "Choose models…" in window.banner.action_labels()
    assert not window.chat_view.send_button.isEnabled()
    assert window.engine_label.text() == "No model loaded"

    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        window.load_engine(FAST_CONFIG)
    assert not window.banner.isVisible()
    assert send_and_wait(qtbot, window, "Hello?").text


def test_an_error_during_generation_is_shown_and_the_next_chat_works(qtbot, make_window):
    window = make_window(EngineConfig(measure_costs=False, k=4, n_ctx=48))

    result = send_and_wait(qtbot, window, "Please summarise: " + "a very long sentence indeed, " * 12)

    assert result is None
    assert window.banner.isVisible() and "context window" in window.banner.text()
    assert "failed" in window.chat_view.transcript.toPlainText()
    assert window.chat_view.send_button.isEnabled()

    window.new_chat()
    assert send_and_wait(qtbot, window, "Hi").finish_reason in ("stop", "length", "context")


def test_a_saved_model_pair_that_no_longer_loads_offers_the_built_in_model(qtbot, make_window, tmp_path):
    keys.set_engine_config(EngineConfig(target=str(tmp_path / "moved.gguf")))
    window = make_window(load=False)

    with qtbot.waitSignal(window.controller.sig_load_failed, timeout=LOAD_TIMEOUT_MS):
        window.start()

    assert "Use the built-in model" in window.banner.action_labels()


def test_closing_while_a_reply_streams_cancels_it_and_ends_it_in_the_journal(qtbot, make_window, data_dir):
    window = make_window(sampling=SamplingConfig(max_tokens=400))
    with qtbot.waitSignal(window.controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        window.send_message("Write a long poem about rivers.")

    window.close()

    assert not window.controller.busy and window.controller.loaded is None
    reply = ConversationStore(data_dir).load(window.chats.conversation.id).messages[-1]
    assert reply.role == "assistant" and reply.content and reply.finish_reason == "cancelled"


def test_rename_and_delete_go_through_the_store(qtbot, make_window, data_dir):
    store = ConversationStore(data_dir)
    keep, drop = store.create("Keep me"), store.create("Drop me")
    window = make_window(load=False)

    window.chats.rename(keep.id, "Kept")
    window.chats.open(drop.id)
    window.chats.delete(drop.id)

    assert [c.title for c in ConversationStore(data_dir).list()] == ["Kept"]
    assert window.conversation_panel.titles() == ["Kept"] and window.chats.conversation is None


# -- the model pair dialog (app/pair/dialog.py) ----------------------------------------------


@pytest.fixture
def pair_dialog_class():
    from app.pair.dialog import PairDialog  # a dialog that fails to import fails these tests, never skips them

    return PairDialog


def test_accepting_the_pair_dialog_reloads_and_uses_its_sampling(qtbot, make_window, pair_dialog_class, tmp_path):
    window = make_window(load=False)
    window.choose_models()
    dialog = window.pair_dialog
    assert isinstance(dialog, pair_dialog_class) and dialog.isVisible()
    missing = EngineConfig(target=str(tmp_path / "gone.gguf"))
    sampling = SamplingConfig(temperature=0.7, seed=5, max_tokens=9)
    dialog.engine_config = lambda: missing
    dialog.sampling_config = lambda: sampling

    with qtbot.waitSignal(window.controller.sig_load_failed, timeout=LOAD_TIMEOUT_MS):
        QDialog.accept(dialog)  # past the dialog's own check: what happens after OK is under test here

    assert window.sampling == sampling and keys.sampling_config(QSettings()) == sampling
    assert keys.engine_config(QSettings()) == missing
    assert "gone.gguf" in window.banner.text()
    assert "greedy, seed 5, up to 9 tokens" in window.compare_view.settings_label.text()  # the side by side's own


def test_an_incompatible_pair_is_refused_and_nothing_loads(qtbot, make_window, pair_dialog_class, tmp_path):
    import json

    from tests.factories.hf_models import make_tiny_llama

    target = make_tiny_llama(tmp_path / "target", seed=0)
    draft = make_tiny_llama(tmp_path / "draft", seed=1)
    with open(f"{draft}/tokenizer.json", encoding="utf-8") as file:  # same size, different vocabulary
        tokenizer = json.load(file)
    vocab = tokenizer["model"]["vocab"]
    by_id = {i: text for text, i in vocab.items()}
    vocab[by_id[1000]], vocab[by_id[1001]] = 1001, 1000
    with open(f"{draft}/tokenizer.json", "w", encoding="utf-8") as file:
        json.dump(tokenizer, file)
    window = make_window(load=False)
    window.choose_models()
    dialog = window.pair_dialog
    loads = []
    window.controller.sig_busy_changed.connect(loads.append)

    dialog.set_config(EngineConfig(target=target).with_drafter("model", draft=draft))
    with qtbot.waitSignal(dialog.sig_check_finished, timeout=60_000) as checked:
        dialog.check()
    dialog.accept()

    assert checked.args == [False] and dialog.isVisible()
    assert any(f.severity == "error" for f in dialog.findings_list())
    assert loads == [] and window.controller.loaded is None


def test_source_names_cover_every_source():
    from app.chat.provenance import SOURCE_COLOURS, SOURCE_DESCRIPTIONS, SOURCE_NAMES

    assert set(SOURCE_NAMES) == set(SOURCE_DESCRIPTIONS) == set(SOURCE_COLOURS) == set(Source)


def test_loading_reports_progress_and_gives_the_charts_the_cost_model(qtbot, make_window):
    window = make_window(load=False)
    given, progress = [], []
    window.charts.set_cost_model = given.append
    window.controller.sig_load_progress.connect(lambda message, fraction: progress.append(fraction))

    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        window.start(FAST_CONFIG)

    assert progress[0] == 0.0 and progress[-1] == 1.0 and progress == sorted(progress)
    assert given == [window.controller.loaded.costs]
    assert not window.progress.isVisible() and "SmolLM2" in window.engine_label.text()


def test_a_new_chat_stays_new_while_the_model_pair_loads_again(qtbot, make_window):
    """Loading disables the Send button, and its focus (the user clicked it) moved to the list of
    chats, which opened the latest one: the next message went on with that conversation."""
    window = make_window()
    assert send_and_wait(qtbot, window, "Say hello to the fox.") is not None
    window.activateWindow()
    window.new_chat()  # an empty chat
    window.chat_view.send_button.setFocus()  # where a click on Send leaves the focus
    assert window.chats.conversation is None and window.chat_view.send_button.hasFocus()
    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        window.start(FAST_CONFIG)  # as the pair dialog's OK does
    assert window.chats.conversation is None
    assert "fox" not in window.chat_view.transcript.toPlainText()


def test_charts_redraw_less_while_the_windows_own_engine_decodes_on_its_cores(qtbot, make_window):
    from app.charts.live import REDRAW_BUDGET, SHARED_CORES_BUDGET

    window = make_window()
    assert window.controller.loaded.target.device.startswith("cpu") and window.controller.shares_cores
    assert send_and_wait(qtbot, window, "Hi") is not None
    assert window.charts.pace.budget == SHARED_CORES_BUDGET < REDRAW_BUDGET


def test_the_progress_bar_follows_llama_cpp_as_it_reads_the_weights(qtbot, make_window):
    window = make_window(load=False)
    shown = []  # the bar's value and the status line each time progress arrives (the window's slot ran first)
    window.controller.sig_load_progress.connect(
        lambda message, fraction: shown.append((window.progress.value(), window.statusBar().currentMessage()))
    )

    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        window.start(FAST_CONFIG)

    values = [value for value, _ in shown]
    reading = {value for value, message in shown if "reading the weights" in message}
    assert values == sorted(values) and values[-1] == 100
    assert len(reading) >= 10  # the bar moves while the weights are read, not in two or three jumps


def test_the_composer_says_it_is_ready_once_the_model_loaded(qtbot, make_window):
    window = make_window(load=False)
    composer = window.chat_view.composer
    painted = []  # the placeholder the composer showed each time it was drawn

    class Watcher(QObject):
        def eventFilter(self, watched, event):  # noqa: N802 - Qt API
            if event.type() == QEvent.Type.Paint:
                painted.append(composer.placeholderText())
            return False

    watcher = Watcher(window)
    composer.viewport().installEventFilter(watcher)
    qtbot.waitUntil(lambda: bool(painted) and painted[-1] == "Loading the model…")

    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        window.start(FAST_CONFIG)

    # What is on screen, not only the widget's state: Qt does not repaint an empty box
    # whose placeholder changes, so it went on showing "Loading the model…".
    qtbot.waitUntil(lambda: painted[-1].startswith("Message (Enter to send"), timeout=2000)
    assert window.chat_view.send_button.isEnabled() and window.compare_view.run_button.isEnabled()


def test_a_reply_keeps_going_into_its_own_chat_while_another_is_open(qtbot, make_window, data_dir):
    other = ConversationStore(data_dir).create("Other chat")
    window = make_window(sampling=SamplingConfig(max_tokens=16))
    finished = qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS)  # listening from now
    with qtbot.waitSignal(window.controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        window.send_message("Count from one to twenty.")
    replying = window.chats.conversation

    window.chats.open(other.id)
    finished.wait()
    text_of_other = window.chat_view.transcript.toPlainText()
    window.chats.open(replying.id)

    reply = finished.args[1]
    assert reply.text and reply.text.strip() not in text_of_other
    assert ConversationStore(data_dir).load(replying.id).messages[-1].content == reply.text
    assert ConversationStore(data_dir).load(other.id).messages == []
    assert reply.text.strip() in window.chat_view.transcript.toPlainText().replace("\u2029", "\n")


def test_exports_go_where_the_user_chose(qtbot, make_window, data_dir, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    window = make_window()
    send_and_wait(qtbot, window, "Name three colours.")
    chosen = []

    def choose(parent, caption, suggested, file_filter):
        path = tmp_path / "exports" / suggested.rsplit("/", 1)[-1]
        chosen.append(path)
        return str(path), file_filter

    (tmp_path / "exports").mkdir()
    monkeypatch.setattr(QFileDialog, "getSaveFileName", choose)
    for action in (
        window.actions.export_markdown,
        window.actions.export_png,
        window.actions.export_csv,
        window.actions.export_json,
        window.actions.export_svg,
    ):
        action.trigger()

    assert [p.suffix for p in chosen] == [".md", ".png", ".csv", ".json", ".svg"]
    assert all(p.is_file() and p.stat().st_size > 0 for p in chosen[:-1])
    assert chosen[0].read_text().startswith("# Name three colours.")
    # SVG: one drawing per panel beside the name chosen, as the status bar says.
    drawings = sorted((tmp_path / "exports").glob("specdeck-charts-*.svg"))
    assert len(drawings) == len(window.charts.visible_panels()) >= 7
    assert f"{len(drawings)} SVG files" in window.statusBar().currentMessage()


def test_a_failed_export_is_a_message_not_a_crash(qtbot, make_window, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    window = make_window(load=False)
    nowhere = str(tmp_path / "missing-folder" / "charts.csv")
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args: (nowhere, ""))

    window.actions.export_csv.trigger()

    assert window.banner.isVisible() and "missing-folder" in window.banner.text()


def test_renaming_in_the_list_saves_the_new_title(qtbot, make_window, data_dir):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication, QLineEdit

    conversation = ConversationStore(data_dir).create("Old title")
    window = make_window(load=False)
    window.chats.open(conversation.id)
    window.activateWindow()

    window.actions.rename.trigger()  # F2: edit the title in place
    qtbot.waitUntil(lambda: isinstance(QApplication.focusWidget(), QLineEdit))
    editor = QApplication.focusWidget()
    editor.selectAll()
    qtbot.keyClicks(editor, "New title")
    qtbot.keyClick(editor, Qt.Key.Key_Return)

    qtbot.waitUntil(lambda: ConversationStore(data_dir).load(conversation.id).title == "New title")
    assert window.conversation_panel.titles() == ["New title"]
    assert window.windowTitle().startswith("New title")
