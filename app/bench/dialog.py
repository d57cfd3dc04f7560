"""`BenchDialog`: run `specdeck-cli bench` from the app, on the shipped prompts or the user's own.

It benchmarks the model pair the window has loaded (its `EngineConfig`) on the
window's own engine process, never a second copy and never in this process
(which imports no torch): the run goes to the window's engine controller
(`host`), which lends it the engine process's client on its worker thread, in
turn with replies (a running reply is stopped first, so the two never share the
model or the CPU). When the dialog's pair is not the loaded one, the engine
process frees the window's models first and the dialog says so; the window
loads them again when the dialog closes. A dialog with no host (a script)
runs on an engine process of its own, started by its first run and stopped when
it closes. One run at a time; Cancel (or closing the dialog) stops it between
two generations. An engine process that dies under a run ends it with its
own account of how; what the dialog showed stays, and Run starts the engine
again. The result is a bar chart, a table and the three checks in words; the
rows are drawn as each prompt has run in both modes (the engine sends each row as
it is measured), the checks once the run has ended. Export saves everything
measured as JSON, as `--json` does. "Find the best
settings" runs auto-tune (engine/bench/autotune.py) the same way, on the same
prompts with replies of at most 64 tokens, and shows the candidates ranked;
"Use these settings" hands the fastest configuration to `apply_config` (the
window's `apply_pair`, with its current sampling).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QSettings, QStandardPaths, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
)

from app.bench.autotune_view import AutotunePanel
from app.bench.chart import BenchChart
from app.bench.view import BenchTable, checks_html, counted
from app.runtime.engine_controller import EngineController
from app.runtime.worker import GeneratorWorker
from engine import (
    AutotuneResult,
    AutotuneSettings,
    BenchmarkCancelled,
    BenchReport,
    BenchSettings,
    Candidate,
    EngineClient,
    EngineConfig,
    EngineUnavailable,
    PromptSummary,
    SpecDeckError,
    bench_report_so_far,
    count_prompts,
    default_prompts_path,
    load_prompts,
    write_json,
)
from engine.figures import DECODE_SPEEDUP

PROMPTS_FILE, REPEAT, MAX_TOKENS, PEERS = "bench/prompts_file", "bench/repeat", "bench/max_tokens", "bench/peers"
AUTOTUNE_MAX_TOKENS = 64  # auto-tune runs every candidate on every prompt: short replies


class BenchDialog(QDialog):
    sig_finished = Signal(object)
    """A run ended: its BenchReport, or None when it failed or was cancelled."""
    sig_rows_shown = Signal(int)
    """The chart and the table show the rows measured so far (their number) while the run goes on."""
    sig_tuned = Signal(object)
    """An auto-tune ended: its AutotuneResult, or None when it failed or was cancelled."""

    def __init__(
        self,
        parent=None,
        config: EngineConfig | None = None,
        host: EngineController | None = None,
        apply_config: Callable[[EngineConfig], None] | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Benchmark: vanilla against speculative decoding")
        self.config = config or EngineConfig()
        self.host = host  # the window's engine controller: runs go to its engine process, never a second copy
        self._own_host: EngineController | None = None  # no host: ours, with its own engine process, while open
        self.apply_config = apply_config
        self.worker: GeneratorWorker | None = None  # the run given to the host, until it ends
        self._lending = False  # between asking the host for its engine and the run's end
        if host is not None:
            host.sig_unloaded.connect(self._on_window_unloaded)
        self.autotune_candidates: tuple[Candidate, ...] | None = None  # None: all the loaded target allows
        self.report: BenchReport | None = None
        self.rows: dict[str, PromptSummary] = {}  # the running benchmark's rows so far, by prompt (turn) id
        self._job = ""  # "bench" or "autotune": what the running worker does
        if parent is not None:  # the window closing must not leave our thread running
            parent.installEventFilter(self)

        settings = QSettings()
        self.prompts_edit = QLineEdit(settings.value(PROMPTS_FILE, "", type=str))
        self.prompts_edit.setPlaceholderText(
            "the built-in set: prompts that reuse their input, open ones, and conversations"
        )
        browse = QPushButton("Choose…", clicked=self.choose_prompts)
        builtin = QPushButton("Built-in set", clicked=self.prompts_edit.clear)
        files = QHBoxLayout()
        files.addWidget(self.prompts_edit, 1)
        files.addWidget(browse)
        files.addWidget(builtin)
        self.repeat = _spin(1, 20, settings.value(REPEAT, 3, type=int), "")
        self.max_tokens = _spin(4, 4096, settings.value(MAX_TOKENS, 128, type=int), " tokens")
        self.peers = QCheckBox("also run llama-cpp-python or transformers on the same model file (peers)")
        self.peers.setChecked(settings.value(PEERS, False, type=bool))
        form = QFormLayout()
        self.models_label = QLabel(describe_config(self.config))
        self.models_label.setWordWrap(True)  # a long path, or the note that the window's models were freed
        form.addRow("Models:", self.models_label)
        form.addRow("Prompts (JSONL):", files)
        form.addRow("Runs per prompt and mode:", self.repeat)
        form.addRow("Reply length:", self.max_tokens)
        form.addRow("", self.peers)

        self.run_button = QPushButton("Run", clicked=self.run)
        self.run_button.setDefault(True)
        self.autotune_button = QPushButton("Find the best settings", clicked=self.autotune)
        self.autotune_button.setToolTip(
            "Try every drafter this pair's target can serve (heads on disk, its own MTP layers, "
            "the loaded draft model, and the suggested chains) with "
            "a few draft lengths, on these prompts (replies of up to "
            f"{AUTOTUNE_MAX_TOKENS} tokens), and rank them by {DECODE_SPEEDUP.name} "
            "(geometric mean over the prompts, as the benchmark's)"
        )
        self.cancel_button = QPushButton("Cancel", clicked=self.cancel, enabled=False)
        self.export_button = QPushButton("Export JSON…", clicked=lambda: self.export_json(), enabled=False)
        close = QPushButton("Close", clicked=self.reject)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.status = QLabel("Runs every prompt plainly and speculatively, greedy, and compares the speeds.")
        self.status.setWordWrap(True)
        buttons = QHBoxLayout()
        for widget in (self.run_button, self.autotune_button, self.cancel_button, self.progress):
            buttons.addWidget(widget)
        buttons.addStretch(1)
        buttons.addWidget(self.export_button)
        buttons.addWidget(close)

        self.chart = BenchChart(self)
        self.table = BenchTable(self)
        self.checks = QLabel()
        self.checks.setWordWrap(True)
        self.checks.setTextFormat(Qt.TextFormat.RichText)
        results = QSplitter(Qt.Orientation.Vertical)
        results.addWidget(self.chart)
        results.addWidget(self.table)
        self.autotune_panel = AutotunePanel(self)
        self.autotune_panel.sig_apply.connect(self.use_settings)
        self.autotune_panel.hide()  # until auto-tune has run
        results.addWidget(self.autotune_panel)
        results.setSizes([460, 200, 220])
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(results, 1)
        layout.addWidget(self.checks)
        screen = (parent.screen() if parent is not None else self.screen()).availableGeometry()
        self.resize(min(1100, screen.width() - 40), min(820, screen.height() - 40))  # all of it on a 1280x720 screen

    @property
    def running(self) -> bool:
        return self.worker is not None

    # -- running -------------------------------------------------------------------------

    def prompts_path(self) -> Path:
        text = self.prompts_edit.text().strip()
        return Path(text).expanduser() if text else default_prompts_path()

    def choose_prompts(self) -> None:
        start = self.prompts_edit.text() or QStandardPaths.writableLocation(
            QStandardPaths.StandardLocation.DocumentsLocation
        )
        path, _ = QFileDialog.getOpenFileName(
            self, "Benchmark prompts", start, "JSON Lines (*.jsonl *.json);;All files (*)"
        )
        if path:
            self.prompts_edit.setText(path)

    def run(self) -> None:
        """Start a benchmark with the form's settings (a bad prompts file is reported, nothing starts)."""
        if self.running:
            return
        loaded = self._load_prompts()
        if loaded is None:
            return
        path, prompts = loaded
        settings = BenchSettings(
            max_tokens=self.max_tokens.value(), repeat=self.repeat.value(), peers=self.peers.isChecked()
        )
        config = self.config

        def job(client: EngineClient, cancel, report) -> BenchReport:
            return client.bench(
                config,
                prompts,
                settings,
                prompts_source=str(path),
                cancel=cancel,
                progress=lambda message, fraction: report((message, fraction)),
                on_unloaded=report,
                on_row=report,
            )

        self.rows = {}  # a new run draws its own rows from the first
        self._start(job, "bench", self._on_report, f"Benchmarking {count_prompts(prompts)} from {path.name}…")

    def autotune(self) -> None:
        """Start auto-tune on the form's prompts; the ranked candidates replace the last ones."""
        if self.running:
            return
        loaded = self._load_prompts()
        if loaded is None:
            return
        path, prompts = loaded
        settings = AutotuneSettings(max_tokens=min(self.max_tokens.value(), AUTOTUNE_MAX_TOKENS))
        config, candidates = self.config, self.autotune_candidates

        def job(client: EngineClient, cancel, report) -> AutotuneResult:
            return client.autotune(
                config,
                prompts,
                settings,
                candidates=candidates,
                cancel=cancel,
                progress=lambda message, fraction: report((message, fraction)),
                on_unloaded=report,
            )

        self._start(
            job, "autotune", self._on_tuned, f"Finding the best settings on {count_prompts(prompts)} from {path.name}…"
        )

    def _load_prompts(self) -> tuple[Path, tuple] | None:
        """The form's prompt file and its prompts, or None with the error in the status line."""
        try:
            path = self.prompts_path()
            prompts = load_prompts(path)
        except SpecDeckError as error:
            self._set_status(str(error), error=True)
            return None
        self._remember()
        return path, prompts

    def _start(self, job: Callable[[EngineClient, Any, Any], Any], name: str, on_returned, status: str) -> None:
        """`job(client, cancel, report)` on the host's engine process, on the host's worker thread; it
        reports progress as (message, fraction), and the pair the engine process freed for it."""
        self._job = name
        self.progress.setValue(0)
        self._set_status(status)
        self._set_running(True)
        host = self.host
        if host is None:
            if self._own_host is None:
                self._own_host = EngineController(self)
            host = self._own_host

        def connect(worker: GeneratorWorker) -> None:
            worker.sig_yielded.connect(self._on_progress)
            worker.sig_returned.connect(on_returned)
            worker.sig_errored.connect(self._on_error)
            worker.sig_finished.connect(lambda: self._on_done(worker))

        self._lending = True  # from here to the run's end, a freed window pair was freed for it
        try:
            self.worker = host.lend(name, self.config, job, connect, on_server=True)
        except SpecDeckError as error:  # the window is about to load a pair: nothing started
            self._on_done()
            self._on_error(error)

    def cancel(self) -> None:
        if self.running:
            self._set_status("Stopping after the current generation…")
            self._stop()

    def _stop(self) -> None:
        if self.worker is not None:
            self.worker.cancel()  # the client asks the engine process to stop it at its next check

    def _on_window_unloaded(self, freed: EngineConfig) -> None:
        if self._lending:  # freed for this dialog's run
            self.models_label.setText(describe_config(self.config, freed=True))

    @Slot(object)
    def _on_progress(self, value) -> None:
        if isinstance(value, EngineConfig):  # the engine process freed this pair for the run, first
            if self.host is not None:
                self.host.freed_by_job(value)  # the window hears it now, and so does "Models:" (sig_unloaded)
            return
        if isinstance(value, PromptSummary):  # a row just measured: drawn now, not at the end of the run
            if not self.rows:  # the last run's report leaves the screen: its checks and export with it
                self.report = None
                self.checks.clear()
                self.export_button.setEnabled(False)
            self.rows[value.id] = value
            partial = bench_report_so_far(self.rows.values())
            self.chart.show_report(partial)
            self.table.show_report(partial)
            self.sig_rows_shown.emit(len(self.rows))
            return
        message, fraction = value
        self.status.setText(message)
        self.progress.setValue(round(fraction * 100))

    @Slot(object)
    def _on_report(self, report: BenchReport) -> None:
        self.show_report(report)
        self._set_status(
            f"Done: {DECODE_SPEEDUP.name} {report.overall.speedup:.2f}× (geometric mean over "
            f"{counted(len(report.prompts), 'prompt')}, replies of up to {report.settings.get('max_tokens', '?')} "
            f"tokens), outputs identical for {report.overall.identical} of "
            f"{report.overall.prompts}."
        )
        self.sig_finished.emit(report)

    @Slot(object)
    def _on_error(self, error: BaseException) -> None:
        if isinstance(error, BenchmarkCancelled):
            self._set_status("Cancelled: nothing was measured to the end.")
        elif isinstance(error, EngineUnavailable):  # the engine process died (its account) or cannot start
            kept = " The results shown here are kept." if self.report is not None or self.rows else ""
            self._set_status(f"{error}{kept} Run starts the engine again.", error=True)
        elif isinstance(error, SpecDeckError):
            self._set_status(str(error), error=True)
        else:
            self._set_status(f"Unexpected error ({type(error).__name__}: {error}). Please report it.", error=True)
        (self.sig_tuned if self._job == "autotune" else self.sig_finished).emit(None)

    @Slot(object)
    def _on_tuned(self, result: AutotuneResult) -> None:
        self.autotune_panel.show_result(result, can_apply=self.apply_config is not None)
        self.autotune_panel.show()
        best = result.best
        fastest = (
            f"the fastest is {best.candidate.label}, {DECODE_SPEEDUP.name} {best.speedup:.2f}× (geometric "
            f"mean over {result.prompts} prompts, replies of up to {result.max_tokens} tokens)"
            if result.beats_vanilla
            else "none beat plain decoding"
        )
        self._set_status(f"Done: {len(result.ranked)} settings measured; {fastest}.")
        self.sig_tuned.emit(result)

    def use_settings(self, config: EngineConfig) -> None:
        """Apply auto-tune's proposal to the window; later runs here measure it."""
        if self.apply_config is None or self.running:
            return
        self.apply_config(config)
        self.config = config
        self.models_label.setText(describe_config(config))
        self._set_status(f"Using {self.autotune_panel.result.best.candidate.label}: the window loads it.")

    def _on_done(self, worker: GeneratorWorker | None = None) -> None:
        if worker is not None and worker is not self.worker:
            return  # a run the dialog let go (closed under it) ended
        self.worker = None
        self._lending = False
        self._set_running(False)

    def show_report(self, report: BenchReport) -> None:
        self.report = report
        self.chart.show_report(report)
        self.table.show_report(report)
        self.checks.setText(checks_html(report))
        self.export_button.setEnabled(True)

    def export_json(self, path: str | Path | None = None) -> Path | None:
        if self.report is None:
            return None
        if path is None:
            folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
            chosen, _ = QFileDialog.getSaveFileName(
                self, "Export the benchmark", str(Path(folder) / "bench.json"), "JSON document (*.json)"
            )
            if not chosen:
                return None
            path = chosen
        try:
            write_json(self.report, path)
        except OSError as error:
            self._set_status(f"Could not write {path}: {error.strerror or error}.", error=True)
            return None
        self._set_status(f"Saved to {path}.")
        return Path(path)

    # -- plumbing --------------------------------------------------------------------------

    def _set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.autotune_button.setEnabled(not running)
        self.autotune_panel.apply_button.setEnabled(
            not running and self.apply_config is not None and self.autotune_panel.result is not None
        )
        self.cancel_button.setEnabled(running)
        for widget in (self.prompts_edit, self.repeat, self.max_tokens, self.peers):
            widget.setEnabled(not running)

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet("color: #D55E00" if error else "")
        self.status.setText(text)

    def _remember(self) -> None:
        settings = QSettings()
        settings.setValue(PROMPTS_FILE, self.prompts_edit.text().strip())
        settings.setValue(REPEAT, self.repeat.value())
        settings.setValue(MAX_TOKENS, self.max_tokens.value())
        settings.setValue(PEERS, self.peers.isChecked())

    def shutdown(self) -> None:
        """Cancel a running benchmark: on the host's engine it ends there and the host's shutdown
        waits for it; without a host, our own engine process is stopped once the run has ended
        (this blocks until the current generation ends)."""
        if self.worker is not None:
            self.worker.cancel()
            self.worker = None
        self._lending = False
        if self._own_host is not None:
            self._own_host.shutdown()  # a closed controller starts nothing: the next run makes another
            self._own_host.deleteLater()
            self._own_host = None
        self._set_running(False)

    def done(self, result: int) -> None:  # every way of closing a dialog ends here
        self.shutdown()
        super().done(result)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt API
        if watched is self.parent() and event.type() == QEvent.Type.Close:
            self.shutdown()
        return False


def _spin(low: int, high: int, value: int, suffix: str) -> QSpinBox:
    spin = QSpinBox()
    spin.setRange(low, high)
    spin.setValue(min(max(value, low), high))
    spin.setSuffix(suffix)
    return spin


def describe_config(config: EngineConfig, freed: bool = False) -> str:
    """The form's "Models:" line; `freed`: the window held another pair, freed for this one."""
    drafter = f"draft model {config.draft}" if config.draft else f"{config.drafter} drafter"
    backend = "" if config.backend == "auto" else f", {config.backend}"
    if freed:
        return (
            f"{config.target}{backend} · {drafter} · k {config.k} (not the window's pair: its models were "
            "freed first, to hold one copy at a time, and load again when this dialog closes)"
        )
    return f"{config.target}{backend} · {drafter} · k {config.k} (the pair loaded in the window)"
