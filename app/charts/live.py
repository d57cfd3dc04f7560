"""`LiveCharts`: six live panels that show how a speculative run is going, and why.

Decoding must never wait for drawing. `add_step` only appends a row to a ring buffer
and arms a single-shot timer; the redraw runs at most ~25 times a second, and not at
all while nothing new arrives (an idle app does not wake up 25 times a second for
nothing), nor while the charts are hidden (their dock closed: about half of what the
window takes while a reply streams), catching up once shown. While steps stream in,
the plots move at least every SLOWEST_REDRAW_MS (more than twice a second), on every machine:
the window exists to show the run as it happens. Faster than that, the charts keep to a
budget: their redraws (the data, the panels and their painting) may take REDRAW_BUDGET
of a core, or SHARED_CORES_BUDGET where the window's own engine decodes on the CPU the
window runs on (`set_sharing_cores`: each millisecond of drawing there costs the reply
about two), so the interval between redraws follows what the last ones cost
(`RedrawPace`) between REDRAW_MS and SLOWEST_REDRAW_MS. What keeps two redraws a second
affordable on two cores is what a redraw does: `setData` on the items each panel made
once, nothing re-added, ranges that move in steps (`Panel.fit`) so most redraws repaint
no axis (cached), unchanged data not handed to pyqtgraph again (`set_curve`), and the
summary line's rich text laid out again at most every SUMMARY_MS (a relayout, which also
invalidates the panels' layout). Between `begin_run` and a run's first
step the summary says a run is starting, never "No run yet". Call everything from the
GUI thread: the main window gets steps from its worker through a queued signal.

Panels (three columns when wide, two when tall):
  tokens per second | per-token acceptance a     | draft tokens accepted per step
  draft length k    | where the time goes        | theory: E[tokens per step] and speedup vs a
  acceptance per draft position (per Medusa head, per tree depth), across the last row
The draft length panel shows a tree drafter's tree size and accepted length
per step instead. Lookahead and early exit add the drafter panel (two plots:
the n-gram pool and its hits, or the exit layer and each exit's acceptance)
beside the last panel, or on a row of its own when only one column is left.
`set_drafter` says which drafter is loaded; copies of its statistics and of the
cost model, which the engine took right after each step, come with the step's
record (`StepEvent.drafter_stats` and `costs`), so nothing here reads the engine
while it decodes.
A remote server (llama-server, vLLM, SGLang) sends neither, nor p and q: what the
charts cannot show for it is said in sentences under the summary (`set_notes`).
"""

from __future__ import annotations

import csv
import html
import json
import os
import time

from PySide6.QtCore import QBuffer, QIODevice, QPoint, QRect, Qt, QTimer, Signal
from PySide6.QtGui import QPainter, QPalette
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from app.charts.data import COLUMNS, DRAFTER_COLUMNS, Run, chart_series, drafter_view, stats_text
from app.charts.drafter_panels import DrafterPanel
from app.charts.panel import RUN_COLOURS, Panel
from app.charts.run_panels import (
    AcceptancePanel,
    DepthPanel,
    DraftLengthPanel,
    HistogramPanel,
    ThroughputPanel,
    TimeSplitPanel,
)
from app.charts.theory import TheoryPanel
from engine import CostModel, CostSnapshot, StepEvent, figures

REDRAW_MS = 40  # 25 Hz at most: smooth to the eye
# More than two redraws a second while steps arrive, whatever drawing costs, on every machine: steps
# reach the window every 0.25 s on a CPU, so the plots move at every second hand-over (2.5 times a
# second), with room for a GUI thread that a busy machine wakes late (at 0.45 s: 2.0 a second there).
SLOWEST_REDRAW_MS = 400
FIRST_REDRAW_MS = 200  # until a redraw has been measured
REDRAW_BUDGET = 0.015  # of one core: what the charts' redraws may take while a reply streams, faster than that
# The budget while the window's own engine decodes on the cores the window runs on, where each
# millisecond of drawing costs the reply about two: redraws faster than SLOWEST_REDRAW_MS only when cheap.
SHARED_CORES_BUDGET = 0.005
SUMMARY_MS = 1000  # the summary line's numbers, at most this often (each costs a relayout)


