"""The live charts for the drafters with numbers of their own: EAGLE and Medusa trees, lookahead's
n-gram pool, early exit's layer. Synthetic steps and stats() snapshots, no model."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor

from app.charts.data import COLUMNS, DRAFTER_COLUMNS, drafter_row
from app.charts.drafter_panels import ExitAcceptancePanel, ExitLayerPanel, PoolHitsPanel, PoolPanel
from app.charts.live import LiveCharts, grid_positions
from app.charts.panel import RUN_COLOURS, label_sides
from engine.core.draft_length import CostModel, break_even_acceptance
from engine.core.events import RunStats
from engine.drafters.chain_spec import ChainStats
from engine.drafters.eagle_spec import EagleStats
from engine.drafters.early_exit_spec import EarlyExitStats, ExitCandidate
from engine.drafters.lookahead_spec import LookaheadStats
from engine.drafters.medusa_spec import MedusaStats
from engine.drafters.ngram_spec import NgramStats
from tests.app.charts.test_charts import drawn, make_run
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG

TREE_STEPS = [(16, 12, 3), (16, 11, 1), (16, 12, 0), (16, 9, 4), (16, 12, 2), (16, 10, 5)] * 4  # (k, nodes, accepted)
EXITS = (8, 12, 16, 20, 24)


def lookahead_stats(i: int) -> LookaheadStats:
    """What LookaheadDrafter.stats() says after step i (W 2, N 3, G 2)."""
    jacobi, text = 2 * i, 20 + 7 * i
    return LookaheadStats(
        window=2,
        ngram=3,
        max_candidates=2,
        extra_rows=4,
        pool_size=jacobi + text,
        pool_jacobi=jacobi,
        pool_text=text,
        steps=i + 1,
        pool_hits=(i * 3) // 5,
        accepted=i,
        candidates=2,
        nodes=5,
    )


def early_exit_stats(i: int) -> EarlyExitStats:
    """What EarlyExitDrafter.stats() says after step i: exploring the exits deepest first, then 12."""
    layer = EXITS[::-1][i // 3] if i < 15 else 12
    rates = {8: 0.31, 12: 0.52, 16: 0.64, 20: 0.71, 24: None}  # 24: never measured
    candidates = tuple(
        ExitCandidate(
            layer=L,
            acceptance=rates[L],
            tested=0.0 if rates[L] is None else 10.0,
            steps=3,
            ms_per_token=1.0,
            cost_ratio=L / 30,
            predicted_speedup=1.2,
        )
        for L in EXITS
    )
    return EarlyExitStats(exit_layer=layer, n_layers=30, layers="auto", candidates=candidates)


def eagle_stats(i: int) -> EagleStats:
    return EagleStats(
        nodes=TREE_STEPS[i % len(TREE_STEPS)][1], depth=4, rounds=5, top_k=8, draft_vocab=32000, calibration=0.87
    )


def medusa_stats(i: int) -> MedusaStats:
    return MedusaStats(
        heads=4,
        candidates_per_head=3,
        nodes=12,
        head_top1=(0.6, 0.4, 0.3, 0.2),
        head_top_k=(0.8, 0.6, 0.5, 0.4),
        scored=(i + 1,) * 4,
    )


SNAPSHOTS = {
    "lookahead": lookahead_stats,
    "early-exit": early_exit_stats,
    "eagle": eagle_stats,
    "medusa": medusa_stats,
    "ngram": lambda i: NgramStats(lookups=i + 1, hits=i // 2),
}


def with_stats(event, stats):
    """A step as the engine records it: with the drafter's statistics it copied right after it."""
    return dataclasses.replace(event, drafter_stats=stats)


def tree_run(steps=TREE_STEPS):
    """Tree steps, with per-depth counts in RunStats the way the decode loop keeps them."""
    events = make_run(steps)
    tested, accepted = [0] * 6, [0] * 6
    out = []
    for event in events:
        for d in range(event.accepted + (1 if event.accepted < 6 else 0)):
            tested[d] += 1
        for d in range(event.accepted):
            accepted[d] += 1
        stats = RunStats(
            **{
                **event.stats.__dict__,
                "depth_tested": tuple(tested),
                "depth_accepted": tuple(accepted),
                "tree_nodes": event.drafted,
            }
        )
        out.append(type(event)(**{**event.__dict__, "stats": stats}))
    return out


