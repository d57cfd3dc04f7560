"""The benchmark's table and checks name each figure as engine/figures.py does, with its tooltip, and
the bandwidth floor is explained, not graded against a target of ours."""

from __future__ import annotations

from app.bench.view import BenchTable, checks_html
from engine.figures import ACCEPTANCE_LENGTH, DECODE_SPEEDUP, DRAFT_ACCEPTANCE, PER_TOKEN_ACCEPTANCE
from tests.app.bench.sample_report import sample_report
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG


def test_the_tables_headers_are_the_glossarys_names_with_its_tooltips(qtbot):
    table = BenchTable()
    qtbot.addWidget(table)
    table.show_report(sample_report())
    headers = {table.horizontalHeaderItem(c).text().replace("\n", " "): c for c in range(table.columnCount())}
    for figure in (DRAFT_ACCEPTANCE, ACCEPTANCE_LENGTH, DECODE_SPEEDUP, PER_TOKEN_ACCEPTANCE):
        column = headers[figure.name]
        assert table.horizontalHeaderItem(column).toolTip().startswith(figure.tip)
    assert not any("forward" in header for header in headers)  # "tokens / forward" is the mean acceptance length
    # Draft acceptance reads as llama.cpp and LM Studio print it: a share of the drafted tokens.
    assert table.item(0, headers[DRAFT_ACCEPTANCE.name]).text() == "32%"


def test_the_bandwidth_floor_is_explained_and_not_failed():
    text = checks_html(sample_report())
    floor = text.split("<br>")[0]
    assert "the fastest a token can be if every weight is read once per token" in floor
    assert "goal" not in floor and "not met" not in floor and "2.73× the floor" in floor


def test_the_efficiency_is_explained_and_not_graded_against_our_own_target():
    efficiency = next(line for line in checks_html(sample_report()).split("<br>") if "Efficiency" in line)
    assert "share of the article's predicted speedup" in efficiency
    assert "goal" not in efficiency and "met" not in efficiency


def test_the_benchmark_and_find_the_best_settings_name_one_speedup_the_same_way(qtbot):
    from app.bench.autotune_view import AutotunePanel
    from app.bench.dialog import BenchDialog
    from engine import EngineConfig
    from engine.bench.autotune_results import PLAIN, AutotuneResult, Candidate, CandidateResult

    dialog = BenchDialog()
    qtbot.addWidget(dialog)
    dialog._on_report(sample_report())
    assert "decoding speedup 1.27× (geometric mean over 24 prompts, replies of up to 128 tokens)" in (
        dialog.status.text()
    )

    ngram = CandidateResult(Candidate("ngram", 4), 1.27, 76.0, 0.7, 2.0, 3, 3, draft_acceptance=0.4)
    plain = CandidateResult(PLAIN, 1.0, 60.0, 0.0, 1.0, 3, 3)
    result = AutotuneResult((ngram, plain), 60.0, EngineConfig(), prompts=3, max_tokens=64)
    panel = AutotunePanel()
    qtbot.addWidget(panel)
    panel.show_result(result)
    assert "decoding speedup 1.27× (geometric mean over 3 prompts, replies of up to 64 tokens)" in (
        panel.summary.text()
    )
    headers = [panel.table.horizontalHeaderItem(c).text().replace("\n", " ") for c in range(panel.table.columnCount())]
    assert {"decoding speedup", "draft acceptance", "mean acceptance length"} <= set(headers)
    assert panel.table.item(0, headers.index("draft acceptance")).text() == "40%"
