"""The real window on a SpecDeck server instead of its own engine process: the pair loads there and
nothing starts here, a reply is shown and stored as a local one is, and a server that is not there,
or dies mid-reply, is a message that keeps what was shown, with the next Send trying again."""

from __future__ import annotations

import pytest

from app.chat.conversations import ConversationStore
from app.runtime.engine_controller import EngineController
from app.shell import settings as keys
from app.shell.main_window import MainWindow
from app.shell.settings import EngineChoice
from engine import EngineClient, EngineProcess, SamplingConfig
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, SHORT_REPLY, STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG
LONG = SamplingConfig(max_tokens=400)


@pytest.fixture
def local_process():
    """The window's own engine process, which a remote choice must never start."""
    process = EngineProcess()
    yield process
    process.stop()


@pytest.fixture
def open_window(qtbot, local_process):
    def open_(choice: EngineChoice, sampling: SamplingConfig = SHORT_REPLY, wait_for=None) -> MainWindow:
        keys.set_engine_choice(choice)  # as the pair dialog saved it
        keys.set_engine_config(FAST_CONFIG)
        window = MainWindow(engine_process=local_process)
        qtbot.addWidget(window)
        window.sampling = sampling
        window.show()
        with qtbot.waitSignal(
            wait_for(window.controller) if wait_for else window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS
        ):
            window.start()
        return window

    return open_


def test_a_reply_through_a_specdeck_server_is_shown_and_stored(
    qtbot, open_window, specdeck_server, data_dir, local_process
):
    choice = EngineChoice("specdeck", specdeck_server.url, specdeck_server.key)
    window = open_window(choice)
    assert window.controller.choice == choice
    assert EngineClient(specdeck_server.url, specdeck_server.key).loaded().config == FAST_CONFIG  # loaded there
    assert window.engine_label.text().endswith(f"on the SpecDeck server at {specdeck_server.url}")

    result = send_and_wait(qtbot, window, "Say hello.")

    assert result is not None and result.stats.tokens > 0 and result.text
    assert result.text.strip() in window.chat_view.transcript.toPlainText().replace("\u2029", "\n")
    saved = ConversationStore(data_dir).load(window.chats.conversation.id)
    assert [m.role for m in saved.messages] == ["user", "assistant"]
    assert saved.messages[1].content == result.text and saved.messages[1].finish_reason == result.finish_reason
    assert window.charts.series()["stats"]["speculative"].tokens == result.stats.tokens  # the charts fed too
    assert local_process.pid is None  # nothing was started here


def test_a_server_that_is_not_there_fails_the_load_in_its_clients_words_and_send_tries_again(
    qtbot, open_window, nowhere, local_process
):
    window = open_window(EngineChoice("specdeck", nowhere), wait_for=lambda c: c.sig_load_failed)
    banner = window.banner.text()
    assert f"Nothing answers at {nowhere}" in banner and "Send tries again" in banner
    assert window.chat_view.send_button.isEnabled()  # Send connects again
    assert window.engine_label.text() == "Not connected to the SpecDeck server"

    attempts, errors = [], []
    window.controller.sig_load_started.connect(attempts.append)
    window.controller.sig_error.connect(errors.append)
    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        window.send_message("Hello?")
    assert finished.args[1] is None and attempts == [FAST_CONFIG]  # it tried to connect again
    assert errors == [] and "Nothing answers at" in window.banner.text()  # said once, by the load
    assert window.chats.conversation.messages[0].content == "Hello?"  # the message is kept
    assert local_process.pid is None


def test_a_server_killed_mid_reply_keeps_what_was_shown_and_the_next_send_connects_again(
    qtbot, open_window, start_specdeck_server, data_dir
):
    server = start_specdeck_server()
    window = open_window(EngineChoice("specdeck", server.url, server.key), sampling=LONG)
    shown = []
    window.controller.sig_steps.connect(lambda steps: shown.extend(step.text for step in steps))
    errors = []
    window.controller.sig_error.connect(errors.append)
    with qtbot.waitSignal(window.controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        window.send_message("Write a long poem about rivers.")
    qtbot.waitUntil(lambda: len("".join(shown).strip()) > 0, timeout=REPLY_TIMEOUT_MS)

    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        server.kill()

    assert finished.args[1] is None and len(errors) == 1
    assert server.url in errors[0] and "Send tries again" in errors[0] and "Unexpected" not in errors[0]
    assert errors[0] in window.banner.text()
    saved = ConversationStore(data_dir).load(window.chats.conversation.id)
    reply = saved.messages[1]
    assert reply.role == "assistant" and reply.content and "".join(shown).startswith(reply.content)
    assert window.chat_view.send_button.isEnabled()
    qtbot.waitUntil(lambda: not window.controller.busy)

    with qtbot.waitSignal(window.controller.sig_load_failed, timeout=LOAD_TIMEOUT_MS) as failed:
        window.send_message("Are you there?")  # connects again first: the server is gone
    assert f"Nothing answers at {server.url}" in failed.args[0]


def test_the_benchmark_and_training_say_they_need_a_specdeck_engine_on_llama_server(qtbot, nowhere):
    controller = EngineController(process=EngineProcess())
    controller.choice = EngineChoice("llama-server", nowhere)
    with pytest.raises(Exception, match="Training runs on a local engine or a SpecDeck server") as refused:
        controller.lend(
            "train-heads", FAST_CONFIG, lambda lent, cancel, report: None, lambda worker: None, on_server=True
        )
    assert f"the llama-server at {nowhere}" in str(refused.value)
    assert not controller.busy and controller.process.pid is None
    controller.shutdown()