@pytest.fixture
def charts(qtbot):
    widget = LiveCharts()
    qtbot.addWidget(widget)
    widget.resize(1000, 700)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def feed(charts, kind, steps=TREE_STEPS, label="speculative", snapshots=True):
    charts.set_drafter(kind)
    events = tree_run(steps) if kind in ("eagle", "medusa", "lookahead") else make_run(steps)
    for i, event in enumerate(events):
        charts.add_step(label, with_stats(event, SNAPSHOTS[kind](i) if snapshots and label == "speculative" else None))
    charts.redraw()
    return events


def shown_plots(charts) -> list[type]:
    if not charts.drafter.isVisibleTo(charts):
        return []
    return [type(p) for p in charts.drafter.plots if p.isVisibleTo(charts)]


# -- which panels appear -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, plots, draft_title, depth_title",
    [
        ("eagle", [], "Tree size and accepted length", "Acceptance per tree depth"),
        ("medusa", [], "Tree size and accepted length", "Acceptance per head"),
        ("lookahead", [PoolPanel, PoolHitsPanel], "Tree size and accepted length", "Acceptance per tree depth"),
        ("early-exit", [ExitLayerPanel, ExitAcceptancePanel], "Draft length k", "Acceptance per draft position"),
        ("ngram", [], "Draft length k", "Acceptance per draft position"),
    ],
)
def test_each_drafter_gets_its_panels_and_names(charts, kind, plots, draft_title, depth_title):
    feed(charts, kind)
    assert shown_plots(charts) == plots
    assert draft_title in charts.draft_length.plot.titleLabel.text
    assert depth_title in charts.depth.plot.titleLabel.text


def test_switching_drafters_swaps_the_drafter_panel_and_keeps_the_layout_whole(charts):
    feed(charts, "lookahead")
    assert shown_plots(charts) == [PoolPanel, PoolHitsPanel]
    charts.reset()
    feed(charts, "early-exit")
    assert shown_plots(charts) == [ExitLayerPanel, ExitAcceptancePanel]
    charts.reset()
    feed(charts, "eagle")
    assert shown_plots(charts) == []
    # Back to the usual layout: the per-depth panel takes the whole last row again.
    assert charts._grid.getItemPosition(charts._grid.indexOf(charts.depth)) == (2, 0, 1, 3)


def test_the_drafter_panel_sits_beside_the_depth_bars_or_on_a_row_of_its_own(charts, qtbot):
    feed(charts, "lookahead")
    position = charts._grid.getItemPosition
    assert position(charts._grid.indexOf(charts.depth)) == (2, 0, 1, 1)
    assert position(charts._grid.indexOf(charts.drafter)) == (2, 1, 1, 2)  # two plots wide
    charts.resize(560, 950)  # a tall dock: two columns
    qtbot.waitUntil(lambda: charts._columns == 2, timeout=2000)
    assert position(charts._grid.indexOf(charts.depth)) == (3, 0, 1, 2)
    assert position(charts._grid.indexOf(charts.drafter)) == (4, 0, 1, 2)
    # Every panel shown is in the grid and no two share a cell.
    cells = set()
    for panel in charts.visible_panels():
        row, column, rows, columns = position(charts._grid.indexOf(panel))
        for c in range(column, column + columns):
            assert (row, c) not in cells
            cells.add((row, c))


def test_grid_positions():
    assert grid_positions(7, 3, False)[-1] == (2, 0, 3, 6)
    assert grid_positions(7, 3, True)[-2:] == [(2, 0, 1, 6), (2, 1, 2, 7)]
    assert grid_positions(7, 2, True)[-2:] == [(3, 0, 2, 6), (4, 0, 2, 7)]
    assert grid_positions(7, 2, False)[-1] == (3, 0, 2, 6)


