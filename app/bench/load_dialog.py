"""`LoadDialog`: Models ▸ Load test…: speculative against plain decoding with B requests in flight.

The article's section 4 made visible: it runs the load sweep (`specdeck-cli bench --concurrency`)
on the pair the window has loaded, on the window's own engine process, as the benchmark dialog
runs a benchmark (the host lends its engine process's client on its worker thread; the sweep
reloads the pair with room for the largest B and restores it after). One run at a time; Cancel
(or closing the dialog) stops it at the engine's next check. The result is the Load view
(load_view.py): speedup and aggregate throughput against B, the break-even B, and in words the
failure mode the numbers show and, with a draft model, what its cache costs in sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QEvent, QSettings, QStandardPaths, Signal, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from app.bench.dialog import describe_config
from app.bench.load_view import LoadView
from app.runtime.engine_controller import EngineController
from app.runtime.worker import GeneratorWorker
from engine import (
    BenchmarkCancelled,
    EngineConfig,
    EngineUnavailable,
    SpecDeckError,
    default_prompts_path,
    load_prompts,
)

BATCHES, CONTEXTS, K_MODE, FIXED_K, MAX_TOKENS = (
    "load/batches",
    "load/contexts",
    "load/k_mode",
    "load/k",
    "load/max_tokens",
)
DEFAULT_BATCHES = "1, 2, 4, 8, 16"
JOB = "load-test"  # the job's name at the engine controller ("load" is its name for loading a pair)
MAX_BATCH = 256
K_MODES = ("automatic and fixed k", "automatic k", "fixed k")  # which speculative modes run beside plain decoding
EXPORTS = (("PNG image", "png"), ("CSV table", "csv"), ("JSON document", "json"))


@dataclass(frozen=True)
class LoadRequest:
    """What the form asks the sweep for: LoadSettings' fields that the form sets (engine/bench/
    load_settings.py; the others keep their defaults there), sent as `to_dict` over the wire."""

    batches: tuple[int, ...]
    contexts: tuple[int, ...] = ()  # () for the prompts as they are
    auto: bool = True  # measure automatic k
    fixed_k: int | None = 4  # and this fixed k (None: not)
    max_tokens: int = 128  # tokens per reply
    requests: int = 0  # requests per run; 0: the prompts, at least 2 B (the sweep's own default)

    def to_dict(self) -> dict:
        """As LoadSettings.to_dict names them (the engine's public API does not export LoadSettings)."""
        return {
            "batches": list(self.batches),
            "contexts": list(self.contexts),
            "k": self.fixed_k or 0,  # 0: no fixed-k mode
            "auto": self.auto,
            "max_tokens": self.max_tokens,
            "requests": self.requests,
        }


def run_load_sweep(client, config: EngineConfig, request: LoadRequest, cancel, report):
    """The one call into the engine: the load sweep on the engine process's pair, the shipped prompts;
    `report` hears (message, fraction). The process holding another pair, or none (a dialog with an
    engine of its own), loads `config` first; the sweep reloads it with room for the largest B and
    loads it back as it was. Returns a LoadSweep."""

    def progress(message: str, fraction: float) -> None:
        report((message, fraction))

    held = client.loaded()
    if held is None or held.config != config:
        client.load(config, progress=progress)
    prompts = load_prompts(default_prompts_path())
    return client.load_sweep(prompts, request, progress=progress, cancel=cancel)


def done_sentence(sweep) -> str:
    """Where speculation stopped paying, for the status line (the view says the rest)."""
    at = sweep.break_even_measured
    mode = getattr(sweep, "break_even_mode", "") or ""
    mode = "" if not mode else ("with automatic k, " if mode == "auto" else f"at {mode.replace('=', ' = ')}, ")
    if at is None:
        return f"{mode}speculation paid at every batch size measured, up to B = {max(sweep.batches)}."
    if at == min(sweep.batches):
        return f"{mode}speculation did not pay at any batch size measured, not even B = {at}."
    return f"{mode}speculation stops paying at B = {at}."


def parse_sizes(text: str, what: str, low: int, high: int) -> tuple[int, ...]:
    """ "1, 2, 4" -> (1, 2, 4), sorted, once each; SpecDeckError saying which entry is wrong."""
    sizes = set()
    for part in text.replace(";", ",").replace(" ", ",").split(","):
        if not part:
            continue
        if not part.isdigit() or not low <= int(part) <= high:
            raise SpecDeckError(f"{what}: {part!r} is not a whole number from {low} to {high:,}.")
        sizes.add(int(part))
    return tuple(sorted(sizes))


class LoadDialog(QDialog):
    sig_finished = Signal(object)
    """A sweep ended: its LoadSweep, or None when it failed or was cancelled."""

    def __init__(self, parent=None, config: EngineConfig | None = None, host: EngineController | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Load test: speculative decoding with many requests at once")
        self.config = config or EngineConfig()
        self.host = host
        self._own_host: EngineController | None = None
        self.worker: GeneratorWorker | None = None
        if parent is not None:
            parent.installEventFilter(self)
        settings = QSettings()
        self.batches_edit = QLineEdit(settings.value(BATCHES, DEFAULT_BATCHES, type=str))
        self.batches_edit.setToolTip(
            "Requests in flight at once: each is measured with plain and speculative decoding."
        )
        self.contexts_edit = QLineEdit(settings.value(CONTEXTS, "", type=str))
        self.contexts_edit.setPlaceholderText("optional, e.g. 512, 4096: the prompts' own lengths when empty")
        self.k_mode = QComboBox()
        self.k_mode.addItems(K_MODES)
        self.k_mode.setCurrentIndex(min(max(settings.value(K_MODE, 0, type=int), 0), len(K_MODES) - 1))
        self.fixed_k = QSpinBox()
        self.fixed_k.setRange(1, 16)
        self.fixed_k.setValue(min(max(settings.value(FIXED_K, 4, type=int), 1), 16))
        self.fixed_k.setPrefix("k = ")
        self.k_mode.currentIndexChanged.connect(lambda i: self.fixed_k.setEnabled(K_MODES[i] != "automatic k"))
        self.fixed_k.setEnabled(K_MODES[self.k_mode.currentIndex()] != "automatic k")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(4, 4096)
        self.max_tokens.setValue(min(max(settings.value(MAX_TOKENS, 128, type=int), 4), 4096))
        self.max_tokens.setSuffix(" tokens")
        draft = QHBoxLayout()
        draft.addWidget(self.k_mode)
        draft.addWidget(self.fixed_k)
        draft.addStretch(1)
        form = QFormLayout()
        self.models_label = QLabel(describe_config(self.config))
        self.models_label.setWordWrap(True)
        form.addRow("Models:", self.models_label)
        form.addRow("Batch sizes B:", self.batches_edit)
        form.addRow("Context lengths:", self.contexts_edit)
        form.addRow("Draft length:", draft)
        form.addRow("Reply length:", self.max_tokens)

        self.run_button = QPushButton("Run", clicked=self.run)
        self.run_button.setDefault(True)
        self.cancel_button = QPushButton("Cancel", clicked=self.cancel, enabled=False)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.export_button = QPushButton("Export…", enabled=False)
        menu = QMenu(self.export_button)
        for name, suffix in EXPORTS:
            menu.addAction(f"{name}…", lambda suffix=suffix: self.export(suffix))
        self.export_button.setMenu(menu)
        close = QPushButton("Close", clicked=self.reject)
        buttons = QHBoxLayout()
        for widget in (self.run_button, self.cancel_button, self.progress):
            buttons.addWidget(widget)
        buttons.addStretch(1)
        buttons.addWidget(self.export_button)
        buttons.addWidget(close)
        self.status = QLabel(
            "Runs the shipped prompts with B requests in flight, plainly and speculatively, for each B: "
            "it shows up to which batch size speculation pays on this machine."
        )
        self.status.setWordWrap(True)
        self.view = LoadView(self)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(self.view, 1)
        screen = (parent.screen() if parent is not None else self.screen()).availableGeometry()
        self.resize(min(1100, screen.width() - 40), min(820, screen.height() - 40))

    @property
    def running(self) -> bool:
        return self.worker is not None

    def request(self) -> LoadRequest:
        """The form as a LoadRequest; SpecDeckError naming the field that is wrong."""
        batches = parse_sizes(self.batches_edit.text(), "Batch sizes", 1, MAX_BATCH)
        if not batches:
            raise SpecDeckError("Batch sizes: give at least one, e.g. 1, 2, 4, 8, 16.")
        contexts = parse_sizes(self.contexts_edit.text(), "Context lengths", 16, 1_048_576)
        mode = K_MODES[self.k_mode.currentIndex()]
        fixed = None if mode == "automatic k" else self.fixed_k.value()
        return LoadRequest(batches, contexts, mode != "fixed k", fixed, self.max_tokens.value())

    def run(self) -> None:
        """Start a sweep with the form's settings (a bad field is reported, nothing starts)."""
        if self.running:
            return
        try:
            request = self.request()
        except SpecDeckError as error:
            self._set_status(str(error), error=True)
            return
        self._remember()
        config = self.config
        self.progress.setValue(0)
        self._set_status(f"Measuring B = {', '.join(map(str, request.batches))}…")
        self._set_running(True)
        host = self.host
        if host is None:
            if self._own_host is None:
                self._own_host = EngineController(self)
            host = self._own_host

        def connect(worker: GeneratorWorker) -> None:
            worker.sig_yielded.connect(self._on_progress)
            worker.sig_returned.connect(self.show_sweep)
            worker.sig_errored.connect(self._on_error)
            worker.sig_finished.connect(lambda: self._on_done(worker))

        def job(client, cancel, report):
            return run_load_sweep(client, config, request, cancel, report)

        try:
            self.worker = host.lend(JOB, config, job, connect, on_server=True)
        except SpecDeckError as error:
            self._on_done()
            self._on_error(error)

    def cancel(self) -> None:
        if self.worker is not None:
            self._set_status("Stopping…")
            self.worker.cancel()

    @Slot(object)
    def _on_progress(self, value) -> None:
        if isinstance(value, EngineConfig):  # the engine process freed the window's pair for the sweep
            if self.host is not None:
                self.host.freed_by_job(value)
            return
        message, fraction = value
        self.status.setText(message)
        self.progress.setValue(round(fraction * 100))

    @Slot(object)
    def show_sweep(self, sweep) -> None:
        """Draw `sweep` (a LoadSweep: this dialog's run's, or one saved by `bench --concurrency --json`)."""
        self.view.show_sweep(sweep)
        self.export_button.setEnabled(True)
        self.progress.setValue(100)
        self._set_status(f"Done: {done_sentence(sweep)}")
        self.sig_finished.emit(sweep)

    @Slot(object)
    def _on_error(self, error: BaseException) -> None:
        if isinstance(error, BenchmarkCancelled) or type(error).__name__.endswith("Cancelled"):
            self._set_status("Cancelled: what was shown before is kept.")
        elif isinstance(error, EngineUnavailable):
            self._set_status(f"{error} Run starts the engine again.", error=True)
        elif isinstance(error, SpecDeckError):
            self._set_status(str(error), error=True)
        else:
            self._set_status(f"Unexpected error ({type(error).__name__}: {error}). Please report it.", error=True)
        self.sig_finished.emit(None)

    def _on_done(self, worker: GeneratorWorker | None = None) -> None:
        if worker is not None and worker is not self.worker:
            return  # a run the dialog let go (closed under it) ended
        self.worker = None
        self._set_running(False)

    def export(self, suffix: str, path=None):
        """Save the view as PNG, CSV or JSON; asks where unless `path` is given. Returns the path or None."""
        if self.view.sweep is None:
            return None
        if path is None:
            folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
            name = dict((s, n) for n, s in EXPORTS)[suffix]
            path, _ = QFileDialog.getSaveFileName(
                self, "Export the load test", f"{folder}/load-test.{suffix}", f"{name} (*.{suffix})"
            )
            if not path:
                return None
        try:
            getattr(self.view, f"export_{suffix}")(path)
        except OSError as error:
            self._set_status(f"Could not write {path}: {getattr(error, 'strerror', None) or error}.", error=True)
            return None
        self._set_status(f"Saved to {path}.")
        return path

    # -- plumbing --------------------------------------------------------------------------

    def _set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        for widget in (self.batches_edit, self.contexts_edit, self.k_mode, self.fixed_k, self.max_tokens):
            widget.setEnabled(not running)
        if not running:
            self.fixed_k.setEnabled(K_MODES[self.k_mode.currentIndex()] != "automatic k")

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet("color: #D55E00" if error else "")
        self.status.setText(text)

    def _remember(self) -> None:
        settings = QSettings()
        settings.setValue(BATCHES, self.batches_edit.text().strip())
        settings.setValue(CONTEXTS, self.contexts_edit.text().strip())
        settings.setValue(K_MODE, self.k_mode.currentIndex())
        settings.setValue(FIXED_K, self.fixed_k.value())
        settings.setValue(MAX_TOKENS, self.max_tokens.value())

    def shutdown(self) -> None:
        """Cancel a running sweep; without a host, stop our own engine process once it has ended."""
        if self.worker is not None:
            self.worker.cancel()
            self.worker = None
        if self._own_host is not None:
            self._own_host.shutdown()
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
