"""BenchDialog: runs a benchmark on the engine process (off the GUI thread), shows bars and a table,
exports JSON, cancels; finds the best settings and applies them to the window; survives the engine
process dying under a run."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import pytest
from PySide6.QtWidgets import QDialog

from app.bench.dialog import BenchDialog
from app.runtime.engine_controller import EngineController
from app.shell import settings as keys
from engine import EngineConfig
from engine.bench import Candidate
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, STRICT_QT_LOG, unloaded

pytestmark = STRICT_QT_LOG
# One llama.cpp thread: on a busy 2-core machine two threads spin waiting for each other.
CONFIG = dataclasses.replace(FAST_CONFIG, threads=1)
RUN_TIMEOUT_MS = 120_000


@pytest.fixture
def own_prompts(tmp_path):
    """A user's own prompt file: one prompt of each kind."""
    path = tmp_path / "mine.jsonl"
    lines = [
        {
            "id": "echo",
            "kind": "reuse",
            "messages": [
                {"role": "user", "content": "Copy this sentence exactly: the quick brown fox jumps over the lazy dog."}
            ],
        },
        {"id": "story", "kind": "open", "messages": [{"role": "user", "content": "Tell me a story about a cat."}]},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


@pytest.fixture
def host(engine_process):
    """An engine controller on the session's engine process, as a window's (with no pair loaded)."""
    controller = EngineController(process=unloaded(engine_process))
    yield controller
    controller.shutdown()  # waits for a run still ending on its thread


@pytest.fixture
def dialog(qtbot, host):
    d = BenchDialog(config=CONFIG, host=host)
    qtbot.addWidget(d)
    d.show()
    yield d
    d.close()  # done() cancels a running benchmark; the host's shutdown waits for it


def reported(dialog) -> list:
    """What the running benchmark reports, as it arrives: (message, fraction), or the freed pair."""
    values = []
    dialog.worker.sig_yielded.connect(values.append)
    return values


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
    assert [name for _, name in dialog.chart.axis.names] == ["echo", "story"]  # the names under the bars
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


def test_rows_are_drawn_as_prompts_finish_not_at_the_end(qtbot, dialog, own_prompts):
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.repeat.setValue(2)
    dialog.max_tokens.setValue(8)
    shown = []  # at each row: (rows, the final report yet?, bars drawn, table rows)
    dialog.sig_rows_shown.connect(
        lambda n: shown.append(
            (
                n,
                dialog.report is not None,
                len(dialog.chart.bars["SpecDeck speculative"].opts["height"]),
                [dialog.table.item(r, 0).text() for r in range(n)],
            )
        )
    )
    report = run_and_wait(qtbot, dialog)

    assert report is not None, dialog.status.text()
    # Each repeat sends each prompt's row again, over the repeats so far; the chart and table draw it at once.
    assert [(n, final, bars) for n, final, bars, _ in shown] == [
        (1, False, 1),
        (2, False, 2),
        (2, False, 2),
        (2, False, 2),
    ]
    assert shown[0][3] == ["echo"] and shown[-1][3] == ["echo", "story"]
    assert dialog.table.item(0, 0).text() == "echo" and dialog.report is report


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
    assert (second.prompts_edit.text(), second.repeat.value(), second.peers.isChecked()) == (str(own_prompts), 5, True)


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
    assert result.best_config == dataclasses.replace(
        CONFIG, drafter=result.best.candidate.drafter, k=result.best.candidate.k
    )

    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        dialog.autotune_panel.apply_button.click()
    assert window.controller.loaded.config == result.best_config
    assert window.sampling == sampling and keys.engine_config() == result.best_config
    assert f"k {result.best.candidate.k}" in dialog.models_label.text()
    dialog.reject()


# -- one copy of the models: the window's engine, or the window's freed first -----------------


def test_the_windows_pair_is_benchmarked_on_the_windows_engine(qtbot, make_window, own_prompts):
    window = make_window(config=CONFIG)
    loaded = window.controller.loaded
    dialog = window.open_benchmark()
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(8)

    with qtbot.waitSignal(dialog.sig_finished, timeout=RUN_TIMEOUT_MS) as blocker:
        dialog.run()
        values = reported(dialog)
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)

    assert blocker.args[0] is not None, dialog.status.text()
    messages = [value[0] for value in values if isinstance(value, tuple)]
    assert messages and "Loading the models" not in messages  # no second copy: the loaded pair measured
    assert not any(isinstance(value, EngineConfig) for value in values)  # nothing freed
    assert window.controller.loaded is loaded and window.chat_view.send_button.isEnabled()
    assert window.controller.client.loaded().config == CONFIG  # still loaded in the engine process
    assert "the pair loaded in the window" in dialog.models_label.text()
    dialog.reject()


