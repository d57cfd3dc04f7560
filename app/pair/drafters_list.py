"""The pair dialog's "Find drafters…": every drafter that could serve the chosen target, ranked, and
every model left out with why (engine/models/discovery.py), one click from being the pair's drafter.

An empty or unexplained draft list is the complaint this answers, so the left-out models are listed
as plainly as the candidates, each with its reason. Discovery reads headers only, yet a store of
many models takes seconds, so it runs on a worker thread and reports through a queued signal, as
the dialog's check does (a generation counter drops stale answers). Measuring (about ten seconds)
runs the candidates in a child process, `specdeck-cli models --drafters-for M --measure --json`,
so that the window's process never loads torch or llama.cpp; the frozen app, which has no
interpreter to give -m, measures in its own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.pair.heads import heads_root, known_heads
from engine import Discovery
from engine import DrafterCandidate as Candidate

MEASURE_SECONDS = 10.0
CHILD_TIMEOUT_S = 600  # loads included; a stuck child must not hold the dialog forever
USE_ROLE = Qt.ItemDataRole.UserRole  # a candidate row's index in the list shown
LINE_CHARS = 86  # the reasons' column at the list's first size


def discover_here(target: str, heads_dirs: list[str]) -> Discovery:
    from engine import discover_drafters

    return discover_drafters(target, heads_dirs=heads_dirs)


def measure_in_child(target: str, heads_dirs: list[str], seconds: float) -> Discovery:
    """The candidates measured by the command line in a child process (see the module doc)."""
    if getattr(sys, "frozen", False):
        from engine import measure_drafters

        return measure_drafters(discover_here(target, heads_dirs), seconds)
    command = [sys.executable, "-m", "engine.cli", "models", "--drafters-for", target, "--measure", "--json"]
    command += ["--measure-seconds", str(seconds), *(x for folder in heads_dirs for x in ("--dir", folder))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RuntimeError(said.removeprefix("error: "))
    return Discovery.from_dict(json.loads(done.stdout))


def app_heads_dirs(settings: QSettings | None) -> list[str]:
    """The heads folders the app knows (trained in it, or under its heads folder)."""
    root = heads_root()
    return [*known_heads(settings), *([str(root)] if root.is_dir() else [])]


def use_candidate(form, candidate: Candidate) -> bool:
    """Make `candidate` the pair form's drafter (with its model or heads folder); False when the form
    lists no such drafter."""
    index = form.drafter.findData(candidate.drafter)
    if index < 0:
        return False
    form.drafter.setCurrentIndex(index)
    if candidate.option:
        form.options[candidate.drafter][candidate.option].set_value(candidate.spec)
    form.sig_key_changed.emit()  # the dialog checks the new pair
    return True


def _lines(text: str) -> str:
    """`text` broken into lines at spaces: a tree's rows do not wrap their text themselves."""
    return textwrap.fill(text, LINE_CHARS, break_long_words=False, break_on_hyphens=False)


