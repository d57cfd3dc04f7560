"""Side by side: a real greedy float32 comparison, and verdicts on crafted divergent results."""

from __future__ import annotations

import pytest

from app.chat.compare_view import CompareView
from engine import EngineConfig, SamplingConfig
from engine.api import Comparison, collect
from engine.core.divergence import first_divergence
from engine.core.events import RunStats, Source, StepEvent, TokenInfo
from engine.figures import DECODE_SPEEDUP, TIME_TO_FIRST_TOKEN
from tests.app.conftest import REPLY_TIMEOUT_MS, STRICT_QT_LOG

pytestmark = STRICT_QT_LOG

LLAMA_CPP_BOUND = 3.5  # engine.core.divergence.rounding_bound for a quantized GGUF model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    from tests.factories.hf_models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", seed=0)


def test_greedy_float32_runs_are_reported_identical(qtbot, make_window, tiny_llama):
    config = EngineConfig(target=tiny_llama, dtype="float32", drafter="ngram", measure_costs=False, k=4)
    window = make_window(config, sampling=SamplingConfig(max_tokens=40))
    window.tabs.setCurrentWidget(window.compare_view)
    labels = []
    window.controller.sig_steps.connect(lambda steps: labels.extend(step.run for step in steps))

    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        window.compare_view.prompt.setPlainText("one two three one two three one two")
        window.compare_view.run_button.click()

    comparison = finished.args[1]
    assert isinstance(comparison, Comparison) and comparison.identical
    assert comparison.vanilla.stats.tokens >= 10  # a real comparison, not two empty runs
    verdict = window.compare_view.verdict.text()
    assert "Outputs identical" in verdict and "Decoding speedup:" in verdict and "tok/s" in verdict
    views = {label: pane.view for label, pane in window.compare_view.panes.items()}
    assert views["vanilla"].toPlainText() == views["speculative"].toPlainText()
    assert comparison.vanilla.text in views["vanilla"].toPlainText().replace("\u2029", "\n")
    assert labels.index("speculative") > labels.index("vanilla") and labels[-1] == "speculative"  # one after the other
    assert set(window.charts.series()["throughput"]) == {"vanilla", "speculative"}  # both fed the charts


def token(token_id: int, text: str, top: tuple[tuple[int, float], ...] = ()) -> TokenInfo:
    return TokenInfo(token_id, text, Source.PLAIN, 0.5, None, tuple(i for i, _ in top), tuple(v for _, v in top))


def result(*infos: TokenInfo, tokens_per_s: float, prefill_s: float = 0.0):
    """A GenerationResult with one step per token, as a greedy run of the engine would report it."""
    events = []
    for index, info in enumerate(infos):
        wall_s = (index + 1) / tokens_per_s
        stats = RunStats(
            steps=index + 1,
            tokens=index + 1,
            wall_s=wall_s,
            prefill_s=prefill_s,
            time_to_first_token_s=prefill_s + 1 / tokens_per_s,
        )
        finish = "length" if index == len(infos) - 1 else None
        events.append(StepEvent(index, (info,), info.text, 0, 0, 0, 0.0, 0.0, 0.0, stats, finish))
    return collect(events)


def comparison_of(speculative, vanilla) -> Comparison:
    return Comparison(vanilla, speculative, first_divergence(speculative, vanilla, LLAMA_CPP_BOUND))


@pytest.fixture
def view(qtbot):
    widget = CompareView()
    qtbot.addWidget(widget)
    widget.resize(900, 600)
    widget.show()
    return widget


def test_a_divergence_within_rounding_is_reported_as_explained(view):
    shared = token(10, "The", ((10, 9.0), (11, 4.0)))
    speculative = result(shared, token(21, " cat", ((21, 5.0), (22, 4.2))), tokens_per_s=20)
    vanilla = result(shared, token(22, " dog", ((22, 5.1), (21, 4.5))), tokens_per_s=10)

    view.show_comparison(comparison_of(speculative, vanilla), greedy=True)

    verdict = view.verdict.text()
    assert "Outputs differ from token 1" in verdict
    assert "&#x27; dog&#x27;" in verdict and "&#x27; cat&#x27;" in verdict  # both tokens named (escaped)
    assert "Explained by rounding" in verdict and "bug" not in verdict
    assert "Decoding speedup:</b> 2.00×" in verdict
    for pane in view.panes.values():  # the first differing token is marked in both outputs
        start, _ = pane.view._entries[0].spans[1]
        assert "First difference" in pane.view.tooltip_at(pane.view.cursorRect(_cursor(pane.view, start)).center())


