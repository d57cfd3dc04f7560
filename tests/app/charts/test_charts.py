"""LiveCharts: steps go into ring buffers, a timer draws them, the theory panel is right, exports hold the run."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import replace

import numpy as np
import pytest
from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QImage

from app.charts.data import COLUMNS, StepBuffer, accepted_histogram, rolling_rate
from app.charts.live import LiveCharts, RedrawPace
from engine.core.draft_length import CostModel, DraftLength, break_even_acceptance, expected_tokens
from engine.core.events import RunStats, Source, StepEvent, TokenInfo
from tests.app.conftest import STRICT_QT_LOG

# Verifying k + 1 tokens costs barely more than one: drafting pays from a low acceptance.
CHEAP = CostModel(verify_s={1: 0.010, 2: 0.0102, 4: 0.0105, 8: 0.011, 16: 0.013, 33: 0.02}, draft_s_per_token=0.0005)
# Verifying n tokens costs n plain steps (compute-bound): no acceptance rate pays.
LINEAR = CostModel(verify_s={n: 0.01 * n for n in (1, 2, 4, 8, 16, 33)}, draft_s_per_token=0.0005)

pytestmark = STRICT_QT_LOG  # Qt warnings fail a test; tests/app/conftest.py keeps settings out of the user's


@pytest.fixture
def charts(qtbot):
    widget = LiveCharts()
    qtbot.addWidget(widget)
    widget.resize(1000, 700)
    # Redraws at the fastest pace: on a slow machine a first redraw's cost over the budget
    # set the next one seconds away, past what these tests wait (test_redraw_pace.py tests the pace).
    widget.pace = RedrawPace(budget=1.0)
    return widget


def make_run(steps, verify_s=0.02, draft_s=0.002, other_s=0.001, predicted=1.5) -> list[StepEvent]:
    """StepEvents for (k, drafted, accepted) triples, with running totals kept the way the engine keeps them."""
    events, t = [], dict(tokens=0, drafted=0, accepted=0, tested=0, wall=0.0, draft=0.0, verify=0.0, other=0.0)
    for i, (k, drafted, accepted) in enumerate(steps):
        n = accepted + 1  # accepted drafts, then one token from the target (resampled or bonus or plain)
        last_source = Source.PLAIN if drafted == 0 else (Source.BONUS if accepted == drafted else Source.RESAMPLED)
        tokens = tuple(TokenInfo(100 + j, "x", Source.ACCEPTED, 0.5, 0.6) for j in range(accepted))
        tokens += (TokenInfo(7, "y", last_source, 0.4, None),)
        step_draft = draft_s * drafted
        t["tokens"] += n
        t["drafted"] += drafted
        t["accepted"] += accepted
        t["tested"] += accepted + (1 if accepted < drafted else 0)  # accepted + one per rejection
        t["draft"] += step_draft
        t["verify"] += verify_s
        t["other"] += other_s
        t["wall"] += step_draft + verify_s + other_s
        stats = RunStats(
            steps=i + 1,
            tokens=t["tokens"],
            drafted=t["drafted"],
            accepted=t["accepted"],
            tested=t["tested"],
            wall_s=t["wall"],
            draft_s=t["draft"],
            verify_s=t["verify"],
            other_s=t["other"],
            predicted_speedup=predicted,
            k=k,
        )
        finish = "length" if i == len(steps) - 1 else None
        events.append(StepEvent(i, tokens, "x" * n, k, drafted, accepted, step_draft, verify_s, other_s, stats, finish))
    return events


SPEC_STEPS = [(4, 4, 4), (4, 4, 2), (4, 4, 0), (4, 4, 3), (2, 2, 2), (0, 0, 0), (4, 3, 1), (4, 4, 4)] * 5
PLAIN_STEPS = [(0, 0, 0)] * 40


def drawn(curve) -> tuple[np.ndarray, np.ndarray]:
    """The data a PlotDataItem holds (before its clip-to-view and downsampling)."""
    x, y = curve.xData, curve.yData
    return (np.zeros(0) if x is None else x), (np.zeros(0) if y is None else y)


def feed(charts, label, events):
    for event in events:
        charts.add_step(label, event)


def test_steps_are_buffered_at_once_and_drawn_only_by_the_timer(charts, qtbot):
    redraws = []
    charts.sig_redrawn.connect(lambda: redraws.append(1))
    events = make_run(SPEC_STEPS)
    feed(charts, "speculative", events)

    x, y = charts.series()["throughput"]["speculative"]
    assert len(x) == len(events)
    assert not len(drawn(charts.throughput.curves["speculative"])[0]), "add_step drew: decoding would wait for it"

    with qtbot.waitSignal(charts.sig_redrawn, timeout=2000):
        pass
    drawn_x, drawn_y = drawn(charts.throughput.curves["speculative"])
    np.testing.assert_allclose(drawn_x, x)
    np.testing.assert_allclose(drawn_y, y)
    assert len(redraws) == 1, "40 steps in one burst must cost one redraw, not one each"


def test_hidden_charts_draw_nothing_and_catch_up_when_shown_again(qtbot):
    """Closing the charts' dock frees what drawing costs the engine; reopening it shows the whole run."""
    from PySide6.QtWidgets import QVBoxLayout, QWidget

    window = QWidget()
    qtbot.addWidget(window)
    QVBoxLayout(window).addWidget(charts := LiveCharts())
    window.resize(1000, 700)
    window.show()
    qtbot.waitExposed(window)
    charts.hide()
    events = make_run(SPEC_STEPS)
    with qtbot.assertNotEmitted(charts.sig_redrawn, wait=400):
        feed(charts, "speculative", events)  # the last one ends the run, which a shown chart draws at once
    assert not len(drawn(charts.throughput.curves["speculative"])[0])

    with qtbot.waitSignal(charts.sig_redrawn, timeout=2000):
        charts.show()
    np.testing.assert_allclose(
        drawn(charts.throughput.curves["speculative"])[0], charts.series()["throughput"]["speculative"][0]
    )
    assert len(drawn(charts.acceptance.curve)[0]) == len(events)