# -- what the panels draw ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["eagle", "medusa", "lookahead"])
def test_tree_drafters_show_tree_size_and_accepted_length_per_step(charts, kind):
    events = feed(charts, kind)
    x, nodes = drawn(charts.draft_length.drafted)
    _, accepted = drawn(charts.draft_length.accepted)
    np.testing.assert_array_equal(x, np.arange(len(events)))
    np.testing.assert_array_equal(nodes, [s[1] for s in TREE_STEPS])
    np.testing.assert_array_equal(accepted, [s[2] for s in TREE_STEPS])
    assert charts.draft_length.accepted.isVisible()
    legend = [label.text for _, label in charts.draft_length.legend.items]
    assert legend == ["node budget k", "tree nodes", "accepted"]


def test_chain_drafters_keep_the_draft_length_panel_as_it_was(charts):
    feed(charts, "ngram")
    assert not charts.draft_length.accepted.isVisible()
    assert [label.text for _, label in charts.draft_length.legend.items] == ["k asked", "drafted"]


def test_depth_bars_say_depth_for_eagle_and_lookahead_and_head_for_medusa(charts):
    for kind, word in (("eagle", "depth"), ("lookahead", "depth"), ("medusa", "head"), ("early-exit", "position")):
        charts.reset()
        feed(charts, kind)
        assert charts.depth.label == word
        assert charts.depth.tick_labels(2) == [f"{word} 1", f"{word} 2"]
        # Six bars: plain numbers under them, and the axis says what they count.
        assert charts.depth.plot.getAxis("bottom").labelText == word, kind


def test_lookahead_pool_and_hits_follow_the_snapshots(charts):
    events = feed(charts, "lookahead")
    n = len(events)
    expected = [lookahead_stats(i) for i in range(n)]
    pool, hits = charts.drafter.plots
    x, total = drawn(pool.total)
    np.testing.assert_array_equal(x, np.arange(n))
    np.testing.assert_array_equal(total, [s.pool_size for s in expected])
    np.testing.assert_array_equal(drawn(pool.text)[1], [s.pool_text for s in expected])
    np.testing.assert_array_equal(drawn(hits.hits)[1], [s.pool_hits for s in expected])
    np.testing.assert_array_equal(drawn(hits.steps)[1], [s.steps for s in expected])
    assert "W 2 · N 3 · G 2" in pool.plot.titleLabel.text
    assert f"Pool hits: {expected[-1].pool_hits} of {n} steps" in hits.plot.titleLabel.text
    assert [label.text for _, label in pool.legend.items] == ["from the window", "from the text"]


def test_early_exit_shows_the_layer_in_use_and_each_exits_acceptance(charts):
    events = feed(charts, "early-exit", steps=[(4, 4, 2)] * 20)
    layer, bars = charts.drafter.plots
    np.testing.assert_array_equal(drawn(layer.curve)[1], [early_exit_stats(i).exit_layer for i in range(20)])
    assert "Exit layer: 12 of 30 (auto)" in layer.plot.titleLabel.text
    assert bars.layers == list(EXITS)
    np.testing.assert_allclose(bars.bars.opts["height"], [0.31, 0.52, 0.64, 0.71, 0.0])
    blue = QColor(RUN_COLOURS["speculative"])
    in_use = [brush.color() == blue for brush in bars.bars.opts["brushes"]]
    assert in_use == [layer == 12 for layer in EXITS]
    assert [t.toPlainText() for t in bars.values] == ["0.31", "0.52", "0.64", "0.71", "untried"]
    assert "in use: 12" in bars.plot.getAxis("bottom").labelText
    assert len(events) == 20


def test_steps_without_a_snapshot_leave_gaps_not_zeros(charts):
    charts.set_drafter("lookahead")
    events = tree_run()
    for i, event in enumerate(events):
        charts.add_step("speculative", with_stats(event, lookahead_stats(i) if i % 2 == 0 else None))
    charts.redraw()
    pool, _ = charts.drafter.plots
    x, total = drawn(pool.total)
    np.testing.assert_array_equal(x, np.arange(0, len(events), 2))
    assert not np.isnan(total).any()