def test_a_divergence_beyond_rounding_is_called_a_bug(view):
    shared = token(10, "The", ((10, 9.0), (11, 4.0)))
    speculative = result(shared, token(21, " cat", ((21, 12.0), (22, 1.0))), tokens_per_s=20)
    vanilla = result(shared, token(22, " dog", ((22, 12.0), (21, 1.0))), tokens_per_s=10)

    view.show_comparison(comparison_of(speculative, vanilla), greedy=True)

    assert "Not explained by rounding" in view.verdict.text() and "bug" in view.verdict.text()


def test_a_sampled_run_does_not_claim_identity(view):
    speculative = result(token(1, "a"), tokens_per_s=10)
    vanilla = result(token(2, "b"), tokens_per_s=10)

    view.show_comparison(Comparison(vanilla, speculative, None), greedy=False)

    assert "need not match token for token" in view.verdict.text()
    assert "identical" not in view.verdict.text() and "differ" not in view.verdict.text()


def _cursor(text_view, position):
    from PySide6.QtGui import QTextCursor

    cursor = QTextCursor(text_view.document())
    cursor.setPosition(position + 1)
    return cursor


def test_clear_results_leaves_no_run_of_the_previous_pair_on_screen(view):
    """Item 6 of issue 36: a new pair starts clean (the window calls this when a pair loads)."""
    view.prompt.setPlainText("kept for the next pair")
    view.begin()
    speculative = result(token(1, "alpha"), token(2, " beta"), tokens_per_s=20)
    vanilla = result(token(1, "alpha"), token(2, " beta"), tokens_per_s=10)
    view.show_comparison(Comparison(vanilla, speculative, None), greedy=True)
    assert "speedup" in view.verdict.text() and "alpha" in view.panes["vanilla"].view.toPlainText()

    view.clear_results()

    assert "speedup" not in view.verdict.text() and "identical" not in view.verdict.text()
    for pane in view.panes.values():
        assert pane.view.toPlainText().strip() == ""
        assert "tokens" not in pane.stats.text()
    assert view.prompt.toPlainText() == "kept for the next pair"


def test_the_verdict_names_the_decoding_speedup_and_each_runs_time_to_first_token(view):
    speculative = result(token(1, "a"), token(2, "b"), tokens_per_s=20, prefill_s=0.31)
    vanilla = result(token(1, "a"), token(2, "b"), tokens_per_s=10, prefill_s=0.29)

    view.show_comparison(Comparison(vanilla, speculative, None), greedy=True)

    verdict = view.verdict.text()
    assert "Decoding speedup:</b> 2.00×" in verdict and "decoding phase only" in verdict
    assert "time to first token 0.39 s (prefill 0.29 s)" in verdict  # vanilla: 0.29 s + its first step
    assert "time to first token 0.36 s (prefill 0.31 s)" in verdict  # speculative: its own prefill
    assert "prefill 0.00 s" not in verdict
    assert "time to first token 0.39 s" in view.panes["vanilla"].stats.text()
    assert "time to first token 0.36 s" in view.panes["speculative"].stats.text()
    assert DECODE_SPEEDUP.tip in view.verdict.toolTip() and TIME_TO_FIRST_TOKEN.tip in view.verdict.toolTip()


def test_the_chart_labels_both_bars_with_the_verdicts_times(view):
    speculative = result(token(1, "a"), token(2, "b"), tokens_per_s=20, prefill_s=0.31)
    vanilla = result(token(1, "a"), token(2, "b"), tokens_per_s=10, prefill_s=0.29)

    view.show_comparison(Comparison(vanilla, speculative, None), greedy=True)

    verdict = view.verdict.text()
    for label, run in (("vanilla", vanilla), ("speculative", speculative)):
        text = view.chart.labels[label]
        assert text.isVisible() and text.toPlainText().startswith(f"{label}: ")
        times = text.toPlainText().removeprefix(f"{label}: ")
        assert times in verdict and f"decoding {run.stats.wall_s:.2f} s" in times
    # each bar is as long as its run's prefill and decoding, the numbers the labels say
    order = list(view.chart.labels)
    spec, van = order.index("speculative"), order.index("vanilla")
    assert view.chart.prefill.opts["width"][van] == vanilla.stats.prefill_s
    assert view.chart.decoding.opts["width"][spec] == speculative.stats.wall_s

    view.clear_results()
    assert not any(text.isVisible() for text in view.chart.labels.values())
    assert not view.chart.decoding.opts["width"].any()


def test_the_side_by_side_says_it_is_greedy_whatever_the_chat_samples_with(view):
    view.set_sampling(SamplingConfig(temperature=0.8, top_k=40, seed=5, max_tokens=9))

    assert "greedy, seed 5, up to 9 tokens" in view.settings_label.text()
    assert "temperature" not in view.settings_label.text()
    same = result(token(1, "a"), token(2, "b"), tokens_per_s=10)
    view.show_comparison(Comparison(same, same, None))  # greedy unless told otherwise: the runs were
    assert "Outputs identical" in view.verdict.text()
