"""BenchDialog: runs a benchmark off the GUI thread, shows bars and a table, exports JSON, cancels."""

from __future__ import annotations

import dataclasses
import json

import pytest
from PySide6.QtWidgets import QDialog

from app import settings as keys
from app.bench_dialog import BenchDialog
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, STRICT_QT_LOG

pytestmark = STRICT_QT_LOG
# One llama.cpp thread: on a busy 2-core machine two threads spin waiting for each other.
CONFIG = dataclasses.replace(FAST_CONFIG, threads=1)
RUN_TIMEOUT_MS = 120_000


@pytest.fixture
def own_prompts(tmp_path):
    """A user's own prompt file: one prompt of each kind."""
    path = tmp_path / "mine.jsonl"
    lines = [
        {"id": "echo", "kind": "reuse", "messages": [
            {"role": "user", "content": "Copy this sentence exactly: the quick brown fox jumps over the lazy dog."}]},
        {"id": "story", "kind": "open", "messages": [{"role": "user", "content": "Tell me a story about a cat."}]},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


@pytest.fixture
def dialog(qtbot):
    d = BenchDialog(config=CONFIG)
    qtbot.addWidget(d)  # closed at teardown: done() cancels and joins a running benchmark
    d.show()
    return d


def run_and_wait(qtbot, dialog, timeout=RUN_TIMEOUT_MS):
    with qtbot.waitSignal(dialog.sig_finished, timeout=timeout) as blocker:
        dialog.run()
    qtbot.waitUntil(lambda: not dialog.running, timeout=LOAD_TIMEOUT_MS)
    return blocker.args[0]


def test_a_run_on_the_users_prompts_shows_bars_a_table_and_exports(qtbot, dialog, own_prompts, tmp_path):
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(8)
    progress = []
    dialog.progress.valueChanged.connect(progress.append)
    report = run_and_wait(qtbot, dialog)

    assert report is not None, dialog.status.text()
    assert [p.id for p in report.prompts] == ["echo", "story"]
    assert progress and progress[-1] == 100
    vanilla, speculative = dialog.chart.bars["SpecDeck vanilla"], dialog.chart.bars["SpecDeck speculative"]
    assert len(vanilla.opts["height"]) == 2 and all(h > 0 for h in vanilla.opts["height"])
    assert all(h > 0 for h in speculative.opts["height"])
    ticks = dialog.chart.plot.getAxis("bottom")._tickLevels[0]
    assert [label.strip() for _, label in ticks] == ["echo", "story"]
    table = dialog.table
    assert table.rowCount() == 2 + 2 + 1  # the prompts, each kind, all prompts
    assert table.item(0, 0).text() == "echo" and table.item(4, 0).text() == "all prompts"
    assert table.item(0, 9).text() in ("yes", "no", "no (rounding)")
    assert "Efficiency" in dialog.checks.text() and "Bandwidth floor" in dialog.checks.text()
    assert dialog.run_button.isEnabled() and not dialog.cancel_button.isEnabled()

    saved = dialog.export_json(tmp_path / "bench.json")
    data = json.loads(saved.read_text())
    assert data["settings"]["max_tokens"] == 8 and len(data["runs"]) == 4
    assert data["settings"]["prompts_file"] == str(own_prompts)


def test_a_bad_prompts_file_is_reported_and_nothing_runs(qtbot, dialog, tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"id": "a", "kind": "k", "messages": [{"role": "user", "content": "hi"}]}\n{"id": \n')
    dialog.prompts_edit.setText(str(path))
    dialog.run()
    assert not dialog.running
    assert "broken.jsonl, line 2: not valid JSON" in dialog.status.text()


def test_cancel_stops_the_run_and_the_dialog_can_run_again(qtbot, dialog, own_prompts):
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.max_tokens.setValue(8)
    dialog.repeat.setValue(1)
    with qtbot.waitSignal(dialog.sig_finished, timeout=RUN_TIMEOUT_MS) as blocker:
        dialog.run()
        assert dialog.running and dialog.cancel_button.isEnabled() and not dialog.repeat.isEnabled()
        dialog.cancel()
    assert blocker.args[0] is None
    assert "Cancelled" in dialog.status.text()
    qtbot.waitUntil(lambda: dialog.run_button.isEnabled(), timeout=LOAD_TIMEOUT_MS)


def test_the_settings_are_remembered(qtbot, own_prompts):
    first = BenchDialog(config=CONFIG)
    qtbot.addWidget(first)
    first.prompts_edit.setText(str(own_prompts))
    first.repeat.setValue(5)
    first.peers.setChecked(True)
    first._remember()
    second = BenchDialog(config=CONFIG)
    qtbot.addWidget(second)
    assert (second.prompts_edit.text(), second.repeat.value(), second.peers.isChecked()) == \
        (str(own_prompts), 5, True)  # fmt: skip


def test_the_models_menu_opens_the_benchmark_on_the_windows_pair(qtbot, make_window):
    window = make_window(load=False)
    menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Models")
    assert window.actions.benchmark in menu.actions()
    window.actions.benchmark.trigger()
    dialog = window.findChild(BenchDialog)
    assert dialog is not None and dialog.isVisible()
    assert dialog.config == keys.engine_config()  # nothing loaded yet: the saved pair
    window.actions.benchmark.trigger()  # a second trigger brings the same dialog forward
    assert len(window.findChildren(BenchDialog)) == 1
    dialog.reject()
    assert dialog.result() == QDialog.DialogCode.Rejected
