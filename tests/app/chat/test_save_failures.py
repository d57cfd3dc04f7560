"""Saving that fails on a real disk: nothing typed or shown is lost, and the banner says why."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.chat.conversations import ConversationStore
from engine import SamplingConfig
from tests.app.conftest import REPLY_TIMEOUT_MS, STRICT_QT_LOG
from tests.disks import fill, make_read_only, small_disk

pytestmark = STRICT_QT_LOG


@pytest.fixture
def disk(tmp_path):
    """A real 4 MiB disk (tmpfs), to make read-only or fill up."""
    with small_disk(tmp_path / "disk", 4096) as where:
        yield where


def test_a_message_that_cannot_be_saved_stays_in_the_composer(qtbot, make_window, disk, monkeypatch):
    folder = disk / "conversations"
    earlier = ConversationStore(folder)
    earlier.add_user_message(earlier.create("An earlier chat"), "Hello from yesterday.")
    earlier.close()
    make_read_only(disk)
    monkeypatch.setenv("SPECDECK_DATA_DIR", str(folder))
    window = make_window()
    started = []
    window.controller.sig_run_started.connect(started.append)

    window.chat_view.composer.setPlainText("Please keep this text.")
    qtbot.keyClick(window.chat_view.composer, Qt.Key.Key_Return)
    qtbot.wait(200)  # a reply would have started by now

    assert window.chat_view.composer.toPlainText() == "Please keep this text."
    assert window.banner.kind == "error" and "read-only" in window.banner.text()
    assert "not sent" in window.banner.text()
    assert "Please keep this text." not in window.chat_view.transcript.toPlainText()
    assert started == [] and not window.controller.busy
    assert window.conversation_panel.titles() == ["An earlier chat"]  # still listed, still readable


def test_a_full_disk_mid_reply_keeps_the_reply_streaming_and_saves_it_once_there_is_room(
    qtbot, make_window, disk, monkeypatch
):
    monkeypatch.setenv("SPECDECK_DATA_DIR", str(disk / "conversations"))
    # Long enough for several hand-overs of steps (4 to 10 a second) after the disk fills: the
    # embedded model tells a story to its 160-token end (it answers a request to count in one line).
    window = make_window(sampling=SamplingConfig(max_tokens=160))
    failures, shown, filler = [], [], []
    window.chats.sig_save_failed.connect(failures.append)
    steps_after_failure = []

    def on_steps(steps):
        # Runs after ChatSession (connected first) has shown and tried to save these steps.
        if not shown:
            filler.append(fill(disk))
        shown.append(window.chat_view.transcript.toPlainText())
        if failures:
            steps_after_failure.append(window.banner.text())
            if len(steps_after_failure) == 2:
                filler[0].unlink()

    window.controller.sig_steps.connect(on_steps)
    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        window.send_message(
            "Write a story of about 200 words about a lighthouse keeper who finds a message in a bottle."
        )
    result = finished.args[1]

    assert len(failures) == 1 and "disk is full" in failures[0]  # once for the streak, not once per token
    assert "disk is full" in steps_after_failure[0]  # the banner said so while the reply went on
    assert len(steps_after_failure) >= 2, "the reply ended before the disk was freed"
    assert len(shown[-1]) > len(shown[1]) > len(shown[0])  # it kept streaming on screen after the failure
    assert result.finish_reason in ("length", "stop") and len(result.token_infos) > 8
    words = " ".join  # the transcript shows a blank line between paragraphs as a paragraph break
    assert words(result.text.split()) in words(window.chat_view.transcript.toPlainText().split())
    assert "Saving works again" in window.banner.text()
    saved = ConversationStore(disk / "conversations").load(window.chats.conversation.id)
    assert saved.messages[1].content == result.text  # every token, the ones the full disk refused too
    assert saved.messages[1].finish_reason == result.finish_reason
