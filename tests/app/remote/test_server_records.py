"""What a remote server cannot feed the window, said rather than guessed: steps without costs travel,
the charts show the server's notes once under their summary, and a side by side of two servers'
texts that differ says it cannot name the first different token."""

from __future__ import annotations

from app.charts.live import LiveCharts
from app.chat.compare_view import verdict_html
from engine import Comparison, GenerationResult, RunStats, StepEvent
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG
NOTES = ("This server sends no probabilities: p and q are not shown.", "It reports no cost model.")


def test_a_servers_steps_travel_without_drafter_statistics_or_costs(qtbot):
    from engine.remote.steps import StepBuilder

    (step,) = StepBuilder(run="speculative").add("Hi")
    assert (step.run, step.drafter_stats, step.costs) == ("speculative", None, None)
    charts = LiveCharts()
    qtbot.addWidget(charts)
    charts.add_steps([step])
    assert len(charts.series()["throughput"]["speculative"][0]) == 1
    assert charts.series()["theory"]["speedup"] is None  # no cost model: the theory draws the formula alone


def test_the_charts_say_the_servers_notes_once_under_the_summary(qtbot):
    charts = LiveCharts()
    qtbot.addWidget(charts)
    assert not charts.notes.isVisibleTo(charts)
    stats = RunStats(steps=1, tokens=1, wall_s=0.1, notes=NOTES + ("A note of this run alone.",))
    charts.add_step("speculative", StepEvent(0, (), "Hi", 0, 0, 0, 0.0, 0.1, 0.0, stats, "stop"))
    charts.set_notes(NOTES)
    assert charts.notes.isVisibleTo(charts) and charts.notes.text() == "\n".join(NOTES)
    charts.redraw()
    summary = charts.summary.text()
    assert "tokens/s" in summary and NOTES[0] not in summary and "A note of this run alone." in summary
    charts.set_notes(())  # the next pair is local: nothing to say
    assert not charts.notes.isVisibleTo(charts)


def result(text: str, drafted: int) -> GenerationResult:
    stats = RunStats(tokens=3, drafted=drafted, wall_s=1.0)
    return GenerationResult(text, (-1, -1, -1), stats, "length", ())


def test_two_servers_texts_that_differ_are_said_to_differ_without_a_token_to_name():
    comparison = Comparison(result("a b c", 0), result("a b d", 2), None)
    text = verdict_html(comparison, greedy=True)
    assert "Outputs differ" in text and "cannot be named" in text
    assert "Outputs identical" in verdict_html(Comparison(result("a b c", 0), result("a b c", 2), None), True)
