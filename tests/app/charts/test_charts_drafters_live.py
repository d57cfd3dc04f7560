"""Drafter statistics from a real decode to the charts: read by the engine process, drawn on the GUI thread."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from app.charts.drafter_panels import PoolHitsPanel, PoolPanel
from engine import EngineConfig, SamplingConfig
from engine.api import drafter_stats
from engine.service.routes_specdeck import drafter_stats as drafter_snapshot
from tests.app.conftest import STRICT_QT_LOG, send_and_wait
from tests.factories.hf_models import make_tiny_llama

pytestmark = STRICT_QT_LOG

PROMPT = "Repeat after me, word for word: the early bird catches the worm, the early bird catches the worm."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_llama(tmp_path_factory.mktemp("charts") / "tiny", seed=0, n_layers=4)


def test_lookahead_pool_reaches_the_charts_from_the_engine_process(qtbot, make_window, tiny):
    config = EngineConfig(target=tiny, k=6, dtype="float32", measure_costs=False).with_drafter(
        "lookahead", window=2, ngram=3, candidates=2
    )
    window = make_window(config, sampling=SamplingConfig(max_tokens=24))
    snapshots = []
    window.controller.sig_steps.connect(
        lambda steps: snapshots.extend((step.run, step.drafter_stats) for step in steps)
    )

    result = send_and_wait(qtbot, window, PROMPT)
    assert result is not None and result.stats.steps > 0

    # Read once per step, by the engine process, and sent with the step.
    assert [label for label, _ in snapshots] == ["speculative"] * result.stats.steps
    assert all(type(s).__name__ == "LookaheadStats" for _, s in snapshots)  # rebuilt as the drafter's own type
    assert len({id(s) for _, s in snapshots}) == len(snapshots)  # a fresh copy per step

    charts = window.charts
    assert charts.drafter_kind == "lookahead"
    assert "lookahead decoding" in window.engine_label.text()
    qtbot.waitUntil(lambda: not charts._dirty, timeout=2000)
    plots = [type(p) for p in charts.drafter.plots]
    assert plots == [PoolPanel, PoolHitsPanel] and charts.drafter.isVisibleTo(window)
    pool, hits = charts.drafter.plots
    _, drawn_pool = pool.total.xData, pool.total.yData
    assert len(drawn_pool) == result.stats.steps
    expected = [s.pool_size for _, s in snapshots]
    np.testing.assert_array_equal(drawn_pool, expected)
    assert drawn_pool[-1] > 0, "the pool never grew"
    assert "W 2 · N 3 · G 2" in pool.plot.titleLabel.text
    assert "Acceptance per tree depth" in charts.depth.plot.titleLabel.text
    assert "Tree size and accepted length" in charts.draft_length.plot.titleLabel.text
    _, nodes = charts.draft_length.drafted.xData, charts.draft_length.drafted.yData
    assert len(nodes) == result.stats.steps and nodes.max() <= 6  # k = 6 is the tree's node budget


class _Drafter:
    def __init__(self):
        self.candidates = [{"layer": 2, "acceptance": 0.5}]

    def stats(self):
        return {"exit_layer": 2, "candidates": self.candidates}


class _Broken:
    def stats(self):
        raise RuntimeError("a bug in stats()")


def test_a_snapshot_shares_nothing_with_the_drafter():
    drafter = _Drafter()
    snapshot = drafter_snapshot(drafter)
    drafter.candidates[0]["acceptance"] = 0.9  # the worker goes on decoding
    drafter.candidates.append({"layer": 3, "acceptance": None})
    assert snapshot == {"exit_layer": 2, "candidates": [{"layer": 2, "acceptance": 0.5}]}
    assert drafter_snapshot(None) is None


def test_a_failing_stats_is_logged_once_and_charted_without_numbers(caplog):
    """The engine records each step's statistics (Engine.stream(snapshots=True)): a bug in a drafter's
    stats() must not end the reply, only leave its numbers out."""
    with caplog.at_level(logging.ERROR, logger="engine.api"):
        assert drafter_stats(_Broken()) is None
        assert drafter_stats(_Broken()) is None
        assert drafter_snapshot(_Broken()) is None  # the OpenAI routes' events too
    assert len([r for r in caplog.records if "stats() failed" in r.getMessage()]) == 1