def test_more_steps_grow_the_series_and_the_drawn_curves(charts, qtbot):
    events = make_run(SPEC_STEPS)
    feed(charts, "speculative", events[:10])
    assert len(charts.series()["acceptance"]["speculative"][0]) == 10
    feed(charts, "speculative", events[10:])
    assert len(charts.series()["acceptance"]["speculative"][0]) == len(events)
    qtbot.waitUntil(lambda: len(drawn(charts.acceptance.curve)[0]) == len(events), timeout=2000)
    qtbot.waitUntil(lambda: len(drawn(charts.draft_length.asked)[0]) == len(events), timeout=2000)


def test_vanilla_run_gets_its_own_throughput_curve_and_time_bar(charts, qtbot):
    feed(charts, "vanilla", make_run(PLAIN_STEPS))
    feed(charts, "speculative", make_run(SPEC_STEPS))
    with qtbot.waitSignal(charts.sig_redrawn, timeout=2000):
        pass
    series = charts.series()
    assert set(series["throughput"]) == {"speculative", "vanilla"}
    assert "vanilla" not in series["acceptance"]  # nothing was drafted: no acceptance to draw
    assert len(drawn(charts.throughput.curves["vanilla"])[0]) == len(PLAIN_STEPS)
    assert series["time_split"]["vanilla"]["draft"] == 0.0
    widths = charts.time_split.bars["verify"].opts["width"]
    assert len(widths) == 2 and all(w > 0 for w in widths)
    assert "speedup" in charts.summary.text() and "measured" in charts.summary.text()


def test_a_runs_time_bar_ends_at_its_decoding_time(charts, qtbot):
    """The side by side's verdict gives the decoding time (wall_s): the bar adds up to it, the time
    between steps counted as "other", not left out."""
    events = make_run(SPEC_STEPS)
    last = events[-1]
    gap = replace(last.stats, wall_s=last.stats.wall_s + 0.5)  # half a second the steps' parts do not cover
    feed(charts, "speculative", events[:-1] + [replace(last, stats=gap)])
    parts = charts.series()["time_split"]["speculative"]
    assert sum(parts.values()) == pytest.approx(gap.wall_s)


