"""The Load view and its dialog, on a hand-made LoadSweep and a fake engine controller: what a user sees
(points, the predicted curve, 1×, the break-even B drawn where it is, the sentences under the charts),
Run and Cancel while a sweep runs, and the exports. No engine process: these run in a second."""

from __future__ import annotations

import csv
import json
import math
import threading
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QObject, QPointF, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QMainWindow, QWidget

from app.bench.load_dialog import LoadDialog, LoadRequest
from app.bench.load_view import LoadView
from app.charts.panel import BREAK_EVEN
from app.runtime.engine_controller import CHAT, COMPARE, LOAD
from app.runtime.worker import GeneratorWorker, TaskRunner
from engine import BenchmarkCancelled, EngineConfig
from engine.bench.load_results import LoadSweep
from tests.app.bench.sample_load import BATCHES, SPEEDUPS, load_sweep, without_break_even
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG
WAIT_MS = 10_000


@pytest.fixture
def view(qtbot):
    v = LoadView()
    qtbot.addWidget(v)
    v.resize(1100, 600)
    v.show()
    qtbot.waitExposed(v)
    return v


def ticks(chart) -> list[tuple[float, str]]:
    return list(chart.plot.getAxis("bottom")._tickLevels[0])


def test_the_view_draws_each_modes_points_the_predicted_curve_and_the_break_even(view):
    view.show_sweep(load_sweep())

    chart = view.speedup
    assert set(chart.curves) == {"auto", "k=4"}
    for mode, curve in chart.curves.items():
        xs, ys = curve.getData()
        assert list(xs) == pytest.approx([math.log2(b) for b in BATCHES])  # B on a log-2 axis
        assert list(ys) == pytest.approx([SPEEDUPS[mode][b] for b in BATCHES])
    assert len(chart.predicted.getData()[0]) == 5  # a predicted point at every B
    assert [text for _, text in ticks(chart)] == ["1", "2", "4", "8", "16"]
    spacing = {round(b - a, 6) for (a, _), (b, _) in zip(ticks(chart), ticks(chart)[1:])}
    assert spacing == {1.0}  # each doubling one step along the axis
    assert chart.break_even_batch == 8
    # For the fixed k (the mode that can lose; automatic k stops drafting instead), and so labelled.
    assert chart.break_even.label.toPlainText() == "break-even B = 8 at k = 4"
    assert chart.plain.value() == 1.0
    legend = [label.text for _, label in chart.legend.items]
    assert legend == [
        "speculative, automatic k",
        "speculative, k = 4",
        "predicted, automatic k",
        "predicted, k = 4",
        "1× (plain decoding)",
    ]
    assert [v.toPlainText() for v in chart.values] == ["1.55×", "1.30×", "1.06×", "0.95×", "0.81×"]

    assert set(view.throughput.curves) == {"vanilla", "auto", "k=4"}
    _, plain = view.throughput.curves["vanilla"].getData()
    assert list(plain) == [20.0, 36.0, 62.0, 95.0, 120.0]
    for chart in (view.speedup, view.throughput):  # every axis says what it counts
        assert "batch size B" in chart.plot.getAxis("bottom").labelText
        assert chart.plot.getAxis("left").labelText

    assert view.failure.isVisible() and "Failure mode 2" in view.failure.text()
    assert view.caption.isVisible() and "break-even B" in view.caption.text()
    assert view.memory.isVisible()
    assert "With the draft model's cache, 6 sequences of 4,096 tokens fit in 16 GiB; without it, 9." in (
        view.memory.text()
    )
    assert not view.context_box.isVisible()  # one context length: nothing to choose


def test_the_break_even_line_is_drawn_at_b_8_in_the_picture(view, qtbot):
    view.show_sweep(load_sweep())
    chart = view.speedup
    box = chart.plot.getViewBox()
    picture = chart.grab().toImage()
    ratio = picture.devicePixelRatio()

    def colours_at(b: int, speedup: float) -> list[QColor]:
        """The pixels around where (B, speedup) is drawn, two either side (a thin line lands on a whole pixel)."""
        point = chart.mapFromScene(box.mapViewToScene(QPointF(math.log2(b), speedup)))
        x, y = round(point.x() * ratio), round(point.y() * ratio)
        return [picture.pixelColor(x + dx, y) for dx in range(-2, 3)]

    def near_break_even(b: int) -> bool:  # the dashed line: look along a stretch of it
        target = QColor(BREAK_EVEN)
        for y in [0.2 + 0.01 * i for i in range(40)]:
            for c in colours_at(b, y):
                if abs(c.red() - target.red()) + abs(c.green() - target.green()) + abs(c.blue() - target.blue()) < 60:
                    return True
        return False

    assert near_break_even(8)
    assert not near_break_even(4) and not near_break_even(16)


