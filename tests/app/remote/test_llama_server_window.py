"""The window on a real llama-server (built from source, on the embedded model, loopback ports): the
pair dialog's test, the controller's adapter path, and what the window and the charts say a server
cannot feed them. Without a llama-server binary these tests fail and say how to build one."""

from __future__ import annotations

import pytest

from app.pair.dialog import PairDialog
from app.runtime.engine_controller import EngineController
from app.runtime.remote import ServerPair
from app.shell import settings as keys
from app.shell.main_window import MainWindow
from app.shell.settings import EngineChoice
from engine import Comparison, EngineProcess, SamplingConfig, Source
from tests.app.conftest import FAST_CONFIG, LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, STRICT_QT_LOG, send_and_wait

pytestmark = STRICT_QT_LOG
COPY = [
    {
        "role": "user",
        "content": "Repeat this list exactly, twice: apple, banana, cherry, date, elderberry, "
        "fig, grape, honeydew, kiwi, lemon, mango, nectarine, papaya.",
    }
]


@pytest.fixture
def choice(llama_servers) -> EngineChoice:
    speculative, vanilla = llama_servers
    return EngineChoice("llama-server", speculative.url, "", vanilla.url)


@pytest.fixture
def controller(qtbot, choice):
    controller = EngineController(process=EngineProcess())  # never started: the server decodes
    with qtbot.waitSignal(controller.sig_loaded, timeout=LOAD_TIMEOUT_MS) as loaded:
        controller.load(FAST_CONFIG, choice)
    assert loaded.args == [None]  # no EngineConfig: the server chose its own pair
    yield controller
    assert controller.process.pid is None
    controller.shutdown()


def test_the_dialog_tests_llama_server_and_allows_load_for_that_url_only(qtbot, tmp_path, choice):
    from PySide6.QtCore import QSettings

    dialog = PairDialog(settings=QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    qtbot.addWidget(dialog)
    row = dialog.engine_row
    row.kind.setCurrentIndex(row.kind.findData("llama-server"))
    row.url.setText(choice.url)
    row.vanilla_url.setText(choice.vanilla_url)
    with qtbot.waitSignal(row.sig_tested, timeout=30_000) as tested:
        row.test_button.click()
    assert tested.args == [True] and dialog.load_button.isEnabled()
    status = row.status.text()
    assert f"on llama-server at {choice.url}" in status and "speculative decoding" in status
    assert f"vanilla runs on {choice.vanilla_url}" in status and "p and q are not shown" in status
    assert not dialog.form.models_box.isEnabled()
    row.url.setText(choice.vanilla_url)  # another server: untested
    assert not dialog.load_button.isEnabled()


def test_a_reply_on_llama_server_comes_step_by_step_without_costs_or_drafter_statistics(qtbot, controller, choice):
    pair = controller.loaded
    assert isinstance(pair, ServerPair) and pair.speculative and pair.n_ctx == 2048
    assert pair.config is None and pair.costs is None and "p and q are not shown" in pair.notes[0]
    steps = []
    controller.sig_steps.connect(steps.extend)

    with qtbot.waitSignal(controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        controller.chat(COPY, SamplingConfig(max_tokens=48))

    result = finished.args[1]
    assert result is not None and "apple, banana" in result.text
    assert steps == list(result.events)
    assert {(step.run, step.drafter_stats, step.costs) for step in steps} == {("speculative", None, None)}
    assert result.stats.drafted > 0 and Source.ACCEPTED in {info.source for info in result.token_infos}


def test_a_comparison_runs_vanilla_on_the_second_server(qtbot, controller):
    with qtbot.waitSignal(controller.sig_run_finished, timeout=2 * REPLY_TIMEOUT_MS) as finished:
        controller.compare(COPY, SamplingConfig(max_tokens=32))
    comparison = finished.args[1]
    assert isinstance(comparison, Comparison)
    assert comparison.vanilla.stats.drafted == 0 and comparison.speculative.stats.drafted > 0


def test_the_window_shows_the_servers_pair_and_the_charts_what_it_cannot_feed(qtbot, choice, data_dir):
    keys.set_engine_choice(choice)
    window = MainWindow(engine_process=EngineProcess())
    qtbot.addWidget(window)
    window.sampling = SamplingConfig(max_tokens=24)
    window.show()
    with qtbot.waitSignal(window.controller.sig_loaded, timeout=LOAD_TIMEOUT_MS):
        window.start()
    pair = window.controller.loaded
    assert window.engine_label.text() == pair.describe() and "llama-server" in pair.describe()
    assert window.charts.notes.isVisibleTo(window.charts)
    assert window.charts.notes.text().splitlines() == list(pair.notes)

    result = send_and_wait(qtbot, window, "Say hello.")
    assert result is not None and result.text
    window.charts.redraw()
    summary = window.charts.summary.text()
    assert "tokens/s" in summary and pair.notes[0] not in summary  # said once, under the summary

    dialog = window.open_benchmark()
    dialog.run_button.click()
    qtbot.waitUntil(lambda: "runs on a local engine or a SpecDeck server" in dialog.status.text(), timeout=5_000)
    assert window.controller.process.pid is None