def test_another_pair_frees_the_windows_models_first_and_they_load_again_after(qtbot, make_window, own_prompts):
    window = make_window(config=CONFIG)
    dialog = window.open_benchmark()
    dialog.config = dataclasses.replace(CONFIG, k=3)
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(8)
    seen_while_running = []
    dialog.progress.valueChanged.connect(
        lambda value: (
            value > 0
            and seen_while_running.append(
                (dialog.models_label.text(), window.chat_view.composer.placeholderText(), window.engine_label.text())
            )
        )
    )

    with qtbot.waitSignal(dialog.sig_finished, timeout=RUN_TIMEOUT_MS) as blocker:
        dialog.run()
        values = reported(dialog)
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)  # the report comes before the end

    assert blocker.args[0] is not None, dialog.status.text()
    # The window's pair was freed before anything else, then the benchmark loaded its own copy.
    assert values[0] == CONFIG and values[1][0] == "Loading the models"
    assert window.controller.client.loaded() is None  # the benchmark's copy is closed again
    assert seen_while_running and all(  # said in the dialog and in the window while the benchmark runs
        "models were freed first" in label
        and placeholder == "The models are freed while the benchmark runs."
        and engine == "No model loaded"
        for label, placeholder, engine in seen_while_running
    )
    assert window.controller.loaded is None and "models were freed first" in dialog.models_label.text()
    assert not window.chat_view.send_button.isEnabled()
    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        dialog.reject()
    assert window.controller.loaded.config == CONFIG and window.controller.client.loaded().config == CONFIG


def test_closing_the_dialog_under_a_run_of_another_pair_loads_the_windows_pair_again(qtbot, make_window, own_prompts):
    window = make_window(config=CONFIG)
    dialog = window.open_benchmark()
    dialog.config = dataclasses.replace(CONFIG, k=3)
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.max_tokens.setValue(8)
    dialog.progress.valueChanged.connect(lambda value: value > 0 and dialog.isVisible() and dialog.reject())
    with qtbot.waitSignal(window.controller.sig_loaded, timeout=RUN_TIMEOUT_MS + LOAD_TIMEOUT_MS):
        dialog.run()
    assert window.controller.loaded.config == CONFIG and window.chat_view.send_button.isEnabled()


def test_an_engine_process_killed_under_a_run_leaves_the_dialog_its_report_and_the_window(
    qtbot, make_window, own_prompts, tmp_path
):
    window = make_window(config=CONFIG, own_engine=True)
    dialog = window.open_benchmark()
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(8)
    first = run_and_wait(qtbot, dialog)
    assert first is not None, dialog.status.text()
    exported = dialog.export_json(tmp_path / "first.json")

    dialog.repeat.setValue(20)
    kill = lambda rows: (
        window.controller.process.running
        and os.kill(  # noqa: E731
            window.controller.process.pid, signal.SIGKILL
        )
    )
    dialog.sig_rows_shown.connect(kill)  # once the new run has drawn its first row
    with qtbot.waitSignal(dialog.sig_finished, timeout=RUN_TIMEOUT_MS) as blocker:
        dialog.run()
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)
    dialog.sig_rows_shown.disconnect(kill)

    assert blocker.args[0] is None
    status = dialog.status.text()
    assert "The engine process stopped: it was killed by signal 9 (SIGKILL)." in status, status
    assert "The results shown here are kept. Run starts the engine again." in status
    assert "color: #D55E00" in dialog.status.styleSheet()
    assert dialog.isVisible() and window.isVisible() and dialog.run_button.isEnabled()
    # What the new run measured stays on screen (its first row, its kind, all prompts); the first run's
    # report, which it replaced, is not offered for export under it.
    assert dialog.report is None and dialog.table.rowCount() == 3 and dialog.table.item(0, 0).text() == "echo"
    assert not dialog.export_button.isEnabled()
    assert json.loads(exported.read_text())["settings"]["repeat"] == 1  # and the export is untouched
    assert window.controller.loaded is None and not window.chat_view.send_button.isEnabled()

    dialog.repeat.setValue(1)
    again = run_and_wait(qtbot, dialog)  # Run starts the engine process again
    assert again is not None, dialog.status.text()
    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        dialog.reject()  # and the window loads its pair there
    assert window.controller.loaded.config == CONFIG and window.chat_view.send_button.isEnabled()


def test_a_dialog_with_no_window_runs_on_an_engine_process_of_its_own(qtbot, own_prompts):
    dialog = BenchDialog(config=CONFIG)
    qtbot.addWidget(dialog)
    dialog.prompts_edit.setText(str(own_prompts))
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(4)
    report = run_and_wait(qtbot, dialog)
    assert report is not None, dialog.status.text()
    assert [p.id for p in report.prompts] == ["echo", "story"]
    process = dialog._own_host.process
    assert process.running
    dialog.reject()
    assert not process.running  # stopped with the dialog