class RedrawPace:
    """The interval between redraws that keeps the charts' cost near `budget` of a core.

    A redraw's cost is the GUI thread's CPU time it took: its data, its panels, and the
    painting of the panels since the redraw before. The interval is that cost over the
    budget, halfway there from the last interval each time (one slow frame, a resize or a
    first paint, moves it less), within REDRAW_MS..slowest_ms. It carries over from
    reply to reply: a reply's first redraw comes at the pace the last one settled at, which
    a short reply would not have time to find.

    Only the charts' own cost is paced: the reply's text and the steps' bookkeeping cost the
    same at any pace. While a reply streams, the engine decodes on every core it found free,
    so each millisecond the window takes is one the engine loses (llama.cpp's threads wait
    for each other at every operation: more than one). A redraw costs several times more on a
    2-core machine whose cores both decode than on a quiet one (docs/benchmarks.md, "Measurements behind the code"): there the cap,
    slowest_ms, decides the pace, and the redraw's own cost is what is left to make small.
    """

    def __init__(self, budget: float = REDRAW_BUDGET, slowest_ms: int = SLOWEST_REDRAW_MS) -> None:
        self.budget = budget
        self.slowest_ms = slowest_ms  # the longest interval, whatever a redraw costs
        self.interval_ms = FIRST_REDRAW_MS
        self._measured = False

    def set_budget(self, budget: float, slowest_ms: int) -> None:
        """A new budget and cap, from now on: a measured interval is scaled to it at once (the same
        cost over the new budget), not found again over the next redraws."""
        if self._measured:
            interval = self.interval_ms * self.budget / budget
            self.interval_ms = round(min(max(interval, REDRAW_MS), slowest_ms))
        self.budget, self.slowest_ms = budget, slowest_ms

    def redrawn(self, cost_s: float) -> int:
        """Call after a redraw with its cost (CPU seconds); returns the interval before the next one, in ms."""
        wanted = 1000 * max(cost_s, 0.0) / self.budget
        interval = wanted if not self._measured else (self.interval_ms + wanted) / 2
        self._measured = True
        self.interval_ms = round(min(max(interval, REDRAW_MS), self.slowest_ms))
        return self.interval_ms


LABELS = ("speculative", "vanilla")