def test_the_memory_line_is_shown_only_with_a_draft_model(view):
    view.show_sweep(load_sweep(draft_model=False))
    assert not view.memory.isVisible() and view.memory.text() == ""
    assert view.failure.isVisible()
    view.show_sweep(load_sweep(draft_model=True))
    assert view.memory.isVisible()


def test_no_break_even_no_line(view):
    view.show_sweep(without_break_even(load_sweep()))
    assert view.speedup.break_even_batch is None
    assert not view.speedup.break_even.isVisible()


def test_several_context_lengths_are_chosen_one_at_a_time(view):
    view.show_sweep(load_sweep(contexts=(512, 4096)))
    assert view.context_box.isVisible() and view.context_box.count() == 2
    assert view.context == 512
    _, short = view.throughput.curves["vanilla"].getData()
    view.context_box.setCurrentIndex(1)
    _, long = view.throughput.curves["vanilla"].getData()
    assert view.context == 4096
    assert list(long) == pytest.approx([t / 2 for t in short])  # the sample's longer context runs at half speed
    assert view.speedup.break_even_batch == 16  # each context's own break-even (it moves with the context)
    view.context_box.setCurrentIndex(0)
    assert view.speedup.break_even_batch == 8


def test_exports_write_the_picture_the_points_and_the_sweep(view, tmp_path):
    sweep = load_sweep()
    view.show_sweep(sweep)
    view.export_png(tmp_path / "load.png")
    assert (tmp_path / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    view.export_csv(tmp_path / "load.csv")
    with open(tmp_path / "load.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(sweep.points) == 15
    auto_at_8 = next(r for r in rows if r["batch"] == "8" and r["mode"] == "auto")
    assert float(auto_at_8["speedup"]) == pytest.approx(0.99) and float(auto_at_8["predicted_speedup"]) == 0.97
    assert next(r for r in rows if r["mode"] == "vanilla")["speedup"] == ""
    view.export_json(tmp_path / "load.json")
    assert LoadSweep.from_dict(json.loads((tmp_path / "load.json").read_text())) == sweep


# -- the dialog, on a fake engine controller -------------------------------------------------------


class FakeClient:
    """The engine process's client, as far as the dialog uses it: a pair loaded, and a sweep that
    waits to be let go (EngineClient.load_sweep's signature)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[dict] = []
        self.held = None

    def loaded(self):
        return self.held

    def load(self, config, progress=None):
        self.held = SimpleNamespace(config=config)
        return self.held

    def load_sweep(self, prompts, settings, *, progress=None, cancel=None):
        assert prompts  # the shipped set
        self.calls.append(settings.to_dict())
        progress("B = 1: 3 of 15 points", 0.2)
        while not self.release.wait(0.01):
            if cancel.is_set():
                raise BenchmarkCancelled("cancelled")
        return load_sweep()


class FakeHost(QObject):
    """An engine controller that lends the fake client on a real worker thread."""

    sig_unloaded = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.client = FakeClient()
        self.runner = TaskRunner()

    def lend(self, name, config, job, connect, *, on_server=False) -> GeneratorWorker:
        assert name not in (LOAD, CHAT, COMPARE)  # the controller's own jobs: it would take the sweep for one
        assert on_server  # on the engine process, never in the window's
        worker = GeneratorWorker(lambda cancel, report: job(self.client, cancel, report), name)
        connect(worker)
        self.runner.start(worker)
        return worker

    def freed_by_job(self, config) -> None:
        pass


@pytest.fixture
def host():
    h = FakeHost()
    yield h
    h.client.release.set()
    h.runner.shutdown()


@pytest.fixture
def dialog(qtbot, host):
    d = LoadDialog(config=EngineConfig(), host=host)
    qtbot.addWidget(d)
    d.show()
    yield d
    d.close()


def test_run_is_disabled_while_a_sweep_runs_and_cancel_stops_it(qtbot, dialog, host):
    with qtbot.waitSignal(dialog.sig_finished, timeout=WAIT_MS) as blocker:
        dialog.run()
        assert dialog.running and not dialog.run_button.isEnabled() and dialog.cancel_button.isEnabled()
        assert not dialog.batches_edit.isEnabled()
        qtbot.waitUntil(lambda: dialog.progress.value() == 20, timeout=WAIT_MS)
        dialog.cancel()
    assert blocker.args == [None]
    qtbot.waitUntil(lambda: not dialog.running, timeout=WAIT_MS)
    assert dialog.run_button.isEnabled() and not dialog.cancel_button.isEnabled()
    assert "Cancelled" in dialog.status.text()
    assert dialog.view.sweep is None and not dialog.export_button.isEnabled()


def test_a_finished_sweep_is_drawn_and_exported(qtbot, dialog, host, tmp_path):
    dialog.batches_edit.setText("16, 1 2,4 8")
    dialog.k_mode.setCurrentIndex(1)  # automatic k only
    with qtbot.waitSignal(dialog.sig_finished, timeout=WAIT_MS) as blocker:
        dialog.run()
        host.client.release.set()
    assert isinstance(blocker.args[0], LoadSweep)
    assert host.client.calls == [
        {"batches": [1, 2, 4, 8, 16], "contexts": [], "k": 0, "auto": True, "max_tokens": 128, "requests": 0}
    ]
    assert host.client.held.config == dialog.config  # the engine held no pair: the dialog's was loaded first
    qtbot.waitUntil(lambda: not dialog.running, timeout=WAIT_MS)
    assert dialog.view.speedup.break_even_batch == 8
    assert "stops paying at B = 8" in dialog.status.text()
    assert dialog.export_button.isEnabled()
    for suffix in ("png", "csv", "json"):
        saved = dialog.export(suffix, tmp_path / f"load.{suffix}")
        assert saved is not None and (tmp_path / f"load.{suffix}").stat().st_size > 100


def test_a_bad_batch_size_is_reported_and_nothing_runs(dialog, host):
    dialog.batches_edit.setText("1, 2, eight")
    dialog.run()
    assert not dialog.running and host.client.calls == []
    assert "'eight' is not a whole number" in dialog.status.text()


def test_the_form_reads_fixed_k_and_context_lengths(dialog):
    dialog.contexts_edit.setText("4096, 512")
    dialog.k_mode.setCurrentIndex(2)  # fixed k only
    dialog.fixed_k.setValue(3)
    dialog.max_tokens.setValue(32)
    assert dialog.request() == LoadRequest((1, 2, 4, 8, 16), (512, 4096), auto=False, fixed_k=3, max_tokens=32)


def test_the_models_menu_opens_the_load_test(qtbot):
    from app.shell.actions import create_actions

    window = QMainWindow()
    window.setCentralWidget(QWidget())
    qtbot.addWidget(window)
    actions = create_actions(window, [])
    models = next(m for m in window.menuBar().actions() if m.text() == "&Models").menu()
    names = [a.text() for a in models.actions()]
    assert names.index("&Load test…") == names.index("&Benchmark…") + 1
    assert actions.load_test.text() == "&Load test…"


def test_the_form_travels_as_the_sweeps_own_settings():
    """The public API has no LoadSettings: the dialog sends its fields by name, which the server reads back."""
    from engine.bench.load_settings import LoadSettings

    request = LoadRequest((1, 4, 16), (512, 4096), auto=True, fixed_k=3, max_tokens=32)
    settings = LoadSettings.from_dict(request.to_dict())
    settings.check()
    assert (settings.batches, settings.contexts, settings.k, settings.max_tokens) == ((1, 4, 16), (512, 4096), 3, 32)
    assert settings.modes == ("vanilla", "k=3", "auto")
    assert LoadSettings.from_dict(LoadRequest((2,), auto=True, fixed_k=None).to_dict()).modes == ("vanilla", "auto")
