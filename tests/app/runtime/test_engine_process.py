"""The app and its engine process: started with the first load, stopped on close, and an engine
killed mid-reply leaves the window up, the partial reply kept, and the next Send starts it again.

Each test here has an engine process of its own (they kill it, or count it)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from app.chat.conversations import ConversationStore
from app.runtime.engine_controller import EngineController
from engine import SamplingConfig
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG
LONG = SamplingConfig(max_tokens=400)
CHAT = [{"role": "user", "content": "Write a long story about a lighthouse."}]


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def children() -> set[int]:
    """This process's live child processes."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


@pytest.fixture
def controller(qtbot):
    controller = EngineController()
    yield controller
    controller.shutdown()


def load(qtbot, controller, config=FAST_CONFIG) -> None:
    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        controller.load(config)


def test_the_engine_process_starts_with_the_first_load_and_shutdown_leaves_no_child(qtbot):
    before = children()
    controller = EngineController()
    assert controller.process.pid is None and children() == before  # nothing started yet

    load(qtbot, controller)
    pid = controller.process.pid
    assert alive(pid) and children() == before | {pid}
    controller.shutdown()

    assert not alive(pid) and children() == before


def test_a_model_that_is_not_there_fails_to_load_with_the_engines_message(qtbot, controller, tmp_path):
    from dataclasses import replace

    missing = tmp_path / "moved.gguf"
    with qtbot.waitSignal(controller.sig_load_failed, timeout=LOAD_TIMEOUT_MS) as failed:
        controller.load(replace(FAST_CONFIG, target=str(missing)))

    message = failed.args[0]
    assert str(missing) in message and "Unexpected" not in message
    assert controller.loaded is None and controller.process.running  # the process lives on for the next load
    load(qtbot, controller)  # and a good pair loads there


def test_killed_mid_reply_the_run_ends_with_the_signal_and_the_next_chat_starts_it_again(qtbot, controller):
    load(qtbot, controller)
    stopped, errors, finished = [], [], []
    controller.sig_engine_stopped.connect(stopped.append)
    controller.sig_error.connect(errors.append)
    controller.sig_run_finished.connect(lambda kind, result: finished.append((kind, result)))
    with qtbot.waitSignal(controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        controller.chat(CHAT, LONG)
    killed = controller.process.pid

    os.kill(killed, signal.SIGKILL)
    qtbot.waitUntil(lambda: bool(finished), timeout=REPLY_TIMEOUT_MS)

    assert finished == [("chat", None)]
    assert len(stopped) == 1 and errors == stopped
    assert "killed by signal 9 (SIGKILL)" in stopped[0] and "Send starts it again" in stopped[0]
    assert controller.loaded is None and not controller.process.running
    qtbot.waitUntil(lambda: not controller.busy)

    loads = []
    controller.sig_load_started.connect(loads.append)
    controller.sig_loaded.connect(loads.append)
    controller.chat(CHAT, SamplingConfig(max_tokens=6))
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=LOAD_TIMEOUT_MS + REPLY_TIMEOUT_MS)

    assert loads == [FAST_CONFIG, FAST_CONFIG]  # the same pair, loaded again first
    kind, result = finished[1]
    assert kind == "chat" and result is not None and result.stats.tokens > 0
    assert controller.process.pid != killed and controller.loaded.config == FAST_CONFIG


def test_killed_between_two_runs_the_next_comparison_says_so_and_starts_it_again(qtbot, controller):
    load(qtbot, controller)
    os.kill(controller.process.pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: not controller.process.running, timeout=10_000)
    stopped = []
    controller.sig_engine_stopped.connect(stopped.append)

    with qtbot.waitSignal(controller.sig_run_finished, timeout=LOAD_TIMEOUT_MS + REPLY_TIMEOUT_MS) as finished:
        controller.compare(CHAT, SamplingConfig(max_tokens=6))

    assert len(stopped) == 1 and "killed by signal 9" in stopped[0]
    comparison = finished.args[1]
    assert finished.args[0] == "compare" and comparison is not None and comparison.speculative.stats.tokens > 0


def test_a_check_that_starts_a_new_engine_after_a_kill_still_leaves_the_next_run_to_say_so_and_reload(
    qtbot, controller
):
    load(qtbot, controller)
    killed = controller.process.pid
    os.kill(killed, signal.SIGKILL)
    qtbot.waitUntil(lambda: not controller.process.running, timeout=10_000)
    assert controller.preflight(FAST_CONFIG).compatible  # the pair dialog's check: a new process, no pair in it
    assert controller.process.running and controller.process.pid != killed
    stopped = []
    controller.sig_engine_stopped.connect(stopped.append)

    with qtbot.waitSignal(controller.sig_run_finished, timeout=LOAD_TIMEOUT_MS + REPLY_TIMEOUT_MS) as finished:
        controller.compare(CHAT, SamplingConfig(max_tokens=6))

    assert len(stopped) == 1 and "killed by signal 9" in stopped[0]  # how the old one ended, not the new one
    assert finished.args[1] is not None and controller.loaded.config == FAST_CONFIG


def test_the_window_survives_its_engine_killed_mid_reply_and_keeps_the_reply(qtbot, make_window, data_dir):
    window = make_window(sampling=LONG, own_engine=True)
    shown = []
    window.controller.sig_steps.connect(lambda steps: shown.extend(step.text for step in steps))
    with qtbot.waitSignal(window.controller.sig_steps, timeout=REPLY_TIMEOUT_MS):
        window.send_message("Write a long poem about rivers.")
    qtbot.waitUntil(lambda: len("".join(shown).strip()) > 0, timeout=REPLY_TIMEOUT_MS)

    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS):
        os.kill(window.controller.process.pid, signal.SIGKILL)

    partial = "".join(shown)
    assert window.isVisible() and window.banner.kind == "error"
    assert "killed by signal 9 (SIGKILL)" in window.banner.text() and "Send starts it again" in window.banner.text()
    assert window.engine_label.text() == "Engine stopped"
    transcript = window.chat_view.transcript.toPlainText().replace("\u2029", "\n")
    assert partial.strip() in transcript and "interrupted: the engine process stopped" in transcript
    reply = ConversationStore(data_dir).load(window.chats.conversation.id).messages[-1]
    assert (reply.role, reply.content, reply.finish_reason) == ("assistant", partial, "interrupted")
    button = window.chat_view.send_button
    qtbot.waitUntil(lambda: button.text() == "Send" and button.isEnabled())  # Send, not Stop: it can start again

    progress = []
    window.controller.sig_load_progress.connect(lambda message, fraction: progress.append(window.progress.isVisible()))
    window.sampling = SamplingConfig(max_tokens=8)
    result = send_and_wait(qtbot, window, "Say hello.", timeout=LOAD_TIMEOUT_MS + REPLY_TIMEOUT_MS)

    assert result is not None and result.stats.tokens > 0
    assert progress and all(progress)  # the reload showed its progress, as any load
    assert "started again" in window.banner.text() and window.banner.kind == "info"
    assert "SmolLM2" in window.engine_label.text()
    messages = ConversationStore(data_dir).load(window.chats.conversation.id).messages
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1].content == partial and messages[3].content == result.text


def test_closing_the_window_stops_its_engine_process(qtbot, make_window):
    window = make_window(own_engine=True)
    pid = window.controller.process.pid
    assert alive(pid)

    window.close()

    assert not alive(pid)