class DraftersPanel(QWidget):
    """The ranked candidates and the left-out models of one target, a Use button and a Measure button."""

    sig_found = Signal(object)
    """A discovery or measurement ended: the Discovery shown, or None when it failed (the status says why)."""
    sig_use = Signal(object)
    """The user chose a candidate (a discovery Candidate) to be the pair's drafter."""
    _sig_result = Signal(int, object)  # from the worker thread: generation, Discovery or the error's words

    def __init__(
        self,
        parent=None,
        heads_dirs: Callable[[], list[str]] = list,
        discover: Callable[[str, list[str]], Discovery] = discover_here,
        measure: Callable[[str, list[str], float], Discovery] = measure_in_child,
        measure_seconds: float = MEASURE_SECONDS,
    ) -> None:
        super().__init__(parent)
        self._heads_dirs, self._discover, self._measure = heads_dirs, discover, measure
        self.measure_seconds = measure_seconds
        self.target = ""
        self.found: Discovery | None = None
        self._generation = 0
        self._sig_result.connect(self._on_result, Qt.QueuedConnection)

        self.status = QLabel(self)
        self.status.setWordWrap(True)
        self.tree = QTreeWidget(self)
        self.tree.setColumnCount(2)
        self.tree.setHeaderLabels(["Drafter", "Why"])
        self.tree.setTextElideMode(Qt.TextElideMode.ElideNone)  # a reason is the point of a row: never cut short
        self.tree.setUniformRowHeights(False)  # a reason takes the lines it needs (`_lines`)
        self.tree.setColumnWidth(0, 280)
        self.tree.setAlternatingRowColors(True)  # where one row's lines end and the next's begin
        self.details = QLabel(self)  # the selected row in full: where it is, how to choose it
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.tree.itemDoubleClicked.connect(lambda item, column: self.use(item))
        self.tree.currentItemChanged.connect(lambda item, previous: self._select(item))
        self.use_button = QPushButton("Use as drafter", self)
        self.use_button.setToolTip("Make the selected candidate the pair's drafter (or double-click it)")
        self.use_button.clicked.connect(lambda: self.use(self.tree.currentItem()))
        self.measure_button = QPushButton(f"Measure ({self.measure_seconds:.0f} s)", self)
        self.measure_button.setToolTip(
            "Run each candidate that runs on the target's backend for a share of the time and rank by measured speed"
        )
        self.measure_button.clicked.connect(self.measure)
        for button in (self.use_button, self.measure_button):
            button.setAutoDefault(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.use_button)
        buttons.addWidget(self.measure_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.status)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.details)
        layout.addLayout(buttons)
        self._enable()

    # -- the public API --------------------------------------------------------------

    def find(self, target: str) -> None:
        """List the drafters of `target` (a model spec), on a worker thread."""
        self.target = target
        self._start(f"Looking for drafters for {target}…", lambda: self._discover(target, self._heads_dirs()))

    def measure(self) -> None:
        """Measure the candidates of the target shown (about `measure_seconds`, loads not counted)."""
        if not self.target:
            return
        target, seconds = self.target, self.measure_seconds
        self._start(
            f"Measuring each drafter of {target} for a share of {seconds:.0f} s (the models load first)…",
            lambda: self._measure(target, self._heads_dirs(), seconds),
        )

    def candidate_rows(self) -> list[tuple[str, str]]:
        """(name, why) of each candidate row, best first, as shown."""
        return self._rows(0)

    def left_out_rows(self) -> list[tuple[str, str]]:
        """(name, reason) of each left-out row, as shown."""
        return self._rows(1)

    def use(self, item: QTreeWidgetItem | None) -> None:
        index = item.data(0, USE_ROLE) if item is not None else None
        if index is not None and self.found is not None:
            self.sig_use.emit(self.found.candidates[index])

    def forget(self) -> None:
        """Answers still on their way are dropped (the dialog closed)."""
        self._generation += 1

    # -- work ------------------------------------------------------------------------

    def _start(self, message: str, job: Callable[[], Discovery]) -> None:
        self._generation += 1
        generation = self._generation
        self.status.setText(message)
        self.measure_button.setEnabled(False)

        def run() -> None:  # on the worker thread: never raise, always report
            try:
                answer = job()
            except Exception as error:  # noqa: BLE001 - every failure is said in the status line
                answer = str(error) or type(error).__name__
            try:
                self._sig_result.emit(generation, answer)
            except RuntimeError:
                pass  # the panel was deleted meanwhile

        threading.Thread(target=run, daemon=True, name="drafter-discovery").start()

    def _on_result(self, generation: int, answer) -> None:
        if generation != self._generation:
            return
        if isinstance(answer, Discovery):
            self._show(answer)
        else:
            self.status.setText(f"Could not list the drafters: {answer}")
        self._enable()
        self.sig_found.emit(answer if isinstance(answer, Discovery) else None)

    def _show(self, found: Discovery) -> None:
        self.found = found
        self.tree.clear()
        self.details.clear()
        if found.measured:
            self.status.setText(
                f"Measured for {found.measured_s:.1f} s of decoding on this machine: plain decoding "
                f"{found.vanilla_tokens_per_s:.1f} tokens/s. {found.verdict + ' ' if found.verdict else ''}"
                "Double-click a candidate to use it."
            )
        else:
            self.status.setText(
                f"{found.target} runs on {found.backend}. Ranked by what the files say; Measure ranks by speed. "
                "Double-click a candidate to use it."
            )
        served = QTreeWidgetItem(self.tree, [f"Can serve {found.target} ({len(found.candidates)}), best first"])
        for index, c in enumerate(found.candidates):
            speed = (
                f"{c.speedup:.2f}x plain decoding ({c.tokens_per_s:.1f} tokens/s). " if c.speedup is not None else ""
            )
            note = f"{c.note}. " if c.note else ""
            row = QTreeWidgetItem(served, [f"{index + 1}. {c.name}", _lines(speed + note + c.why)])
            row.setData(0, USE_ROLE, index)
            row.setToolTip(0, f"{c.path or 'needs no files'}\n{c.cli}")
            row.setToolTip(1, speed + note + c.why)
        left = QTreeWidgetItem(self.tree, [f"Left out ({len(found.left_out)})"])
        for x in found.left_out:
            row = QTreeWidgetItem(left, [x.name, _lines(x.reason)])
            row.setToolTip(0, x.path)
            row.setToolTip(1, x.reason)
        for top in (served, left):
            top.setFirstColumnSpanned(True)
            top.setFlags(top.flags() & ~Qt.ItemFlag.ItemIsSelectable)
            top.setExpanded(True)
        self.tree.resizeColumnToContents(0)  # every name whole (nothing is elided), within reason
        self.tree.setColumnWidth(0, min(max(self.tree.columnWidth(0), 200), 360))

    def _rows(self, which: int) -> list[tuple[str, str]]:
        if self.tree.topLevelItemCount() <= which:
            return []
        top = self.tree.topLevelItem(which)
        return [(top.child(i).text(0), top.child(i).text(1).replace("\n", " ")) for i in range(top.childCount())]

    def _select(self, item: QTreeWidgetItem | None) -> None:
        self.details.setText(item.toolTip(1) + "\n" + item.toolTip(0) if item is not None and item.parent() else "")
        self._enable()

    def _enable(self) -> None:
        item = self.tree.currentItem()
        self.use_button.setEnabled(item is not None and item.data(0, USE_ROLE) is not None)
        self.measure_button.setEnabled(self.found is not None and self.target == self.found.target_spec)


