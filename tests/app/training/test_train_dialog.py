"""TrainDialog trains heads in the engine process with live progress; the heads then appear in the pair
dialog; per-head charts; the window's pair is freed for the training and loads again after; an engine
process killed under a run leaves its checkpoint to resume."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QSettings

from app.charts.live import LiveCharts
from app.pair.dialog import PairDialog
from app.runtime.engine_controller import EngineController
from app.training.dialog import TrainDialog
from app.training.form import command_line
from engine import EngineConfig
from engine.core.events import RunStats, Source, StepEvent, TokenInfo
from engine.training import checkpoint_info
from tests.app.charts.test_charts import SPEC_STEPS, make_run
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, STRICT_QT_LOG, unloaded

pytestmark = STRICT_QT_LOG

TRAIN_TIMEOUT_MS = 120_000  # seconds on an idle machine; a shared CI machine is slower
TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat. " * 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from tests.factories.hf_models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", seed=0)


@pytest.fixture
def text_file(tmp_path) -> str:
    path = tmp_path / "fox.txt"
    path.write_text(TEXT, encoding="utf-8")
    return str(path)


@pytest.fixture
def host(engine_process):
    """An engine controller on the session's engine process, as a window's (with no pair loaded)."""
    controller = EngineController(process=unloaded(engine_process))
    yield controller
    controller.shutdown()  # never leave a training thread behind a test: waits for it


def set_up(d: TrainDialog, text_file: str, out_dir: Path) -> TrainDialog:
    d.form.data_kind.setCurrentIndex(d.form.data_kind.findData("file"))
    d.form.data_path.setText(text_file)
    d.form.num_heads.setValue(3)
    d.form.steps.setValue(3)
    d.form.batch_size.setValue(2)
    d.form.seq_len.setValue(32)
    d.form.out_dir.setText(str(out_dir))
    return d


@pytest.fixture
def dialog(qtbot, host, tiny, text_file, tmp_path):
    d = set_up(TrainDialog(settings=QSettings(), target=tiny, host=host), text_file, tmp_path / "heads")
    qtbot.addWidget(d)
    d.show()
    yield d
    d.shutdown()  # cancels a run still going; the host's shutdown waits for it


def run_to_end(qtbot, dialog):
    with qtbot.waitSignal(dialog.sig_finished, timeout=TRAIN_TIMEOUT_MS) as blocker:
        dialog.start()
    qtbot.waitUntil(lambda: not dialog.running, timeout=10_000)
    return blocker.args[0]


def at_first_step(dialog, action) -> None:
    """`action()` once the dialog shows the first training step (the user's moment to press Cancel)."""
    done = []

    def shown(value: int) -> None:
        if value >= 1 and dialog.charts.steps == [] and not done:
            done.append(value)
            action()

    dialog.progress.valueChanged.connect(shown)


def test_training_shows_progress_and_chart_points_and_the_heads_join_the_pair_dialog(qtbot, dialog, tiny, tmp_path):
    result = run_to_end(qtbot, dialog)
    assert result is not None and not result.cancelled and result.step == 3
    assert (dialog.progress.value(), dialog.progress.maximum()) == (3, 3)
    assert dialog.charts.steps == [1, 2, 3] and len(dialog.charts.losses) == 3
    dialog.charts.redraw()
    assert len(dialog.charts.loss_curve.yData) == 3
    assert [len(c.yData) for c in dialog.charts.accuracy_curves] == [3, 3, 3]  # one curve per head
    assert dialog.status.text().startswith("Done: 3 steps") and "head 3" in dialog.status.text()
    assert dialog.use_button.isEnabled() and dialog.start_button.isEnabled()
    out = str(tmp_path / "heads")

    pair = PairDialog(settings=QSettings())
    qtbot.addWidget(pair)
    combo = pair.form.drafter
    medusa = combo.findData("medusa")
    assert medusa >= 0 and combo.model().item(medusa).isEnabled()
    heads = pair.form.field("medusa", "heads")
    assert out in heads.choices() and heads.folder() == out
    pair.set_config(EngineConfig(target=tiny).with_drafter("medusa", heads=out))
    assert heads.isEnabled() and not pair.form.field("model", "draft").isEnabled()
    with qtbot.waitSignal(pair.sig_check_finished, timeout=20_000) as check:
        pair.check()
    assert check.args[0] is True, pair.findings.toPlainText()
    assert "3 heads" in pair.findings.toPlainText()
    config = pair.engine_config()
    assert (config.drafter, config.options.heads) == ("medusa", out)


def test_cancel_saves_a_checkpoint_and_start_offers_to_resume(qtbot, dialog, tmp_path):
    dialog.form.steps.setValue(40)

    at_first_step(dialog, dialog.cancel_training)
    with qtbot.waitSignal(dialog.sig_finished, timeout=TRAIN_TIMEOUT_MS) as blocker:
        dialog.start()
    qtbot.waitUntil(lambda: not dialog.running, timeout=10_000)
    cut = blocker.args[0]
    assert cut.cancelled and 1 <= cut.step < 40
    assert "press Start to resume" in dialog.status.text()
    assert checkpoint_info(tmp_path / "heads").step == cut.step

    asked = []
    dialog.ask_resume = lambda saved: asked.append(saved.step)  # None: the user cancelled
    dialog.start()  # the folder is read on the engine process, off the GUI thread
    assert dialog.running and not dialog.start_button.isEnabled()
    qtbot.waitUntil(lambda: bool(asked) and not dialog.running, timeout=LOAD_TIMEOUT_MS)
    assert asked == [cut.step] and dialog.start_button.isEnabled()
    assert "press Start to resume" in dialog.status.text()  # nothing started: the last word stays

    dialog.form.steps.setValue(cut.step + 2)  # only steps may change when resuming
    dialog.ask_resume = lambda saved: "resume"
    result = run_to_end(qtbot, dialog)
    assert result.step == cut.step + 2 and not result.cancelled
    assert dialog.charts.steps == list(range(1, cut.step + 3))  # the earlier curve is drawn too


def test_closing_while_training_stops_saves_and_closes(qtbot, dialog, tmp_path):
    dialog.form.steps.setValue(40)

    at_first_step(dialog, dialog.close)
    with qtbot.waitSignal(dialog.sig_finished, timeout=TRAIN_TIMEOUT_MS):
        dialog.start()
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=10_000)
    assert checkpoint_info(tmp_path / "heads") is not None


