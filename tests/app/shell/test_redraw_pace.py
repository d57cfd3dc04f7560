"""The live charts are live: drawn while a real reply streams, on the machine the tests run on.

A reply from the embedded model, in the window as a user sees it (the window's own engine
decoding on the CPU it runs on, where the charts' budget is the smallest).
"""

from __future__ import annotations

import time

from engine import SamplingConfig
from tests.app.conftest import REPLY_TIMEOUT_MS, STRICT_QT_LOG

pytestmark = STRICT_QT_LOG

LONG_PROMPT = "Write a long story about a lighthouse keeper and his cat."


def test_the_charts_redraw_at_least_twice_a_second_while_a_reply_streams(qtbot, make_window):
    window = make_window(sampling=SamplingConfig(max_tokens=384))
    charts = window.charts
    assert window.controller.shares_cores  # the smallest budget: the case that drew every 5-6 s
    drawn = []  # (time, steps the throughput curve shows) at each redraw
    curve = charts.throughput.curves["speculative"]
    charts.sig_redrawn.connect(lambda: drawn.append((time.monotonic(), 0 if curve.xData is None else len(curve.xData))))
    first_steps = []
    window.controller.sig_steps.connect(lambda steps: first_steps.append(time.monotonic()) if not first_steps else None)
    redraws_before = charts.redraws

    with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        window.send_message(LONG_PROMPT)
    ended = time.monotonic()
    result = finished.args[1]
    assert result is not None

    streaming_s = ended - first_steps[0]
    assert streaming_s >= 2.0, f"the reply streamed for {streaming_s:.1f} s: too short to tell a pace"
    during = [(t, n) for t, n in drawn if first_steps[0] <= t <= ended]
    assert charts.redraws - redraws_before >= len(during)
    per_second = len(during) / streaming_s
    print(f"{len(during)} redraws in {streaming_s:.2f} s of streaming ({result.stats.steps} steps)")
    assert per_second >= 2.0, f"{len(during)} redraws in {streaming_s:.1f} s of streaming"
    # Real redraws: each drew more of the reply than the one before (the plots moved).
    shown = [n for _, n in during]
    assert len(set(shown)) >= 2 * streaming_s - 1 and shown == sorted(shown)
    # And no long pause between two while it streamed.
    gaps = [b - a for (a, _), (b, _) in zip(during, during[1:])]
    assert max(gaps) < 1.0, f"the longest pause between redraws was {max(gaps):.2f} s"


def test_the_pane_never_says_no_run_yet_while_a_reply_runs(qtbot, make_window):
    window = make_window(sampling=SamplingConfig(max_tokens=48))
    charts = window.charts
    said = []  # the summary's text each time the run started, steps came or the charts redrew, while it runs
    running = []

    def note(_=None) -> None:
        if running:
            said.append(charts.summary.text())

    window.controller.sig_run_started.connect(lambda kind: (running.append(kind), note()))
    window.controller.sig_steps.connect(note)
    charts.sig_redrawn.connect(note)
    for _ in range(2):  # the first reply of a window, and one after another
        with qtbot.waitSignal(window.controller.sig_run_finished, timeout=REPLY_TIMEOUT_MS):
            window.send_message("Say hello to the fox.")
        running.clear()
    assert said and not [text for text in said if "No run yet" in text]
    assert "tokens/s" in charts.summary.text()
