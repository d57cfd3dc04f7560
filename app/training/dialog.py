"""`TrainDialog`: train Medusa heads or an EAGLE head for a target, watching the loss and
each head's (EAGLE: each depth's) agreement.

The training is the engine's (engine.training.train_heads), and it runs in the
engine process, never in this one (which imports no torch): this dialog picks
its settings and hands the run to the window's engine controller (`host`),
which lends it the engine process's client on its worker thread, in turn with
everything else the window asks of its engine; every step comes back from the
server and is drawn here. A training loads its own target, so the engine
process frees the window's pair first (the window says so, and loads it again
once the run has ended). Start first reads the output folder there, off the GUI
thread, for a saved run to resume (and its curves). Cancel stops after the
current step and saves a checkpoint, so Start on the same folder can resume
exactly; closing the dialog while training does the same, then closes. An
engine process that dies under a run ends it with its own account of how; the
checkpoints saved before stay on disk, and Start (which starts the engine
again) resumes the last one. When a run finishes, its folder becomes the pair
dialog's heads of that kind (Models ▸ Model pair…), and "Use in model pair…"
opens that dialog with the new heads selected. A saved run of another kind (or
other settings) is not resumed: the engine's message says so and the run is
kept. A dialog with no host (a script) runs on an engine process of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from PySide6.QtCore import QCoreApplication, QSettings, Qt, Signal
from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QMessageBox, QProgressBar, QPushButton, QVBoxLayout

from app.pair.heads import remember_trained
from app.runtime.engine_controller import EngineController
from app.runtime.worker import GeneratorWorker
from app.shell import settings as keys
from app.training.charts import TrainingCharts
from app.training.form import TrainForm, command_line
from engine import EngineClient, EngineConfig, EngineUnavailable, SpecDeckError, resolve

TITLES = {"medusa": "Train Medusa heads", "eagle": "Train an EAGLE head", "eagle3": "Train an EAGLE-3 head"}
CHECK, TRAIN = "train-heads-check", "train-heads"  # the two jobs Start gives the host, in turn


class TrainDialog(QDialog):
    sig_finished = Signal(object)
    """A run ended: its TrainResult (finished or cancelled), or None when it failed."""

    def __init__(
        self,
        parent=None,
        target: str | None = None,
        settings: QSettings | None = None,
        host: EngineController | None = None,
    ) -> None:
        """`host`: the window's engine controller, whose engine process trains; without one the
        dialog makes its own (with an engine process of its own) at the first Start."""
        super().__init__(parent)
        self.setWindowTitle(TITLES["medusa"])
        self.settings = settings if settings is not None else QSettings()
        self.host = host
        self._own_host: EngineController | None = None
        self.worker: GeneratorWorker | None = None  # the job given to the host (reading the folder, training)
        self.result = None  # the last run's TrainResult
        self._run_kind = "medusa"  # the kind of heads the last run started trains
        self._out_dir = ""  # where the last run started saves
        self._saved_step: int | None = None  # the step of that run's newest checkpoint on disk, if any
        self._close_when_done = False

        self.form = TrainForm(target or keys.engine_config().target, self)

        self.progress = QProgressBar(self)
        self._show_steps(self.form.steps.value())  # "0 / 500 steps" from the start, as Steps says
        self.form.steps.valueChanged.connect(self._show_steps)
        self.status = QLabel("Choose a target and data, then press Start.", self)
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # engine messages are text, never markup
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.charts = TrainingCharts(self)
        self.charts.setMinimumHeight(220)
        self.form.sig_kind_changed.connect(self._kind_changed)

        self.start_button = QPushButton("Start", self)
        self.start_button.setDefault(True)
        self.cancel_button = QPushButton("Cancel training", self)
        self.cancel_button.setToolTip("Stop after the current step; a checkpoint is saved and Start resumes it")
        self.use_button = QPushButton("Use in model pair…", self)
        self.close_button = QPushButton("Close", self)
        for button in (self.cancel_button, self.use_button, self.close_button):
            button.setAutoDefault(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        buttons.addWidget(self.use_button)
        buttons.addWidget(self.close_button)

        layout = QVBoxLayout(self)
        layout.addWidget(self.form)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.charts, 1)
        layout.addLayout(buttons)

        self.start_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel_training)
        self.use_button.clicked.connect(self.use_in_pair)
        self.close_button.clicked.connect(self.reject)
        app = QCoreApplication.instance()
        if app is not None:  # quitting mid-step: stop, save the checkpoint, then let the app go
            app.aboutToQuit.connect(self.shutdown)

        self._set_running(False)
        self.use_button.setEnabled(False)
        self.resize(920, 720)

    # -- running -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether Start's work is under way: reading the folder, or training."""
        return self.worker is not None

    def start(self) -> None:
        """Read the output folder on the engine process (a saved run: resume it?), then train."""
        if self.running:
            return
        try:
            options = self.form.options()
        except SpecDeckError as error:
            self._show_status(str(error), error=True)
            return
        before = (self.status.text(), self.status.styleSheet())  # said again when nothing starts after all
        out_dir = options["out_dir"]
        self._saved_step = None

        def read(client: EngineClient, cancel, report):  # a file read: it answers while the engine works
            return client.checkpoint(out_dir)

        def found(worker: GeneratorWorker, answer) -> None:
            if worker.cancelled:  # cancelled or closed while reading: nothing starts
                self._show_status(*before)
                return
            self._train(options, *answer, before)

        self._show_status(f"Looking for a saved run in {out_dir}…")
        self._lend(CHECK, options, read, found)

    def _train(self, options: dict, saved, history: dict, before: tuple[str, str]) -> None:
        """Start `options`' run, after asking about the run `saved` in its folder (None: there is none)."""
        resume = False
        if saved is not None:
            answer = self.ask_resume(saved)
            if answer is None:
                self._show_status(*before)
                return
            resume = answer == "resume"
        self.charts.set_kind(options["kind"], options["objective"])
        self.charts.reset()
        if resume:
            try:
                self.charts.load_history(history["loss"], history["head_accuracy"])
            except (KeyError, TypeError):
                pass  # the run resumes anyway; only its earlier curve is missing
        self.result = None
        self.use_button.setEnabled(False)
        self.progress.setRange(0, options["steps"])
        self.progress.setValue(saved.step if resume and saved is not None else 0)
        self._run_kind, self._out_dir = options["kind"], options["out_dir"]
        self._saved_step = saved.step if resume and saved is not None else None
        command = command_line(options)

        def train(client: EngineClient, cancel, report):
            # The pair freed for the training is reported like a step (an EngineConfig, not a TrainProgress).
            return client.train(
                options, resume=resume, command=command, progress=report, cancel=cancel, on_unloaded=report
            )

        self._show_status("Resuming…" if resume else "Starting…")
        self._lend(TRAIN, options, train, lambda worker, result: self._on_result(result))

    def _lend(
        self,
        name: str,
        options: dict,
        job: Callable[[EngineClient, Any, Any], Any],
        on_returned: Callable[[GeneratorWorker, Any], None],
    ) -> None:
        """`job(client, cancel, report)` on the host's engine process, on the host's worker thread."""
        host = self.host
        if host is None:
            if self._own_host is None:
                self._own_host = EngineController(self)
            host = self._own_host

        def connect(worker: GeneratorWorker) -> None:
            worker.sig_yielded.connect(self._on_progress)
            worker.sig_returned.connect(lambda value: on_returned(worker, value))
            worker.sig_errored.connect(self._on_error)
            worker.sig_finished.connect(lambda: self._on_worker_done(worker))

        self._set_running(True)
        try:
            self.worker = host.lend(name, EngineConfig(target=options["target_spec"]), job, connect, on_server=True)
        except SpecDeckError as error:  # the window is about to load a pair: nothing started
            self.worker = None
            self._set_running(False)
            self._on_error(error)

    def ask_resume(self, saved) -> str | None:
        """ "resume", "restart" or None (cancel) for a folder that holds a saved run."""
        box = QMessageBox(
            QMessageBox.Icon.Question,
            self.windowTitle(),
            f"This folder holds a training run at step {saved.step} of {saved.steps}.",
            parent=self,
        )
        box.setInformativeText("Resume it, or start over (the heads trained so far are replaced)?")
        resume = box.addButton("Resume", QMessageBox.ButtonRole.AcceptRole)
        restart = box.addButton("Start over", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(resume)
        box.exec()
        return {resume: "resume", restart: "restart"}.get(box.clickedButton())

    def cancel_training(self) -> None:
        if self.running:
            self.worker.cancel()  # the client asks the engine process to stop after the current step
            self.cancel_button.setEnabled(False)
            if self.worker.name == TRAIN:
                self._show_status("Stopping after the current step; a checkpoint is being saved…")

    def shutdown(self) -> None:
        """Cancel the run (the app is quitting): it saves its checkpoint and ends in the engine
        process, whose host waits for it (the window's shutdown; ours, here, without a window)."""
        if self.worker is not None:
            self.worker.cancel()
        if self._own_host is not None:
            self._own_host.shutdown()  # waits for the run's thread, then stops our engine process
            self._own_host.deleteLater()
            self._own_host = None

    # -- reports from the worker ---------------------------------------------------------

    def _on_progress(self, event) -> None:
        if isinstance(event, EngineConfig):  # the engine process freed the window's pair for the training
            (self.host or self._own_host).freed_by_job(event)  # the window knows now, and loads it again after
            return
        if event.phase == "checkpoint":
            self._saved_step = event.step
        if event.phase == "train":
            self.progress.setFormat("%v / %m steps")  # after the target's own replies, counted as replies
            self.progress.setRange(0, event.steps)
            self.progress.setValue(event.step)
            self.charts.add(event.step, event.loss, event.head_accuracy)
            heads = " ".join(f"{a:.0%}" for a in event.head_accuracy)
            eta = _duration(event.eta_s) if event.eta_s else "—"
            self._show_status(
                f"Step {event.step} of {event.steps} · loss {event.loss:.3f} · top-1 per "
                f"{self.charts.unit} {heads} · {event.tokens_per_s:.0f} tokens/s · about {eta} left"
            )
        elif event.phase == "generate":
            self.progress.setRange(0, max(event.steps, 1))
            self.progress.setFormat("%v / %m replies")
            self.progress.setValue(event.step)
            self._show_status(event.message)
        elif event.message:
            self.progress.setFormat("%v / %m steps")
            self._show_status(event.message + ("…" if event.phase in ("data", "load", "validate") else ""))

    def _on_result(self, result) -> None:
        self.result = result
        if result.cancelled:
            self._show_status(
                f"Cancelled at step {result.step} of {result.steps}. A checkpoint is saved in "
                f"{result.out_dir}: press Start to resume."
            )
        else:
            kind = self._run_kind
            remember_trained(result.out_dir, self.settings, kind)
            unit = self.charts.unit
            accuracy = ", ".join(f"{unit} {k} {a:.0%}" for k, a in enumerate(result.head_accuracy, 1))
            one = {"eagle": "EAGLE head", "eagle3": "EAGLE-3 head"}.get(kind)
            what, drafter = (one, one) if one else ("heads", "Medusa heads")
            self._show_status(
                f"Done: {result.step} steps, {what} saved in {result.out_dir}. Held-out top-1 "
                f"agreement with the target: {accuracy}. Choose {'it' if one else 'them'} "
                f"in Models ▸ Model pair… (drafter: {drafter})."
            )
            self.use_button.setEnabled(True)
        self.sig_finished.emit(result)

    def _on_error(self, error: BaseException) -> None:
        training = self.worker is not None and self.worker.name == TRAIN
        if isinstance(error, EngineUnavailable) and training:  # the engine process died under it (its account)
            if self._saved_step is not None:  # the engine may have saved a later one since it last said so
                kept = (
                    f"The run's checkpoint (step {self._saved_step} or later) is kept in {self._out_dir}: Start "
                    "resumes it."
                )
            else:
                kept = f"Start looks in {self._out_dir} for a checkpoint to resume (none was reported yet)."
            message = f"{error} {kept}"
        elif isinstance(error, SpecDeckError):
            message = str(error)
        else:  # a bug, not a bad setting: still a message, not a traceback
            message = f"Training failed: {type(error).__name__}: {error}"
        self._show_status(message, error=True)
        self.sig_finished.emit(None)

    def _on_worker_done(self, worker: GeneratorWorker) -> None:
        if worker is not self.worker:
            return  # the folder's reading, once the training it led to has started
        self.worker = None
        self._set_running(False)
        if self._close_when_done:
            self._close_when_done = False
            super().reject()

    # -- the rest of the window ------------------------------------------------------------

    def use_in_pair(self) -> None:
        """Open the main window's pair dialog with these heads chosen (nothing loads until Load)."""
        window = self.parent()
        if self.result is None or not hasattr(window, "choose_models"):
            return
        window.choose_models()
        pair = getattr(window, "pair_dialog", None)
        if pair is None:
            return
        config = pair.engine_config()
        target = self.form.target.spec()
        backend = config.backend
        if backend == "llama.cpp" or (backend == "auto" and _is_gguf(target)):
            backend = "torch"  # heads read hidden states: PyTorch only
        config = replace(config, target=target, backend=backend)
        pair.set_config(config.with_drafter(self._run_kind, heads=self.result.out_dir))

    def reject(self) -> None:
        if self.running:  # stop first (the checkpoint is saved), then close
            self._close_when_done = True
            self.cancel_training()
            return
        super().reject()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt API
        if self.running:
            event.ignore()
            self.reject()
            return
        super().closeEvent(event)

    def _kind_changed(self, kind: str) -> None:
        self.setWindowTitle(TITLES[kind])  # the charts follow at Start: until then they show the last run

    def _show_steps(self, steps: int) -> None:
        """The bar before a run: none of the form's steps done (a run in progress keeps its own count)."""
        if self.worker is not None:
            return
        self.progress.setFormat("%v / %m steps")
        self.progress.setRange(0, steps)
        self.progress.setValue(0)

    def _set_running(self, running: bool) -> None:
        self.form.set_running(running)
        self.start_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)

    def _show_status(self, text: str, error: bool | str = False) -> None:
        """`error`: True for an error's colour, or a style sheet to put back."""
        self.status.setStyleSheet(error if isinstance(error, str) else "color: #D55E00;" if error else "")
        self.status.setText(text)


def _is_gguf(spec: str) -> bool:
    try:
        return resolve(spec).kind == "gguf"
    except SpecDeckError:
        return False


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 1:
        return f"{max(1, round(seconds))} s"
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