def test_missing_data_is_reported_in_the_dialog(qtbot, dialog):
    dialog.form.data_path.setText("")
    dialog.start()
    assert not dialog.running and "Choose the file" in dialog.status.text()


def test_medusa_on_llama_cpp_says_it_needs_pytorch(qtbot):
    pair = PairDialog(settings=QSettings())
    qtbot.addWidget(pair)
    pair.set_config(EngineConfig(target="default", drafter="medusa", backend="llama.cpp"))
    with qtbot.waitSignal(pair.sig_check_finished, timeout=20_000) as check:
        pair.check()
    assert check.args[0] is False
    assert "Medusa needs the PyTorch backend" in pair.findings.toPlainText()


def test_medusa_with_backend_auto_says_the_gguf_target_runs_on_pytorch(qtbot):
    pair = PairDialog(settings=QSettings())
    qtbot.addWidget(pair)
    pair.set_config(EngineConfig(target="default", drafter="medusa", backend="auto"))
    with qtbot.waitSignal(pair.sig_check_finished, timeout=20_000):
        pair.check()
    text = pair.findings.toPlainText()
    assert "The target runs on PyTorch" in text and "Medusa needs the PyTorch backend" not in text


def depth_event(tested, accepted) -> StepEvent:
    stats = RunStats(
        steps=1, tokens=2, drafted=5, accepted=1, tested=2, wall_s=0.1, depth_tested=tested, depth_accepted=accepted
    )
    tokens = (TokenInfo(5, "a", Source.ACCEPTED, 0.5, None), TokenInfo(6, "b", Source.RESAMPLED, 0.4, None))
    return StepEvent(0, tokens, "ab", 5, 5, 1, 0.01, 0.05, 0.0, stats)


def test_per_head_acceptance_bars_from_run_stats(qtbot, tmp_path):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.set_depth_label("head")
    charts.add_step("speculative", depth_event((10, 6, 3), (6, 3, 1)))
    charts.redraw()
    bars = charts.depth.bars.opts
    assert list(bars["x"]) == [1, 2, 3]
    assert np.allclose(bars["height"], [0.6, 0.5, 1 / 3])
    assert charts.depth.tick_labels(3) == ["head 1", "head 2", "head 3"]
    assert [c.toPlainText() for c in charts.depth.counts] == ["6/10", "3/6", "1/3"]
    assert "per head" in charts.depth.plot.titleLabel.text
    charts.export_json(tmp_path / "charts.json")
    exported = json.loads((tmp_path / "charts.json").read_text())["depth_acceptance"]
    assert exported == {"label": "head", "depth": [1, 2, 3], "tested": [10, 6, 3], "accepted": [6, 3, 1]}