def test_rolling_acceptance_follows_the_last_steps():
    accepted = np.cumsum([4, 4, 0, 0])
    tested = np.cumsum([4, 4, 1, 1])
    rate = rolling_rate(accepted.astype(float), tested.astype(float), window=2)
    np.testing.assert_allclose(rate, [1.0, 1.0, 4 / 5, 0.0])


def test_rolling_rate_is_a_gap_where_nothing_was_tested():
    rate = rolling_rate(np.zeros(3), np.zeros(3), window=2)
    assert np.isnan(rate).all()


def test_histogram_measures_shares_and_the_geometric_prediction_sums_to_one():
    accepted = np.array([4, 2, 0, 3, 4, 0])
    drafted = np.array([4, 4, 4, 4, 4, 0])  # the last step drafted nothing and is left out
    h = accepted_histogram(accepted, drafted, a=0.6)
    assert h["steps"] == 5
    np.testing.assert_allclose(h["measured"], [1 / 5, 0, 1 / 5, 1 / 5, 2 / 5])
    assert h["predicted"].sum() == pytest.approx(1.0)
    assert h["predicted"][0] == pytest.approx(0.4)  # first draft rejected: 1 - a
    # The model's expected accepted count plus the target's token is the article's E[tokens/step].
    assert (h["bins"] * h["predicted"]).sum() + 1 == pytest.approx(expected_tokens(0.6, 4))


def test_theory_plot_draws_the_break_even_line_for_cheap_verification(charts, qtbot):
    charts.set_cost_model(CHEAP)
    feed(charts, "speculative", make_run(SPEC_STEPS))
    with qtbot.waitSignal(charts.sig_redrawn, timeout=2000):
        pass
    theory = charts.series()["theory"]
    assert theory["k"] == 4  # the last step that drafted asked for 4
    expected = break_even_acceptance(CHEAP, 4)
    assert expected is not None and 0.0 < expected < 0.5
    assert charts.theory.break_even.isVisible()
    assert charts.theory.break_even.value() == pytest.approx(expected)
    assert charts.theory.note == ""
    a, tokens = drawn(charts.theory.expected)
    np.testing.assert_allclose(tokens, [expected_tokens(x, 4) for x in a])
    measured_a, measured_tokens = charts.theory.measured.getData()
    assert measured_a[0] == pytest.approx(make_run(SPEC_STEPS)[-1].stats.acceptance_rate)
    assert measured_tokens[0] > 1.0


def test_theory_plot_says_there_is_no_break_even_when_verification_is_linear(charts, qtbot):
    assert break_even_acceptance(LINEAR, 4) is None
    charts.set_cost_model(LINEAR)
    feed(charts, "speculative", make_run(SPEC_STEPS))
    with qtbot.waitSignal(charts.sig_redrawn, timeout=2000):
        pass
    assert not charts.theory.break_even.isVisible()
    assert "no break-even" in charts.theory.note
    legend_texts = [label.text for _, label in charts.theory.legend.items]
    assert any(charts.theory.note in text for text in legend_texts)
    assert "No break-even at k = 4" in charts.summary.text()
    _, speedup = drawn(charts.theory.speedup)
    assert speedup.max() <= 1.0


def test_theory_plot_before_any_cost_model_draws_no_speedup_curve(charts, qtbot):
    feed(charts, "speculative", make_run(SPEC_STEPS[:3]))
    with qtbot.waitSignal(charts.sig_redrawn, timeout=2000):
        pass
    assert charts.series()["theory"]["speedup"] is None
    assert not len(drawn(charts.theory.speedup)[0])
    assert "no cost model" in charts.theory.note


def test_cost_model_is_read_as_a_snapshot(charts):
    costs = CostModel(verify_s=dict(CHEAP.verify_s), draft_s_per_token=0.0005)
    charts.set_cost_model(costs)
    before = charts.series()["theory"]["break_even"]
    costs.verify_s.update(LINEAR.verify_s)  # the decoding thread learns new costs
    assert charts.series()["theory"]["break_even"] is None != before