def test_drafter_row_reads_only_numbers_it_knows():
    assert all(math.isnan(v) for v in drafter_row(None))
    row = dict(zip(DRAFTER_COLUMNS, drafter_row(lookahead_stats(4))))
    assert row["pool_size"] == 8 + 48 and row["pool_steps"] == 5 and math.isnan(row["exit_layer"])
    row = dict(zip(DRAFTER_COLUMNS, drafter_row(early_exit_stats(0))))
    assert row["exit_layer"] == 24 and math.isnan(row["pool_steps"])  # "steps" is not the window's here
    auto = dataclasses.replace(early_exit_stats(0), exit_layer="auto")  # not a number: no point
    assert math.isnan(drafter_row(auto)[DRAFTER_COLUMNS.index("exit_layer")])


def test_summary_names_the_eagle_tree(charts):
    feed(charts, "eagle")
    assert "EAGLE: last tree 10 nodes, 4 deep" in charts.summary.text()
    assert "calibration 0.87" in charts.summary.text()


# -- exports -----------------------------------------------------------------------------


def test_exports_carry_the_lookahead_columns(charts, tmp_path):
    charts.set_drafter("lookahead")
    vanilla = make_run([(0, 0, 0)] * 10)
    for event in vanilla:
        charts.add_step("vanilla", event)
    spec = feed(charts, "lookahead")

    charts.export_csv(tmp_path / "steps.csv")
    with open(tmp_path / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["run", *COLUMNS, "pool_size", "pool_jacobi", "pool_text", "pool_steps", "pool_hits"]
    spec_rows = [r for r in rows if r["run"] == "speculative"]
    assert [int(r["pool_size"]) for r in spec_rows] == [lookahead_stats(i).pool_size for i in range(len(spec))]
    assert [int(r["pool_hits"]) for r in spec_rows] == [lookahead_stats(i).pool_hits for i in range(len(spec))]
    assert all(r["pool_size"] == "" for r in rows if r["run"] == "vanilla")  # a plain run has no pool

    charts.export_json(tmp_path / "run.json")
    document = json.loads((tmp_path / "run.json").read_text())
    assert document["drafter"] == "lookahead"
    assert document["columns"][-5:] == ["pool_size", "pool_jacobi", "pool_text", "pool_steps", "pool_hits"]
    run = document["runs"]["speculative"]
    assert run["drafter_stats"] == lookahead_stats(len(spec) - 1).as_dict()
    assert run["steps"][3]["pool_text"] == lookahead_stats(3).pool_text
    assert document["runs"]["vanilla"]["drafter_stats"] is None
    assert document["runs"]["vanilla"]["steps"][0]["pool_size"] is None
    assert document["depth_acceptance"]["label"] == "depth"

    charts.export_png(tmp_path / "charts.png")
    assert (tmp_path / "charts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_exports_carry_the_exit_layer_and_its_candidates(charts, tmp_path):
    feed(charts, "early-exit", steps=[(4, 4, 2)] * 20)
    charts.export_csv(tmp_path / "steps.csv")
    with open(tmp_path / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[-1] == "exit_layer" and "pool_size" not in rows[0]
    assert [int(r["exit_layer"]) for r in rows] == [early_exit_stats(i).exit_layer for i in range(20)]
    charts.export_json(tmp_path / "run.json")
    stats = json.loads((tmp_path / "run.json").read_text())["runs"]["speculative"]["drafter_stats"]
    assert [c["layer"] for c in stats["candidates"]] == list(EXITS)
    assert stats["candidates"][-1]["acceptance"] is None


def test_a_chain_run_exports_no_drafter_columns(charts, tmp_path):
    feed(charts, "ngram", steps=[(4, 4, 2)] * 5)
    charts.export_csv(tmp_path / "steps.csv")
    with open(tmp_path / "steps.csv", newline="") as f:
        assert next(csv.reader(f)) == ["run", *COLUMNS]


# -- labels that must not run into each other --------------------------------------------


@pytest.mark.parametrize(
    "overall, break_even, sides",
    [
        (0.74, 0.79, (False, True)),  # close: the upper line's label above it, the lower's below
        (0.79, 0.74, (True, False)),
        (0.60, 0.20, (True, False)),  # apart: whole run above, break-even below
        (0.92, 0.30, (False, False)),  # whole run near the top: below its line
        (0.50, 0.05, (True, True)),  # break-even near the bottom: above its line
        (0.97, 0.95, (False, False)),  # both at the top: both below, at the lines' opposite ends
        (0.50, None, (True, False)),
    ],
)
def test_acceptance_line_labels_take_sides(overall, break_even, sides):
    assert label_sides(overall, break_even) == sides


def test_close_whole_run_and_break_even_labels_do_not_overlap(charts, qtbot):
    """The README screenshot's case: a whole-run acceptance just under the break-even."""
    panel = charts.acceptance
    steps = np.arange(40.0)
    series = {
        "acceptance": {"speculative": (steps, np.full(40, 0.74))},
        "theory": {"measured": (0.74, 2.5), "break_even": 0.79},
    }
    panel.show_series(series)
    qtbot.wait(50)
    box = panel.plot.getViewBox()
    overall = panel.overall.label.sceneBoundingRect()
    break_even = panel.break_even.label.sceneBoundingRect()
    y_overall = box.mapViewToScene(QPointF(0, 0.74)).y()
    y_break_even = box.mapViewToScene(QPointF(0, 0.79)).y()
    assert not overall.intersects(break_even)
    assert overall.top() >= y_overall - 1  # below its line (scene y grows downwards)
    assert break_even.bottom() <= y_break_even + 1  # above its line
    # Neither label crosses the other line.
    assert not overall.top() < y_break_even < overall.bottom()
    assert not break_even.top() < y_overall < break_even.bottom()


def test_theory_break_even_label_stays_inside_a_narrow_plot(qtbot):
    # Verifying 5 tokens costs 3 plain steps: the break-even is high, near the right edge.
    costs = CostModel(verify_s={1: 0.010, 2: 0.015, 4: 0.025, 5: 0.030, 8: 0.045, 16: 0.08}, draft_s_per_token=0.001)
    assert break_even_acceptance(costs, 4) > 0.6
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.resize(520, 900)
    charts.show()
    qtbot.waitExposed(charts)
    charts.set_cost_model(costs)
    for event in make_run([(4, 4, 3)] * 20):
        charts.add_step("speculative", event)
    charts.redraw()
    qtbot.wait(50)
    charts.redraw()
    theory = charts.theory
    label = theory.break_even.label
    assert label.isVisible() and "break-even" in label.toPlainText() or label.toPlainText().startswith("0.")
    inside = theory.plot.getViewBox().sceneBoundingRect().adjusted(-1, -1, 1, 1)
    assert inside.contains(label.textItem.mapRectToScene(label.textItem.boundingRect()))


def test_a_chain_shows_which_member_drafted_each_step_and_each_members_share(charts):
    from app.charts.drafter_panels import ChainPanel

    charts.set_drafter("suffix+model")
    events = make_run([(4, 4, 3), (4, 2, 1), (4, 4, 4), (4, 3, 0)] * 3)
    members = ("suffix", "model")
    for i, event in enumerate(events):
        by = 1 if i % 2 == 0 else 2
        steps = ((i + 2) // 2, (i + 1) // 2)
        stats = ChainStats(drafted_by=by, members=members, steps=steps, accepted=(3 * steps[0], steps[1]))
        charts.add_step("speculative", with_stats(event, stats))
    charts.redraw()
    (panel,) = [p for p in charts.drafter.plots if p.isVisibleTo(charts)]
    assert isinstance(panel, ChainPanel) and "Drafted by: suffix 6, model 6" in panel.plot.titleLabel.text
    x, y = panel.points.getData()
    np.testing.assert_array_equal(x, np.arange(12))
    np.testing.assert_array_equal(y, [1, 2] * 6)  # one row per member
    assert [label for _, label in panel.plot.getAxis("left")._tickLevels[0]] == ["none", "suffix", "model"]
    assert "Chained drafters: suffix drafted 6 steps (18 tokens accepted), model 6 (6)" in charts.summary.text()
    # Suffix decoding drafts trees on PyTorch (its spec's `trees`), so a chain holding it is charted as trees.
    assert charts.depth.plot.titleLabel.text.startswith("Acceptance per tree depth")
