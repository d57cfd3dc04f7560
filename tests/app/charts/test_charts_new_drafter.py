"""A drafter from one new module reaches the charts: the statistics its spec charts become step
columns, curves in the drafter panel and export columns; the others a line of words. No chart
file names it: the registry's stats type says what to draw.

The spec module goes on `engine.drafters.__path__` before the charts are imported (their columns
are the registry's when app.charts.data loads), so the charts run in a child process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

TOY_SPEC = '''
"""A toy drafter with statistics of its own: two charted, one in words."""

from dataclasses import dataclass

from engine.drafters.registry import DrafterSpec, DrafterStats, stat


@dataclass(frozen=True)
class ToyOptions:
    pass


@dataclass(frozen=True)
class ToyStats(DrafterStats):
    echoes: int = stat(label="Echoes proposed", unit="tokens")
    pool_size: int = stat(label="Echo pool", unit="tokens")  # lookahead charts a pool_size too
    longest: int = stat(label="Longest echo", unit="tokens", chart=False)


DRAFTER = DrafterSpec(name="toy", label="Toy echo", summary="Proposes the last token again.",
                      options=ToyOptions, make=lambda target, options, load: None,
                      preflight=lambda ctx, options: [], stats=ToyStats)
'''

CHILD = """
import dataclasses, json, sys
import engine.drafters as package
package.__path__.append(sys.argv[1])
from PySide6.QtWidgets import QApplication
application = QApplication([])
import app  # noqa: F401
from app.charts.data import DRAFTER_COLUMNS
from app.charts.live import LiveCharts
from tests.app.charts.test_charts import make_run

charts = LiveCharts()
charts.resize(1000, 700)
charts.set_drafter("toy")
toy = sys.modules["engine.drafters.toy_spec"].ToyStats
for i, event in enumerate(make_run([(4, 4, 2)] * 6)):
    stats = toy(echoes=2 * i, pool_size=10 + i, longest=7)
    charts.add_step("speculative", dataclasses.replace(event, drafter_stats=stats))
charts.redraw()
charts.export_csv(sys.argv[2])
plots = charts.drafter.plots
print(json.dumps({
    "columns": DRAFTER_COLUMNS,
    "active": charts.drafter.active,
    "plots": [type(p).__name__ for p in plots],
    "title": plots[0].plot.titleLabel.text if plots else "",
    "legend": [label.text for _, label in plots[0].legend.items] if plots else [],
    "curves": {name: [float(v) for v in curve.yData] for name, curve in plots[0].curves.items()} if plots else {},
    "summary": charts.summary.text(),
}))
"""


def test_a_new_drafters_charted_statistics_are_drawn_and_exported(tmp_path):
    folder = tmp_path / "more_drafters"
    folder.mkdir()
    (folder / "toy_spec.py").write_text(TOY_SPEC, encoding="utf-8")
    csv_path = tmp_path / "steps.csv"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(folder), str(csv_path)],
        cwd=ROOT,
        env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])

    # Today's columns first, then the toy's; its pool_size is qualified, lookahead keeps the name.
    assert shown["columns"][:8] == [
        "match_length",
        "draft_size",
        "pool_size",
        "pool_jacobi",
        "pool_text",
        "pool_steps",
        "pool_hits",
        "exit_layer",
    ]
    assert shown["columns"][8:] == ["echoes", "toy_pool_size", "drafted_by"]  # a chain's: after every drafter
    assert shown["active"] and shown["plots"] == ["StatsPanel"] and shown["title"] == "Toy echo"
    assert shown["legend"] == ["Echoes proposed", "Echo pool"]
    assert shown["curves"] == {"echoes": [0, 2, 4, 6, 8, 10], "toy_pool_size": [10, 11, 12, 13, 14, 15]}
    assert "Toy echo: Longest echo 7 tokens" in shown["summary"]
    header = csv_path.read_text().splitlines()[0].split(",")
    assert header[-2:] == ["echoes", "toy_pool_size"] and "pool_size" not in header  # lookahead's stays empty