def test_chain_drafters_get_per_position_bars_from_their_steps(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    for event in make_run(SPEC_STEPS[:8]):  # (k, drafted, accepted) triples, no depth counts
        charts.add_step("speculative", event)
    charts.redraw()
    depth = charts.series()["depth"]
    # Position 1 is tested by every step that drafted (7 of 8), accepted when one was.
    assert depth["tested"][0] == 7 and depth["accepted"][0] == 6
    drafted = [d for _, d, _ in SPEC_STEPS[:8]]
    took = [a for _, _, a in SPEC_STEPS[:8]]
    expected = [sum(d >= j and a >= j - 1 for d, a in zip(drafted, took)) for j in range(1, 5)]
    assert list(depth["tested"]) == expected
    assert charts.depth.tick_labels(4)[0] == "position 1"


def test_the_main_window_has_a_train_heads_action(make_window):
    window = make_window(load=False)
    assert window.actions.train_heads.text() == "&Train heads…"
    window.actions.train_heads.trigger()
    assert window.train_dialog.isVisible()
    window.train_dialog.close()


def test_training_in_the_window_frees_its_pair_loads_it_again_after_and_the_heads_go_to_the_pair_dialog(
    qtbot, make_window, tiny, text_file, tmp_path
):
    window = make_window(config=FAST_CONFIG)
    dialog = window.open_training()
    dialog.form.target.set_spec(tiny)
    set_up(dialog, text_file, tmp_path / "heads")
    seen_while_training = []
    dialog.progress.valueChanged.connect(
        lambda value: (
            value > 0
            and seen_while_training.append((window.chat_view.composer.placeholderText(), window.engine_label.text()))
        )
    )

    results = []
    dialog.sig_finished.connect(results.append)
    with qtbot.waitSignals(
        [dialog.sig_finished, window.controller.sig_loaded], timeout=TRAIN_TIMEOUT_MS, order="strict"
    ):
        dialog.start()
    result = results[0]
    assert result is not None and result.step == 3, dialog.status.text()
    # Training loads its own target: the window's pair was freed for it, said so, and loaded again after.
    assert seen_while_training and all(
        text == ("The models are freed while training runs.", "No model loaded") for text in seen_while_training
    )
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)
    assert window.controller.loaded.config == FAST_CONFIG and window.chat_view.send_button.isEnabled()
    assert window.controller.client.loaded().config == FAST_CONFIG

    dialog.use_button.click()  # "Use in model pair…"
    pair = window.pair_dialog
    assert pair is not None and pair.isVisible()
    config = pair.engine_config()
    assert (config.target, config.backend, config.drafter) == (tiny, "auto", "medusa")  # auto: PyTorch for it
    assert config.options.heads == str(tmp_path / "heads")
    pair.reject()
    dialog.close()


def test_an_engine_process_killed_under_a_training_keeps_its_checkpoint_and_start_resumes_it(
    qtbot, tiny, text_file, tmp_path
):
    host = EngineController()  # an engine process of its own: this test kills it
    dialog = set_up(TrainDialog(settings=QSettings(), target=tiny, host=host), text_file, tmp_path / "heads")
    qtbot.addWidget(dialog)
    dialog.form.steps.setValue(40)
    form_options = dialog.form.options
    dialog.form.options = lambda: {**form_options(), "checkpoint_every": 2}
    dialog.show()
    kill = lambda value: value >= 3 and host.process.running and os.kill(host.process.pid, signal.SIGKILL)  # noqa: E731
    dialog.progress.valueChanged.connect(kill)  # after the checkpoint at step 2
    try:
        with qtbot.waitSignal(dialog.sig_finished, timeout=TRAIN_TIMEOUT_MS) as blocker:
            dialog.start()
        qtbot.waitUntil(lambda: not dialog.running, timeout=10_000)
        dialog.progress.valueChanged.disconnect(kill)

        assert blocker.args[0] is None
        status, out = dialog.status.text(), str(tmp_path / "heads")
        assert "The engine process stopped: it was killed by signal 9 (SIGKILL)." in status, status
        assert f"The run's checkpoint (step 2 or later) is kept in {out}: Start resumes it." in status
        assert "color: #D55E00" in dialog.status.styleSheet()
        assert dialog.isVisible() and dialog.start_button.isEnabled()
        saved = checkpoint_info(out)
        assert saved is not None and saved.step >= 2  # nothing lost

        asked = []
        dialog.ask_resume = lambda found: asked.append(found.step) or "resume"
        dialog.form.steps.setValue(saved.step + 1)
        result = run_to_end(qtbot, dialog)  # Start starts the engine process again and resumes
        assert asked == [saved.step]
        assert result is not None and result.step == saved.step + 1 and not result.cancelled, dialog.status.text()
        assert dialog.charts.steps[0] == 1 and dialog.charts.steps[-1] == saved.step + 1  # the earlier curve too
    finally:
        dialog.shutdown()
        host.shutdown()


