"""BenchDialog: runs a benchmark off the GUI thread, shows bars and a table, exports JSON, cancels;
finds the best settings and applies them to the window."""

from __future__ import annotations

import dataclasses
import json

import pytest
from PySide6.QtWidgets import QDialog

from app.shell import settings as keys
from app.bench.dialog import BenchDialog
from engine import Engine
from engine.bench import Candidate
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
    assert table.item(0, table.BASE.index("identical")).text() in ("yes", "no", "no (rounding)")
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


# -- Find the best settings ------------------------------------------------------------------

FEW = (Candidate("ngram", 2), Candidate("ngram", 8))  # two candidates and plain decoding: a short run


@pytest.fixture
def copy_prompts(tmp_path):
    """Prompts whose replies copy their input, where n-gram lookup drafts well."""
    path = tmp_path / "copy.jsonl"
    text = "Copy this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, oranges, melons, figs."
    path.write_text(json.dumps({"id": "fruit", "kind": "reuse", "messages": [{"role": "user", "content": text}]}))
    return path


def tune_and_wait(qtbot, dialog):
    with qtbot.waitSignal(dialog.sig_tuned, timeout=RUN_TIMEOUT_MS) as blocker:
        dialog.autotune_button.click()
    qtbot.waitUntil(lambda: not dialog.running, timeout=LOAD_TIMEOUT_MS)
    return blocker.args[0]


def test_find_the_best_settings_fills_a_table_ranked_by_speedup(qtbot, dialog, copy_prompts):
    dialog.prompts_edit.setText(str(copy_prompts))
    dialog.max_tokens.setValue(16)
    dialog.autotune_candidates = FEW
    assert not dialog.autotune_panel.isVisible()
    result = tune_and_wait(qtbot, dialog)

    assert result is not None, dialog.status.text()
    table = dialog.autotune_panel.table
    assert dialog.autotune_panel.isVisible() and table.rowCount() == 3  # two candidates and plain decoding
    shown = [float(table.item(row, 3).text().rstrip("×")) for row in range(3)]
    assert shown == sorted(shown, reverse=True)
    assert [table.item(row, 2).text() for row in range(3)] == [str(r.candidate.k) for r in result.ranked]
    assert "Fastest" in dialog.autotune_panel.summary.text() or "Nothing beat" in dialog.autotune_panel.summary.text()
    assert result.max_tokens == 16 and "settings measured" in dialog.status.text()
    assert not dialog.autotune_panel.apply_button.isEnabled()  # a dialog with no window to apply to
    assert dialog.run_button.isEnabled() and dialog.autotune_button.isEnabled()


def test_cancel_stops_auto_tune(qtbot, dialog, copy_prompts):
    dialog.prompts_edit.setText(str(copy_prompts))
    dialog.autotune_candidates = FEW
    with qtbot.waitSignal(dialog.sig_tuned, timeout=RUN_TIMEOUT_MS) as blocker:
        dialog.autotune()
        assert dialog.running and not dialog.autotune_button.isEnabled()
        dialog.cancel()
    assert blocker.args[0] is None and "Cancelled" in dialog.status.text()
    assert not dialog.autotune_panel.isVisible()


def test_use_these_settings_loads_the_fastest_config_in_the_window(qtbot, make_window, copy_prompts):
    window = make_window(config=CONFIG)
    sampling = window.sampling
    window.actions.benchmark.trigger()
    dialog = window.findChild(BenchDialog)
    dialog.prompts_edit.setText(str(copy_prompts))
    dialog.max_tokens.setValue(16)
    dialog.autotune_candidates = FEW
    result = tune_and_wait(qtbot, dialog)
    assert result is not None, dialog.status.text()
    assert result.best_config == dataclasses.replace(CONFIG, drafter=result.best.candidate.drafter,
                                                     k=result.best.candidate.k)  # fmt: skip

    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        dialog.autotune_panel.apply_button.click()
    assert window.controller.loaded.config == result.best_config
    assert window.sampling == sampling and keys.engine_config() == result.best_config
    assert f"k {result.best.candidate.k}" in dialog.models_label.text()
    dialog.reject()


# -- one copy of the models: the window's engine, or the window's freed first -----------------


def test_the_windows_pair_is_benchmarked_on_the_windows_engine(qtbot, make_window, own_prompts, monkeypatch):
    window = make_window(config=CONFIG)
    loaded = window.controller.loaded
    loads = []
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *args, **kwargs: loads.append(args)))
    dialog = window.open_benchmark()
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(8)

    report = run_and_wait(qtbot, dialog)

    assert report is not None, dialog.status.text()
    assert loads == []  # no second copy
    assert window.controller.loaded is loaded and window.chat_view.send_button.isEnabled()
    assert "the pair loaded in the window" in dialog.models_label.text()
    dialog.reject()


def test_another_pair_frees_the_windows_models_first_and_they_load_again_after(qtbot, make_window, own_prompts,
                                                                                monkeypatch):  # fmt: skip
    window = make_window(config=CONFIG)
    loads = []
    real_load = Engine.load.__func__

    def load(cls, config, *args, **kwargs):
        loads.append((config, window.controller.client.loaded()))  # what the engine process held then
        return real_load(cls, config, *args, **kwargs)

    monkeypatch.setattr(Engine, "load", classmethod(load))
    dialog = window.open_benchmark()
    dialog.config = other = dataclasses.replace(CONFIG, k=3)
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(8)

    report = run_and_wait(qtbot, dialog)

    assert report is not None, dialog.status.text()
    assert loads == [(other, None)]  # the benchmark's own copy, loaded after the window's was freed
    assert window.controller.loaded is None and "models were freed first" in dialog.models_label.text()
    qtbot.waitUntil(lambda: not window.controller.busy)  # the report can arrive before the run's end does
    assert not window.chat_view.send_button.isEnabled()
    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        dialog.reject()
    assert window.controller.loaded.config == CONFIG and window.controller.client.loaded().config == CONFIG
