"""Chatting with the real embedded model: streaming, colours, charts, stop, keyboard."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.chat.conversations import ConversationStore
from engine import SamplingConfig
from engine.core.events import GenerationResult
from tests.app.conftest import REPLY_TIMEOUT_MS, STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG

# A prompt that makes the n-gram drafter useful (the reply repeats the prompt's words).
REPEAT = "Repeat this sentence twice: the quick brown fox jumps over the lazy dog."


def test_a_reply_streams_into_the_chat_the_store_and_the_charts(qtbot, make_window, data_dir):
    window = make_window()
    chart_points, shown_lengths = [], []

    def on_steps(steps):
        # Sampled on every batch of steps, after the window handled it (it was connected first).
        chart_points.append(len(window.charts.series()["throughput"].get(steps[0].run, ((),))[0]))
        shown_lengths.append(len(window.chat_view.transcript.toPlainText()))

    window.controller.sig_steps.connect(on_steps)
    result = send_and_wait(qtbot, window, REPEAT)

    assert isinstance(result, GenerationResult) and result.text.strip()
    assert len(chart_points) >= 2 and len(result.events) >= 2
    assert chart_points == sorted(chart_points) and chart_points[-1] == len(result.events)  # grew as it decoded
    assert shown_lengths[0] < shown_lengths[-1]  # the reply appeared while it was produced
    assert result.text.strip() in window.chat_view.transcript.toPlainText().replace("\u2029", "\n")
    saved = ConversationStore(data_dir).load(window.chats.conversation.id)
    assert [m.role for m in saved.messages] == ["user", "assistant"]
    assert saved.messages[1].content == result.text and saved.messages[1].finish_reason == result.finish_reason
    assert window.conversation_panel.titles() == ["Repeat this sentence twice: the quick brown fox…"]


def test_token_colours_match_the_engines_provenance(qtbot, make_window):
    window = make_window()
    window.actions.markdown.setChecked(False)  # finished replies token by token, as they streamed
    result = send_and_wait(qtbot, window, REPEAT)

    expected = [(c, info.source.value) for info in result.token_infos for c in info.text if c != "\n"]
    assert window.chat_view.transcript.character_sources(-1) == expected
    sources = {info.source.value for info in result.token_infos}
    assert "accepted" in sources  # the drafter did guess: the comparison above is not all "plain"


def test_stop_mid_reply_then_send_again(qtbot, make_window, data_dir):
    window = make_window(sampling=SamplingConfig(max_tokens=400))
    with qtbot.waitSignal(window.controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        window.send_message("Write a long story about a lighthouse keeper.")
    assert window.chat_view.send_button.text() == "Stop"

    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as stopped:
        qtbot.keyClick(window.chat_view.composer, Qt.Key.Key_Escape)
    assert stopped.args[1].finish_reason == "cancelled"
    assert "stopped" in window.chat_view.transcript.toPlainText()
    qtbot.waitUntil(lambda: window.chat_view.send_button.text() == "Send")

    window.sampling = SamplingConfig(max_tokens=12)
    again = send_and_wait(qtbot, window, "And now a haiku?")

    assert again.finish_reason in ("stop", "length")
    saved = ConversationStore(data_dir).load(window.chats.conversation.id)
    replies = [m for m in saved.messages if m.role == "assistant"]
    assert [m.finish_reason for m in replies] == ["cancelled", again.finish_reason]


def test_sending_while_a_reply_streams_stops_it_and_then_sends(qtbot, make_window, data_dir):
    window = make_window(sampling=SamplingConfig(max_tokens=400))
    with qtbot.waitSignal(window.controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        window.send_message("Tell me about the sea.")

    window.sampling = SamplingConfig(max_tokens=8)
    finished, buttons = [], []
    window.controller.sig_run_finished.connect(lambda kind, result: finished.append(result.finish_reason))
    window.controller.sig_steps.connect(lambda _: buttons.append(window.chat_view.send_button.text()))
    window.chat_view.composer.setPlainText("Shorter, please.")
    qtbot.keyClick(window.chat_view.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=REPLY_TIMEOUT_MS)

    assert finished[0] == "cancelled"
    assert set(buttons) == {"Stop"}  # the second reply is stoppable too, like any other
    roles = [
        (m.role, m.content if m.role == "user" else m.finish_reason)
        for m in ConversationStore(data_dir).load(window.chats.conversation.id).messages
    ]
    assert roles == [
        ("user", "Tell me about the sea."),
        ("assistant", "cancelled"),
        ("user", "Shorter, please."),
        ("assistant", finished[1]),
    ]


def test_shift_enter_adds_a_line_and_enter_sends(qtbot, make_window):
    window = make_window(load=False)
    composer = window.chat_view.composer
    window.chat_view.set_ready(True)
    sent = []
    window.chat_view.sig_send_requested.connect(sent.append)
    window.chat_view.sig_send_requested.disconnect(window.send_message)  # the view alone, no model

    qtbot.keyClicks(composer, "line one")
    qtbot.keyClick(composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(composer, "line two")
    assert sent == []
    qtbot.keyClick(composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)

    assert sent == ["line one\nline two"]
    assert composer.toPlainText() == "line one\nline two"  # kept until the message is saved
    window.chat_view.message_sent(sent[0])
    assert composer.toPlainText() == ""


def test_the_reply_footer_says_how_long_the_first_token_took(qtbot, make_window):
    window = make_window()
    result = send_and_wait(qtbot, window, "Say hello.")

    waited = result.stats.time_to_first_token_s
    assert 0 < waited < result.stats.prefill_s + result.stats.wall_s
    assert f"time to first token {waited:.2f} s" in window.chat_view.transcript.toPlainText()  # figures.py's name