# -- EAGLE ----------------------------------------------------------------------------------


def test_choosing_eagle_disables_medusas_sizes_and_shows_the_draft_vocabulary(dialog, tmp_path):
    form = dialog.form
    assert not form.draft_vocab.isVisibleTo(dialog) and form.num_heads.isEnabled()
    dialog.form.out_dir.setText("")  # back to the default folder, which follows the kind
    form.set_kind("eagle")
    assert not form.num_heads.isEnabled() and not form.num_layers.isEnabled()
    assert form.draft_vocab.isVisibleTo(dialog) and form.draft_vocab.value() == 8192
    assert form.objective.currentData() == "features" and not form.objective.isEnabled()
    assert dialog.windowTitle() == "Train an EAGLE head"
    assert Path(form.out_dir.text()).name.startswith("eagle-tiny-llama")
    options = form.options()
    assert (options["kind"], options["draft_vocab"]) == ("eagle", 8192) and "num_heads" not in options
    command = command_line(options)
    assert "--kind eagle --target" in command and "--draft-vocab 8192" in command and "--heads" not in command
    form.draft_vocab.setValue(0)
    assert form.draft_vocab.text() == "all" and form.options()["draft_vocab"] == 0
    form.set_kind("medusa")
    assert form.num_heads.isEnabled() and not form.draft_vocab.isVisibleTo(dialog)
    assert "--kind medusa" in command_line(form.options()) and "--heads 3" in command_line(form.options())


def test_eagle3_is_offered_with_the_draft_vocabulary_and_its_own_folder(dialog):
    form = dialog.form
    dialog.form.out_dir.setText("")
    form.set_kind("eagle3")
    assert form.heads_kind() == "eagle3" and dialog.windowTitle() == "Train an EAGLE-3 head"
    assert not form.num_heads.isEnabled() and form.draft_vocab.isVisibleTo(dialog)
    assert Path(form.out_dir.text()).name.startswith("eagle3-tiny-llama")
    options = form.options()
    assert (options["kind"], options["draft_vocab"]) == ("eagle3", 8192) and "num_heads" not in options
    assert "--kind eagle3 --target" in command_line(options) and "--draft-vocab 8192" in command_line(options)


def test_an_eagle_run_charts_its_depths_and_joins_the_pair_dialog(qtbot, dialog, tiny, tmp_path):
    dialog.form.set_kind("eagle")
    dialog.form.steps.setValue(2)
    result = run_to_end(qtbot, dialog)
    assert result is not None and not result.cancelled and result.step == 2, dialog.status.text()
    dialog.charts.redraw()
    assert dialog.charts.series_names() == ["depth 1", "depth 2"]
    assert [len(c.yData) for c in dialog.charts.accuracy_curves] == [2, 2]
    assert "depth 2" in dialog.status.text() and "EAGLE head" in dialog.status.text()
    out = str(tmp_path / "heads")
    assert "--kind eagle" in json.loads((Path(out) / "config.json").read_text())["specdeck"]["training"]["command"]

    pair = PairDialog(settings=QSettings())
    qtbot.addWidget(pair)
    eagle_heads, medusa_heads = pair.form.field("eagle", "heads"), pair.form.field("medusa", "heads")
    assert out in eagle_heads.choices() and out not in medusa_heads.choices()
    pair.set_config(EngineConfig(target=tiny).with_drafter("eagle", heads=out))
    with qtbot.waitSignal(pair.sig_check_finished, timeout=20_000) as check:
        pair.check()
    assert check.args[0] is True, pair.findings.toPlainText()
    assert "The EAGLE head fits the target" in pair.findings.toPlainText()
    config = pair.engine_config()
    assert (config.drafter, config.options.heads) == ("eagle", out)

    # Resuming this run as Medusa heads: the engine refuses, the dialog says why, the run is kept.
    saved = checkpoint_info(out)
    dialog.form.set_kind("medusa")
    dialog.ask_resume = lambda saved: "resume"
    with qtbot.waitSignal(dialog.sig_finished, timeout=TRAIN_TIMEOUT_MS) as blocker:
        dialog.start()
    qtbot.waitUntil(lambda: not dialog.running, timeout=10_000)
    assert blocker.args[0] is None
    assert "made with other settings" in dialog.status.text() and "kind 'eagle' -> 'medusa'" in dialog.status.text()
    assert "color: #D55E00" in dialog.status.styleSheet()
    assert checkpoint_info(out) == saved