class LiveCharts(QWidget):
    sig_redrawn = Signal()
    """The panels now show everything added so far (emitted after each redraw)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._runs: dict[str, Run] = {}
        self._costs: CostSnapshot | CostModel | None = None  # what the theory is drawn from; the charts' own
        self._drafter: str | None = None  # EngineConfig.drafter of the loaded engine
        self._dirty = False
        self._running = False  # between begin_run and end_run
        self.redraws = 0  # how many times the panels were drawn (the tests and docs/bench/app_speed.py read it)
        self._redrawn_at = float("-inf")  # time.monotonic() of the last redraw
        self._summary_at = float("-inf")  # and of the summary's last new text
        self._summary_had_stats = False  # whether that text gave a run's numbers
        self.throughput = ThroughputPanel(self)
        self.acceptance = AcceptancePanel(self)
        self.histogram = HistogramPanel(self)
        self.draft_length = DraftLengthPanel(self)
        self.time_split = TimeSplitPanel(self)
        self.theory = TheoryPanel(self)
        self.depth = DepthPanel(self)
        self.drafter = DrafterPanel(self)  # hidden unless the drafter has numbers of its own
        self.panels = (
            self.throughput,
            self.acceptance,
            self.histogram,
            self.draft_length,
            self.time_split,
            self.theory,
            self.depth,
            self.drafter,
        )
        # Steps share their x axis: zooming one zooms the other.
        self.draft_length.plot.setXLink(self.acceptance.plot)
        # One line above the panels names the run colours once for all of them and
        # gives the headline numbers, so the panels need no per-run legends.
        self.summary = QLabel(self)
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.RichText)
        self.summary.setContentsMargins(6, 2, 6, 2)
        self.summary.setToolTip(
            figure_tips(
                figures.DRAFT_ACCEPTANCE, figures.ACCEPTANCE_LENGTH, figures.PREDICTED_SPEEDUP, figures.DECODE_SPEEDUP
            )
        )
        # What the engine's numbers cannot show (a remote server's), in its own words; set per pair.
        self.notes = QLabel(self)
        self.notes.setWordWrap(True)
        self.notes.setTextFormat(Qt.PlainText)
        self.notes.setContentsMargins(6, 0, 6, 2)
        self.notes.hide()
        self._notes: tuple[str, ...] = ()
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(2)
        outer.addWidget(self.summary)
        outer.addWidget(self.notes)
        self._grid = QGridLayout()
        self._grid.setSpacing(4)
        outer.addLayout(self._grid, 1)
        self._columns = 0
        self._arrange(3)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(REDRAW_MS)
        self._timer.timeout.connect(self._redraw_if_shown)
        self.pace = RedrawPace()
        self._painted_before = 0.0  # the panels' painting CPU time, in all, at the last redraw
        # The headline numbers cost a hundredth of a redraw: they follow the steps at their own pace.
        self._summary_timer = QTimer(self)
        self._summary_timer.setSingleShot(True)
        self._summary_timer.setInterval(SUMMARY_MS)
        self._summary_timer.timeout.connect(self._show_summary)
        self.redraw()  # empty axes and the theory curve before any step

    # -- feeding -------------------------------------------------------------------

    def set_sharing_cores(self, sharing: bool) -> None:
        """Whether the engine decodes on the cores this window runs on (engine_controller.shares_cores): the
        redraws then keep to SHARED_CORES_BUDGET of a core instead of REDRAW_BUDGET, and still
        come at least every SLOWEST_REDRAW_MS."""
        self.pace.set_budget(SHARED_CORES_BUDGET if sharing else REDRAW_BUDGET, SLOWEST_REDRAW_MS)
        self._timer.setInterval(self.pace.interval_ms)

    def reset(self) -> None:
        """Forget every run (a new generation starts)."""
        self._runs.clear()
        for panel in self.panels:
            panel.clear_data()
        for plot in self._all_panels():
            plot.unfit()
        self._schedule()

    def begin_run(self) -> None:
        """A run starts (the window's sig_run_started): forget the last one, and say at once that this
        one is starting. Its first step comes after the prompt is read, which on a busy CPU takes a
        second or more; until then the summary said "No run yet", or the last reply's numbers."""
        self._running = True
        self.reset()
        self._show_summary()

    def end_run(self) -> None:
        """The run ended (finished, stopped or failed): a run with no step is "No run yet" again."""
        self._running = False
        if not self._runs:
            self._show_summary()

    def add_step(self, label: str, event: StepEvent) -> None:
        """Record one step of the run `label` ("speculative" or "vanilla": a record's own is
        `event.run`). Cheap: draws nothing.

        The drafter's statistics and the cost model the step carries are copies the engine took
        right after it, on the thread that decodes (never read the drafter or the engine's
        CostModel from here while a worker decodes); its cost snapshot replaces the one drawn from."""
        if label not in LABELS:
            raise ValueError(f"unknown run label {label!r}: use one of {', '.join(LABELS)}")
        run = self._runs.get(label)
        if run is None or (event.index == 0 and len(run.steps)):
            # Step 0 of a label that already has steps is a new run without a reset():
            # start that label over rather than join two runs into one curve.
            run = self._runs[label] = Run()
        run.add(event)
        if event.costs is not None:
            self._costs = event.costs
        # A run that is over has its last steps drawn now, not at the next pace.
        self._schedule(at_once=event.finish_reason is not None)

    def add_steps(self, steps) -> None:
        """Record a batch of steps (the engine's records, as the engine controller hands them over)."""
        for step in steps:
            self.add_step(step.run, step)

    def set_drafter(self, kind: str | None, backend: str | None = None) -> None:
        """The loaded drafter (EngineConfig.drafter: "eagle", "lookahead", "early-exit",
        "medusa", "ngram", "model", "none") and the target's backend: names the depth bars,
        draws trees as trees where the backend verifies them (llama.cpp verifies a tree's best
        branch: a chain), and shows the drafter panel where the drafter has one."""
        self._drafter = kind
        view = drafter_view(kind, backend)
        self.depth.set_label(view.depth_label)
        self.draft_length.set_tree(view.tree)
        self.drafter.set_kind(view.panel)
        self._arrange(self._columns, force=True)
        self._schedule()

    @property
    def drafter_kind(self) -> str | None:
        return self._drafter

    def set_depth_label(self, label: str) -> None:
        """Name the depth bars: "head" (Medusa heads), "depth" (tree drafters) or "position" (chains)."""
        self.depth.set_label(label)
        self._schedule()

    def set_notes(self, notes: tuple[str, ...]) -> None:
        """Sentences about what the loaded engine's numbers cannot show (e.g. a remote server's: no
        p and q, no cost model), shown under the summary until the next pair; () for none."""
        self._notes = tuple(notes)
        self.notes.setText("\n".join(self._notes))
        self.notes.setVisible(bool(self._notes))
        self._schedule()

    @property
    def shown_notes(self) -> tuple[str, ...]:
        return self._notes

    def set_cost_model(self, costs: CostSnapshot | CostModel | None) -> None:
        """The cost model to draw the theory from until a step brings a newer snapshot. Each redraw
        reads it and nothing here changes it; hand over one that no other thread updates (the
        window: the loaded pair's CostSnapshot, never the engine's own model)."""
        self._costs = costs
        self._schedule()

    # -- drawing -------------------------------------------------------------------

    def series(self) -> dict:
        """The data the panels draw (after the next redraw, if steps arrived since the last)."""
        return chart_series(self._runs, self._costs, drafter=self._drafter)

    def redraw(self) -> None:
        """Draw everything added so far now (the timer calls this; so does export_png)."""
        started = time.thread_time()
        self._timer.stop()
        self._dirty = False
        data = self.series()
        self.theory.set_costs(self._costs)  # its batch axis reads T(rows) at the B the user picks
        for panel in self.panels:
            panel.show_series(data)
            # pyqtgraph fits auto ranges while it paints, and a range that moves there asks for a
            # second paint: fitted now, each panel is painted once per redraw (half the cost).
            for plot in getattr(panel, "plots", (panel,)):
                plot.plot.getViewBox().prepareForPaint()
        # The summary's numbers change at every step, but each new text lays the panels out again:
        # at most every SUMMARY_MS, and at once when a run ends (its final numbers), when its first
        # step comes or when the runs were forgotten.
        ended = any(run.finish_reason is not None for run in self._runs.values())
        since_ms = 1000 * (time.monotonic() - self._summary_at)
        if ended or bool(data["stats"]) != self._summary_had_stats or since_ms >= SUMMARY_MS * 0.95:
            self._show_summary(data)
        elif not self._summary_timer.isActive():  # the numbers of these steps, if no redraw comes before
            self._summary_timer.start(round(SUMMARY_MS - since_ms))
        painted = sum(panel.painted_s for panel in self._all_panels())
        cost = time.thread_time() - started + painted - self._painted_before
        self._painted_before = painted
        self._timer.setInterval(self.pace.redrawn(cost))
        self.redraws += 1
        self._redrawn_at = time.monotonic()
        self.sig_redrawn.emit()

    def _all_panels(self) -> list[Panel]:
        """Every plot, the drafter panel's too (made the first time its drafter is loaded)."""
        return self.findChildren(Panel)

    def _show_summary(self, data: dict | None = None) -> None:
        self._summary_timer.stop()
        self._summary_at = time.monotonic()
        data = self.series() if data is None else data
        self._summary_had_stats = bool(data["stats"])
        text = summary_html(data, self.palette().color(QPalette.ColorRole.Text).name(), self._notes, self._running)
        if text != self.summary.text():
            self.summary.setText(text)
            self._fit_summary()

    def _schedule(self, at_once: bool = False) -> None:
        self._dirty = True
        if not self._shown():
            return  # drawn when shown again (showEvent): a hidden dock costs the engine nothing
        if at_once:
            self._timer.start(0)
        elif not self._timer.isActive():
            # The pace counts from the last redraw, not from these steps: steps that come every
            # 0.25 s would otherwise put off a redraw due in 0.1 s by a whole interval.
            since_ms = 1000 * (time.monotonic() - self._redrawn_at)
            self._timer.start(max(0, round(self.pace.interval_ms - since_ms)))

    def _fit_summary(self, shrink: bool = False) -> None:
        """Give the summary line the height its text needs, growing only (unless `shrink`): a
        height that follows every new number re-lays the panels out and repaints them all,
        which took as long again as the redraw itself."""
        needed = self.summary.heightForWidth(max(1, self.summary.width()))
        if needed > 0 and (needed > self.summary.maximumHeight() or shrink):
            self.summary.setFixedHeight(needed)

    def _shown(self) -> bool:
        """Whether a redraw would be seen: the charts are on screen, or their window has not been
        shown at all (a widget being exported, or tested). Hidden in a shown window (the user
        closed the dock, another tab is in front), they draw nothing, and draw it all once shown."""
        window = self.window()
        if window.isVisible():
            return self.isVisible()
        return window is self or self.isVisibleTo(window)

    def _redraw_if_shown(self) -> None:
        if self._shown():
            self.redraw()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._dirty:
            self._timer.start(0)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_summary(shrink=True)
        # Beside a chat pane the charts are often taller than wide: 2 columns then.
        size = event.size()
        self._arrange(3 if size.width() >= 1.15 * size.height() else 2)

    def _arrange(self, columns: int, force: bool = False) -> None:
        if columns == self._columns and not force:
            return
        self._columns = columns
        for panel in self.panels:
            self._grid.removeWidget(panel)
        positions = grid_positions(len(self.panels) - 1, columns, self.drafter.active)
        for row, column, span, panel in positions:
            self._grid.addWidget(self.panels[panel], row, column, 1, span)
        self.drafter.setVisible(self.drafter.active)
        used = 1 + max(row for row, *_ in positions)
        for r in range(max(self._grid.rowCount(), used)):
            self._grid.setRowStretch(r, 1 if r < used else 0)
        for c in range(3):
            self._grid.setColumnStretch(c, 1 if c < columns else 0)

    def visible_panels(self) -> tuple:
        """The panels in the layout now (the drafter panel only where the drafter has one)."""
        return self.panels if self.drafter.active else self.panels[:-1]

    # -- exports -------------------------------------------------------------------

    def export_png(self, path: str | os.PathLike) -> None:
        """The six panels as they look now (pending steps drawn first)."""
        if self._dirty:
            self.redraw()
        if not self.grab().save(os.fspath(path), "PNG"):
            raise OSError(f"Could not write the image {os.fspath(path)}: check the folder exists and is writable.")

    def export_svg(self, path: str | os.PathLike) -> list[str]:
        """Each panel on its own, drawn as vectors: `path`'s name plus the panel's title
        ("charts.svg" -> "charts-tokens-per-second.svg", ...); returns the files written.

        pyqtgraph's SVGExporter cannot read the paths Qt 6.12's SVG generator writes (it
        raises on every panel), so the panels' scenes are painted into QSvgGenerator directly.
        """
        if self._dirty:
            self.redraw()
        path = os.fspath(path)
        stem = path[: -len(".svg")] if path.lower().endswith(".svg") else path
        written = []
        for panel in self.visible_panels():
            for plot in getattr(panel, "plots", (panel,)):  # the drafter panel holds two plots
                name = f"{stem}-{_slug(plot.full_title)}.svg"
                with open(name, "wb") as f:
                    f.write(panel_svg(plot))
                written.append(name)
        return written

    def _export_columns(self) -> tuple[str, ...]:
        """COLUMNS, then the drafter's columns that some run has numbers for."""
        filled = {name for run in self._runs.values() for name in run.drafter_columns()}
        return COLUMNS + tuple(name for name in DRAFTER_COLUMNS if name in filled)

    def export_csv(self, path: str | os.PathLike) -> None:
        """One row per step and run: the run label, then chart_data.COLUMNS and the drafter's
        columns (lookahead: pool_size, pool_jacobi, pool_text, pool_steps, pool_hits; early
        exit: exit_layer), empty where a run has no such number."""
        columns = self._export_columns()
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(("run",) + columns)
            for label, run in self._runs.items():
                for row in run.rows(columns):
                    writer.writerow([label] + ["" if row[name] is None else row[name] for name in columns])

    def export_json(self, path: str | os.PathLike) -> None:
        """The run's numbers: final RunStats, the drafter's last statistics and per-step rows per
        label, the cost model's view, per-depth acceptance and the theory's numbers."""
        series = self.series()
        theory = series["theory"]
        depth = series["depth"]
        costs = self._costs
        columns = self._export_columns()
        document = {
            "columns": list(columns),
            "drafter": self._drafter,
            "runs": {
                label: {
                    "stats": run.stats.as_dict(),
                    "finish_reason": run.finish_reason,
                    "drafter_stats": None if run.drafter_stats is None else run.drafter_stats.as_dict(),
                    "steps": run.rows(columns),
                }
                for label, run in self._runs.items()
            },
            "cost_model": None
            if costs is None
            else {
                "verify_s": {str(n): s for n, s in costs.snapshot().verify_s},
                "draft_s_per_token": costs.draft_s_per_token,
            },
            "depth_acceptance": {
                "label": self.depth.label,
                "depth": [int(d) for d in depth["depth"]],
                "tested": [int(t) for t in depth["tested"]],
                "accepted": [int(a) for a in depth["accepted"]],
            },
            "theory": {
                "k": theory["k"],
                "break_even_acceptance": theory["break_even"],
                "measured": theory["measured"],
                "measured_speedup": theory["measured_speedup"],
            },
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=2, default=_plain)


def _plain(value):
    """A drafter's number JSON does not know (a numpy or torch scalar): as a plain number or text."""
    try:
        return value.item()
    except (AttributeError, ValueError):
        return str(value)


def grid_positions(n: int, columns: int, drafter: bool) -> list[tuple[int, int, int, int]]:
    """(row, column, column span, panel index) for n panels in `columns` columns, then, when
    `drafter`, the drafter panel (index n). The last panel takes what is left of its row;
    the drafter panel (two plots side by side) goes beside it where two columns or more are
    left, else on a row of its own across all columns."""
    out = [[*divmod(i, columns), 1, i] for i in range(n)]
    row, column = divmod(n - 1, columns)
    left = columns - column - 1
    if drafter and left >= 2:
        out.append([row, column + 1, left, n])
    else:
        out[-1][2] = columns - column
        if drafter:
            out.append([row + 1, 0, columns, n])
    return [tuple(p) for p in out]


def drafter_summary(drafter: dict | None) -> str:
    """One line on the drafter's own numbers: the tree drafters' in words (lookahead and early exit
    have their panel's titles); a drafter the charts were not written for, its statistics that
    are not charted, with their labels and units (stats_text)."""
    if not drafter or not drafter.get("stats"):
        return ""
    s, kind = drafter["stats"], drafter.get("kind")
    try:
        if kind in ("eagle", "eagle3"):
            name = "EAGLE-3" if kind == "eagle3" else "EAGLE"
            return (
                f"{name}: last tree {s['nodes']} nodes, {s['depth']} deep; draft vocabulary "
                f"{s['draft_vocab']:,}; calibration {s['calibration']:.2f}"
            )
        if kind == "medusa":
            return f"Medusa: {s['heads']} heads, last tree {s['nodes']} nodes"
    except (KeyError, TypeError, ValueError):  # a drafter that reports other numbers: say nothing
        return ""
    return "" if kind in DrafterPanel.KINDS else stats_text(kind, s)  # a panel of its own: its titles say it


def panel_svg(panel) -> bytes:
    """A chart panel as an SVG document of its size, drawn as on screen."""
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    generator = QSvgGenerator()
    generator.setResolution(panel.logicalDpiX())  # at its default 72 dpi, text in points comes out too small
    generator.setOutputDevice(buffer)
    size = panel.viewport().size()
    generator.setSize(size)
    generator.setViewBox(QRect(QPoint(0, 0), size))
    generator.setTitle(panel.full_title)
    painter = QPainter(generator)
    panel.render(painter)
    painter.end()
    return bytes(buffer.data())


def figure_tips(*shown: figures.Figure) -> str:
    """A tooltip naming each figure a widget shows and what it is (Help ▸ What the numbers mean has more)."""
    return "<br>".join(f"<b>{html.escape(f.name.capitalize())}</b>: {html.escape(f.tip)}" for f in shown)


def _slug(title: str) -> str:
    words = "".join(c.lower() if c.isalnum() else " " for c in title).split()
    return "-".join(words) or "panel"


def summary_html(series: dict, text_colour: str, shown_notes: tuple[str, ...] = (), running: bool = False) -> str:
    """The headline numbers: throughput per run, acceptance, measured vs predicted speedup, break-even;
    the run's notes but those `shown_notes` (said under the summary already). `running`: a run has
    started (its first step may not have come yet)."""
    stats = series["stats"]
    if not stats and running:
        return f"<span style='color:{text_colour}'>Reading the prompt: the charts fill in from the first step.</span>"
    if not stats:
        return f"<span style='color:{text_colour}'>No run yet: the charts fill in as tokens are generated.</span>"
    parts = []
    for label in LABELS:
        s = stats.get(label)
        if s is None:
            continue
        text = f"<b style='color:{RUN_COLOURS[label]}'>■ {label}</b> {s.tokens_per_s:.1f} tokens/s"
        if s.drafted:  # the figures llama.cpp and LM Studio print, under engine/figures.py's names
            text += f", {figures.draft_acceptance_text(s)}, {figures.acceptance_length_text(s)}"
            measured = series["theory"]["measured"]
            if measured and abs(measured[1] - s.tokens_per_step) >= 0.005:  # some steps did not draft (auto k)
                text += f" ({measured[1]:.2f} on the steps that drafted)"
        parts.append(text)
    t = series["theory"]
    if t["measured_speedup"]:
        parts.append(f"{figures.DECODE_SPEEDUP.name} {t['measured_speedup'][1]:.2f}× measured")
    if "speculative" in stats and stats["speculative"].tested:
        parts.append(f"{figures.PREDICTED_SPEEDUP.name} {stats['speculative'].predicted_speedup:.2f}×")
    line = " &nbsp;·&nbsp; ".join(parts)
    drafter = drafter_summary(series.get("drafter"))
    if drafter:
        line += f"<br>{html.escape(drafter)}"
    spec = stats.get("speculative")
    for note in getattr(spec, "notes", ()) if spec is not None else ():  # the engine's own words, as text
        if note not in shown_notes:
            line += f"<br>{html.escape(note)}"
    if t["speedup"] is not None and t["break_even"] is None:
        # The article's failure mode 2, with this machine's numbers.
        why = f"verifying {t['k'] + 1} tokens costs {t['verify_ratio']:.1f} plain steps"
        if t["draft_ratio"] >= 0.01:
            why += f" and drafting one costs {t['draft_ratio']:.2f}"
        line += f"<br>No break-even at k = {t['k']}: {why}, so no per-token acceptance a makes drafting pay."
    return f"<span style='color:{text_colour}'>{line}</span>"