class DraftersDialog(QDialog):
    """The panel in a window of its own beside the pair dialog: it stays open while the pair changes."""

    def __init__(self, parent=None, heads_dirs: Callable[[], list[str]] = list, **panel_options) -> None:
        super().__init__(parent)
        self.setWindowTitle("Drafters for this target")
        self.panel = DraftersPanel(self, heads_dirs, **panel_options)
        layout = QVBoxLayout(self)
        layout.addWidget(self.panel)
        self.resize(900, 560)

    def open_for(self, target: str) -> None:
        self.setWindowTitle(f"Drafters for {target}")
        self.panel.find(target)
        self.show()
        self.raise_()

    def done(self, result: int) -> None:
        self.panel.forget()
        super().done(result)


class DraftersButton(QPushButton):
    """ "Find drafters…" beside Check pair: opens the list for the form's target; a candidate used
    there becomes the form's drafter."""

    def __init__(self, form, settings: QSettings | None = None, parent=None, **panel_options) -> None:
        super().__init__("Find drafters…", parent)
        self.form = form
        self.setAutoDefault(False)
        self.setToolTip("Every drafter that could serve the target, ranked, and why the other models are left out")
        self.dialog = DraftersDialog(self.window(), lambda: app_heads_dirs(settings), **panel_options)
        self.dialog.panel.sig_use.connect(lambda candidate: use_candidate(self.form, candidate))
        self.clicked.connect(lambda: self.dialog.open_for(self.form.target.spec()))
        form.target.sig_chosen.connect(self._follow_target)

    def _follow_target(self) -> None:
        """Another target chosen while the list is open: list its drafters instead."""
        if self.dialog.isVisible() and self.form.target.spec() != self.dialog.panel.target:
            self.dialog.open_for(self.form.target.spec())