def test_exports_write_the_run(charts, tmp_path, qtbot):
    charts.set_cost_model(CHEAP)
    spec, vanilla = make_run(SPEC_STEPS), make_run(PLAIN_STEPS)
    feed(charts, "vanilla", vanilla)
    feed(charts, "speculative", spec)

    charts.export_png(tmp_path / "charts.png")
    assert (tmp_path / "charts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = QImage(str(tmp_path / "charts.png"))
    assert not image.isNull() and image.width() >= 900

    charts.export_csv(tmp_path / "steps.csv")
    with open(tmp_path / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["run", *COLUMNS]
    assert [r["run"] for r in rows].count("speculative") == len(spec)
    assert [r["run"] for r in rows].count("vanilla") == len(vanilla)
    first = next(r for r in rows if r["run"] == "speculative")
    assert (int(first["k"]), int(first["drafted"]), int(first["accepted"]), int(first["tokens"])) == (4, 4, 4, 5)

    charts.export_json(tmp_path / "run.json")
    document = json.loads((tmp_path / "run.json").read_text())
    assert document["runs"]["speculative"]["stats"] == spec[-1].stats.as_dict()
    assert document["runs"]["vanilla"]["stats"] == vanilla[-1].stats.as_dict()
    assert document["runs"]["speculative"]["finish_reason"] == "length"
    steps = document["runs"]["speculative"]["steps"]
    assert len(steps) == len(spec) and steps[2]["accepted"] == 0 and steps[2]["tokens"] == 1
    assert document["theory"]["break_even_acceptance"] == pytest.approx(break_even_acceptance(CHEAP, 4))
    assert document["cost_model"]["verify_s"]["1"] == pytest.approx(0.010)


def test_reset_clears_series_and_plots(charts, qtbot):
    feed(charts, "speculative", make_run(SPEC_STEPS))
    feed(charts, "vanilla", make_run(PLAIN_STEPS))
    with qtbot.waitSignal(charts.sig_redrawn, timeout=2000):
        pass
    charts.reset()
    with qtbot.waitSignal(charts.sig_redrawn, timeout=2000):
        pass
    series = charts.series()
    assert series["throughput"] == {} and series["acceptance"] == {} and series["time_split"] == {}
    assert series["theory"]["measured"] is None
    for curve in charts.throughput.curves.values():
        assert not len(drawn(curve)[0])
    assert not len(charts.histogram.bars.opts["height"])
    assert "No run yet" in charts.summary.text()


def test_step_zero_of_a_label_with_steps_starts_that_run_over(charts):
    feed(charts, "speculative", make_run(SPEC_STEPS))
    feed(charts, "speculative", make_run(SPEC_STEPS[:3]))
    assert len(charts.series()["throughput"]["speculative"][0]) == 3


def test_unknown_label_is_refused(charts):
    with pytest.raises(ValueError, match="unknown run label"):
        charts.add_step("draft", make_run([(0, 0, 0)])[0])


def test_ring_buffer_keeps_the_newest_rows_in_order():
    buffer = StepBuffer(capacity=8, initial=2)
    for i in range(21):
        buffer.append([i] * len(COLUMNS))
    assert len(buffer) == 8
    np.testing.assert_array_equal(buffer.column("step"), np.arange(13, 21))


def test_panels_reflow_to_two_columns_when_tall(charts, qtbot):
    charts.show()
    qtbot.waitExposed(charts)
    assert charts._columns == 3
    charts.resize(560, 900)
    qtbot.waitUntil(lambda: charts._columns == 2, timeout=2000)
    assert charts._grid.getItemPosition(charts._grid.indexOf(charts.theory))[:2] == (2, 1)


def test_real_decode_steps_feed_the_charts(charts, qtbot):
    """Events straight from the engine's decode loop (on a Markov-chain model, so it takes milliseconds)."""
    from engine.core.decode import decode_steps
    from engine.core.sampling import SamplingConfig
    from tests.factories.fake import MarkovBackend, MarkovDrafter, random_transition

    p = random_transition(12, seed=1)
    costs = CostModel(verify_s=dict(CHEAP.verify_s))
    events = list(
        decode_steps(
            MarkovBackend(p),
            [0, 1, 2],
            SamplingConfig(max_tokens=60),
            drafter=MarkovDrafter(p),
            draft_length=DraftLength(4),
            costs=costs,
        )
    )
    charts.set_cost_model(costs)
    feed(charts, "speculative", events)
    with qtbot.waitSignal(charts.sig_redrawn, timeout=2000):
        pass
    series = charts.series()
    assert len(series["throughput"]["speculative"][0]) == len(events)
    # Same chain as draft and target, greedy: every draft token is accepted.
    assert series["theory"]["measured"][0] == pytest.approx(1.0)
    assert charts.histogram.bars.opts["height"][-1] == pytest.approx(1.0)


def bar_rects(panel) -> list[QRectF]:
    """Each run's whole stacked bar, where it is drawn (scene coordinates)."""
    box = panel.plot.getViewBox()
    opts = panel.bars["verify"].opts
    totals = sum(np.asarray(bar.opts["width"]) for bar in panel.bars.values())
    return [
        box.mapViewToScene(QRectF(0, y - h / 2, total, h)).boundingRect()
        for y, h, total in zip(opts["y"], np.broadcast_to(opts["height"], len(opts["y"])), totals)
    ]


@pytest.mark.parametrize("size", [(1000, 700), (560, 620), (420, 900)])
def test_the_time_split_notes_sit_clear_of_every_bar_and_inside_the_plot(charts, qtbot, size):
    charts.resize(*size)
    feed(charts, "vanilla", make_run(PLAIN_STEPS))
    feed(charts, "speculative", make_run(SPEC_STEPS, draft_s=0.004, other_s=0.004))
    charts.show()
    qtbot.waitExposed(charts)
    charts.redraw()
    panel = charts.time_split
    view = panel.plot.getViewBox().sceneBoundingRect()
    bars = bar_rects(panel)
    assert len(bars) == 2 and all(rect.height() >= 4 for rect in bars)
    for note in panel.notes.values():
        text = note.sceneBoundingRect()
        assert view.contains(text), (text, view)  # not cut off at the top or the side
        assert not any(text.intersects(bar) for bar in bars), (text, bars)


# Drafting costs a fifth of a forward per token: it pays only from a ≈ 0.84 (the screenshot's case).
COSTLY = CostModel(verify_s={1: 0.01, 2: 0.0144, 4: 0.018, 8: 0.0288, 16: 0.054, 33: 0.108}, draft_s_per_token=0.004)


def curve_points(theory) -> list[QPointF]:
    """Where the theory panel's curves and the plain-decoding line are drawn (scene coordinates)."""
    box = theory.plot.getViewBox()
    found = [(a, 1.0) for a in np.linspace(0, 1, 200)]
    for curve in (theory.expected, theory.speedup):
        a, y = drawn(curve)
        dense = np.linspace(a[0], a[-1], 400)
        found.extend(zip(dense, np.interp(dense, a, y)))
    return [box.mapViewToScene(QPointF(float(a), float(y))) for a, y in found]


@pytest.mark.parametrize("costs", [CHEAP, COSTLY], ids=["cheap", "costly"])
@pytest.mark.parametrize("size", [(1000, 700), (700, 1000)])  # three columns, two columns
def test_the_theory_legend_and_break_even_label_cover_no_curve(charts, qtbot, costs, size):
    charts.resize(*size)
    charts.set_cost_model(costs)
    feed(charts, "speculative", make_run(SPEC_STEPS))
    charts.show()
    qtbot.waitExposed(charts)
    charts.redraw()
    theory = charts.theory
    label = theory.break_even.label.sceneBoundingRect()
    curves = curve_points(theory)
    assert theory.break_even.isVisible()
    words = [label_item.item.mapRectToScene(label_item.item.boundingRect()) for _, label_item in theory.legend.items]
    assert not any(label.intersects(w) for w in words), (label, words)
    assert theory.plot.getViewBox().sceneBoundingRect().contains(label)
    assert not [p for p in curves if label.contains(p)], ("the break-even label is written over a curve", label)
    rows = words + [sample.mapRectToScene(sample.boundingRect()) for sample, _ in theory.legend.items]
    assert not [p for p in curves if any(row.contains(p) for row in rows)], "the legend is written over a curve"


def test_svg_export_writes_one_drawing_per_panel(charts, tmp_path, qtbot):
    import xml.etree.ElementTree as ET

    charts.set_cost_model(CHEAP)
    feed(charts, "vanilla", make_run(PLAIN_STEPS))
    feed(charts, "speculative", make_run(SPEC_STEPS))
    charts.show()
    qtbot.waitExposed(charts)

    written = charts.export_svg(tmp_path / "charts.svg")

    names = sorted(os.path.basename(name) for name in written)
    assert "charts-where-the-time-goes.svg" in names and "charts-theory-for-k-4.svg" in names
    assert len(names) == len(charts.visible_panels()) == len(set(names))
    for name in written:
        root = ET.parse(name).getroot()  # well-formed XML
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert int(root.get("width").removesuffix("mm").split(".")[0]) > 0
        drawn_text = " ".join(t for t in root.itertext() if t.strip())
        assert drawn_text  # the title and the axis labels are text, not pixels
    time_split = ET.parse(tmp_path / "charts-where-the-time-goes.svg").getroot()
    size = charts.time_split.viewport().size()
    assert time_split.get("viewBox") == f"0 0 {size.width()} {size.height()}"  # the panel as it is on screen
    text = " ".join(time_split.itertext())
    assert "Where the time goes" in text and "seconds" in text


def test_an_svg_panel_draws_what_the_screen_shows(charts, qtbot):
    from PySide6.QtGui import QPainter
    from PySide6.QtSvg import QSvgRenderer

    from app.charts.live import panel_svg

    charts.set_cost_model(CHEAP)
    feed(charts, "speculative", make_run(SPEC_STEPS))
    charts.show()
    qtbot.waitExposed(charts)
    charts.redraw()
    panel = charts.theory
    screen = panel.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    drawing = QImage(screen.size(), QImage.Format.Format_RGB32)
    drawing.fill(panel.bg)
    painter = QPainter(drawing)
    QSvgRenderer(panel_svg(panel)).render(painter)
    painter.end()

    # Axes, curves and labels where the screen has them (antialiasing aside): at 72 dpi the
    # text shrank and the axes no longer lined up with the data.
    a = np.frombuffer(screen.constBits(), np.uint8).reshape(screen.height(), -1)[:, : screen.width() * 4]
    b = np.frombuffer(drawing.constBits(), np.uint8).reshape(drawing.height(), -1)[:, : drawing.width() * 4]
    differing = (np.abs(a.astype(int) - b.astype(int)) > 80).reshape(screen.height(), screen.width(), 4).any(axis=2)
    assert differing.mean() < 0.03, differing.mean()


def test_the_step_axis_grows_in_steps_and_a_zoom_stays_until_the_next_run(charts):
    steps = make_run([(4, 4, 3)] * 130)
    box = charts.acceptance.plot.getViewBox()
    feed(charts, "speculative", steps[:47])
    charts.redraw()
    first = box.viewRange()[0]
    assert first[1] >= 46 and first[1] < 60  # a round top above the last step (50), not the last step itself
    feed(charts, "speculative", steps[47:49])
    charts.redraw()
    assert box.viewRange()[0] == first  # two more steps inside it: the axis did not move
    box.setXRange(10, 20, padding=0)  # the user zooms in
    feed(charts, "speculative", steps[49:130])
    charts.redraw()
    assert box.viewRange()[0] == [10, 20]  # the run went past the top, the zoom stayed
    charts.reset()
    feed(charts, "speculative", steps[:47])
    charts.redraw()
    assert box.viewRange()[0] == first  # a new run fits its steps again
