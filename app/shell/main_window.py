"""The main window: the views, the engine controller, and what connects them.

Layout: the toolbar, and on its line the pair bar (target, drafter, draft model,
k: a change loads); a banner for messages, then tabs (Chat, Side by side); the
saved conversations in a dock on the left and the live charts in a dock on the
right; the loaded models and loading progress in the status bar. A different
pair loaded clears the charts and the side by side (`_start_clean`).

The window loads the engine (in the engine process its controller starts, or
on the server the pair dialog chose: `keys.EngineChoice`), runs comparisons,
feeds every step to the charts, and remembers its settings; the chat's
bookkeeping (which conversation, what is saved when) is ChatSession's.
Every error reaches the user through `show_error`: a banner that leaves the
window usable. An engine process that dies
is one more error: the banner says how it ended, the chat keeps what it showed,
and the next Send starts the engine again.

The window always starts: an unusable conversation folder gives a store that
keeps nothing (and says so), and unreadable settings fall back to their defaults
(and the banner names them).
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer
from PySide6.QtGui import QCloseEvent, QShowEvent
from PySide6.QtWidgets import (
    QDockWidget,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.bench.dialog import BenchDialog
from app.bench.load_dialog import LoadDialog
from app.charts.live import LiveCharts
from app.chat.compare_view import CompareView
from app.chat.conversation_panel import ConversationPanel
from app.chat.conversations import ConversationStore, StoreError, default_data_dir, is_valid_id
from app.chat.session import ChatSession
from app.chat.view import ChatView
from app.pair.dialog import PairDialog
from app.pair.heads import engine_notes
from app.pair.model_drop import ModelDrops
from app.pair.pair_bar import PairBar
from app.runtime.engine_controller import CHAT, COMPARE, EngineController
from app.runtime.remote import ServerPair
from app.shell import settings as keys
from app.shell.actions import create_actions
from app.shell.banner import Banner
from app.shell.file_dialogs import Exports
from app.training.dialog import TrainDialog
from engine import (
    EngineConfig,
    EngineProcess,
    LoadedPair,
    RunStats,
    SamplingConfig,
    drafter_spec,
    is_drafter,
)

log = logging.getLogger(__name__)


def describe_engine(loaded: LoadedPair | ServerPair, choice: keys.EngineChoice = keys.LOCAL) -> str:
    """The status bar's summary of what is loaded, and where when it is not the window's own engine."""
    if isinstance(loaded, ServerPair):  # llama-server, vLLM, SGLang: the server's own words
        return loaded.describe()
    where = f" · on the SpecDeck server at {choice.url}" if choice.remote else ""
    config, info = loaded.config, loaded.target
    # By its registry spec's short name: "n-gram drafter", "suffix decoding, then draft model".
    drafter = drafter_spec(config.drafter).short if is_drafter(config.drafter) else config.drafter
    if loaded.speculative and config.drafter == "model" and config.draft:
        drafter = f"draft {config.draft}"
    placement = f", {info.placement}" if info.placement else ""  # llama.cpp's GPU layers, PyTorch on MPS
    # PyTorch on a GPU: which forward runs, and that CUDA graphs are opt-in (engine/backends/hf/static.py).
    forward = f", {info.forward}" if info.backend == "torch" and info.device != "cpu" and info.forward else ""
    return f"{info.name} ({info.dtype}, {info.backend}{placement}{forward}) · {drafter} · k {config.k}{where}"


class MainWindow(QMainWindow):
    def __init__(self, store: ConversationStore | None = None, engine_process: EngineProcess | None = None) -> None:
        """`engine_process`: the engine process to use and leave running on close (the tests share
        one between windows); by default the window starts its own and stops it on close."""
        super().__init__()
        problems = []  # said in the banner once the window is built
        if store is None:
            try:
                store = ConversationStore(default_data_dir())
            except StoreError as error:
                store = ConversationStore.in_memory()
                problems.append(f"Conversations are kept only until SpecDeck closes. {error}")
        self.store = store
        self.controller = EngineController(self, process=engine_process)
        self._resets: list[str] = []  # settings keys that were unreadable and fell back to their defaults
        saved_pair = keys.engine_config(resets=self._resets)  # start() loads it
        self._sampling = keys.sampling_config(resets=self._resets)
        self._run_kind: str | None = None
        self._compare_sampling = self._sampling  # what the running comparison was started with
        self._shut_down = False
        self._save_failure = ""  # the banner's text while it shows a failed save
        self.pair_dialog = None  # the model pair dialog while it is open
        self.train_dialog: TrainDialog | None = None  # made on first use; it stays while training runs
        self._freed: EngineConfig | None = None  # the pair freed for a benchmark or a training, to load again
        self._engine_stopped = ""  # the banner's text while it says the engine process stopped
        self._shown_pair = None  # (where, which pair) the charts and the side by side show runs of
        self._last_reply: RunStats | None = None  # Help ▸ What the numbers mean works the formula through with it

        self.banner = Banner()
        self.chat_view = ChatView()
        self.compare_view = CompareView()
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.chat_view, "Chat")
        self.tabs.addTab(self.compare_view, "Side by side")
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 0)
        layout.addWidget(self.banner)
        layout.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

        self.conversation_panel = ConversationPanel()
        self.chats = ChatSession(self.store, self.controller, self.chat_view, self.conversation_panel, self)
        self.charts = LiveCharts()
        left, right = Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea
        self.conversations_dock = self._dock("Conversations", self.conversation_panel, left)
        self.charts_dock = self._dock("Live charts", self.charts, right)

        self.engine_label = QLabel("No model loaded")
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setMaximumWidth(160)
        self.progress.hide()
        self.statusBar().addPermanentWidget(self.progress)
        self.statusBar().addPermanentWidget(self.engine_label)

        self.actions = create_actions(self, (self.conversations_dock, self.charts_dock))
        # The pair bar, on the toolbar's line: above the chat, and as wide as the window (the chat
        # between the docks is ~580 px wide at 1280 px).
        self.pair_bar = PairBar(self.controller.preflight)
        self.pair_bar.set_config(saved_pair)
        pair_toolbar = QToolBar("Model pair bar", self)
        pair_toolbar.setObjectName("pair_bar")  # saveState() needs names
        pair_toolbar.setMovable(False)
        pair_toolbar.addWidget(self.pair_bar)
        self.addToolBar(pair_toolbar)
        self.exports = Exports(self, self.charts)
        self._connect()
        self._connect_actions()
        self._restore_settings()
        self.sampling = self._sampling  # shows the summary
        self._set_ready(False, "Loading the model…")
        self._show_start_problems(problems)
        self._keep_banner = bool(self.banner.text())  # until the user or a later load replaces it
        self.drops = ModelDrops(self, self.open_with_model, lambda message: self.statusBar().showMessage(message, 8000))
        self.drops.watch(self)  # a read-only view (the transcript) passes its drops up to here
        for composer in (self.chat_view.composer, self.compare_view.prompt):  # these take other files as text
            self.drops.watch(composer.viewport(), only_models=True)  # a scroll area gets drops on its viewport

    @property
    def sampling(self) -> SamplingConfig:
        """The sampling settings chat replies and comparisons use (from the model pair dialog)."""
        return self._sampling

    @sampling.setter
    def sampling(self, sampling: SamplingConfig) -> None:
        self._sampling = sampling
        self.compare_view.set_sampling(sampling)  # it says what its runs use: these, made greedy

    # -- start-up and settings -----------------------------------------------------------

    def start(self, config: EngineConfig | None = None, choice: keys.EngineChoice | None = None) -> None:
        """Load the model pair from the settings (on a first start: the embedded model), where the
        settings say (on a first start: the window's own engine process)."""
        self.load_engine(config or keys.engine_config(), choice or keys.engine_choice())

    def _dock(self, title: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(title.lower().replace(" ", "_"))  # saveState() needs names
        # Opaque: a label inside that changes (the charts' summary, each second of a reply) then
        # repaints only itself, not the dock too, whose title bar Qt's Fusion style draws by
        # loading its button icons from files again at every paint.
        widget.setAutoFillBackground(True)
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def _restore_settings(self) -> None:
        settings, resets = QSettings(), self._resets
        geometry = keys.read(settings, keys.GEOMETRY, QByteArray(), resets)
        if geometry.isEmpty() or not self.restoreGeometry(geometry):
            if not geometry.isEmpty():  # bytes, but not a geometry Qt wrote
                keys.reset(keys.GEOMETRY, resets)
            self._default_geometry()
        # Dock sizes only take once the window has its size: see showEvent.
        state = keys.read(settings, keys.WINDOW_STATE, QByteArray(), resets)
        self._first_show = state.isEmpty() or not self.restoreState(state)
        if self._first_show and not state.isEmpty():
            keys.reset(keys.WINDOW_STATE, resets)
        tab = keys.read(settings, keys.CURRENT_TAB, 0, resets)
        if not 0 <= tab < self.tabs.count():
            tab = 0
            keys.reset(keys.CURRENT_TAB, resets)
        self.tabs.setCurrentIndex(tab)
        self.actions.colour_tokens.setChecked(keys.read(settings, keys.COLOUR_TOKENS, True, resets))
        self.actions.markdown.setChecked(keys.read(settings, keys.MARKDOWN, True, resets))
        self._set_markdown(self.actions.markdown.isChecked())
        self.chats.default_system_prompt = keys.read(settings, keys.DEFAULT_SYSTEM_PROMPT, "", resets)
        current = keys.read(settings, keys.CURRENT_CONVERSATION, "", resets)
        if current and not is_valid_id(current):  # e.g. a path: never handed to the store
            current = ""
            keys.reset(keys.CURRENT_CONVERSATION, resets)
        for key in resets:  # said once: the next start reads the defaults (or what this session saves)
            settings.remove(key)
        self.chats.open(current or None)

    def _show_start_problems(self, problems: list[str]) -> None:
        """The banner at start: what could not be used, what was reset, what opening the store found."""
        if self._resets:
            problems.append(keys.describe_resets(self._resets))
        opened = self.banner.text()  # what opening the store and the restored conversation found
        notes = problems + ([opened] if opened else [])
        if notes:
            self.banner.show_message(" ".join(notes), "error" if problems else "info", self._offer_salvage())

    def _default_geometry(self) -> None:
        screen = self.screen().availableGeometry()
        self.resize(min(1440, int(screen.width() * 0.9)), min(900, int(screen.height() * 0.9)))

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt API
        super().showEvent(event)
        if self._first_show:
            self._first_show = False
            self._default_dock_sizes()

    def _default_dock_sizes(self) -> None:
        # The six chart panels need room (two columns of three); the chat list needs little.
        width = self.width()
        self.resizeDocks(
            [self.conversations_dock, self.charts_dock],
            [max(170, width // 8), int(width * 0.4)],
            Qt.Orientation.Horizontal,
        )

    def _save_settings(self) -> None:
        settings = QSettings()
        settings.setValue(keys.GEOMETRY, self.saveGeometry())
        settings.setValue(keys.WINDOW_STATE, self.saveState())
        settings.setValue(keys.CURRENT_TAB, self.tabs.currentIndex())
        settings.setValue(keys.COLOUR_TOKENS, self.actions.colour_tokens.isChecked())
        settings.setValue(keys.MARKDOWN, self.actions.markdown.isChecked())
        conversation = self.chats.conversation
        settings.setValue(keys.CURRENT_CONVERSATION, conversation.id if conversation else "")
        settings.sync()

    def _connect(self) -> None:
        c = self.controller
        c.sig_load_progress.connect(self._on_load_progress)
        c.sig_load_started.connect(self._on_load_started)
        c.sig_engine_stopped.connect(self._on_engine_stopped)
        c.sig_loaded.connect(self._on_loaded)
        c.sig_load_failed.connect(self._on_load_failed)
        c.sig_run_started.connect(self._on_run_started)
        c.sig_unloaded.connect(self._on_unloaded)
        c.sig_steps.connect(self._on_steps)
        c.sig_run_finished.connect(self._on_run_finished)
        c.sig_busy_changed.connect(self._on_busy_changed)
        c.sig_error.connect(self.show_error)
        self.pair_bar.sig_pair_chosen.connect(lambda config: self.apply_pair(config, self.sampling))
        self.pair_bar.sig_more_requested.connect(self._more_pair_settings)
        self.chats.sig_save_failed.connect(self._on_save_failed)
        self.chats.sig_save_recovered.connect(self._on_save_recovered)
        self.chats.sig_notice.connect(self._show_store_notice)
        self.chat_view.sig_send_requested.connect(self.send_message)
        self.chat_view.sig_stop_requested.connect(self.controller.stop)
        self.compare_view.sig_run_requested.connect(self.run_comparison)
        self.compare_view.sig_stop_requested.connect(self.controller.stop)
        self.chats.sig_title_changed.connect(self.setWindowTitle)
        self.conversation_panel.sig_delete_requested.connect(self.confirm_delete)
        self.conversation_panel.sig_export_requested.connect(self.export_markdown)
        self.chat_view.legend.toggle.toggled.connect(self.actions.colour_tokens.setChecked)
        self.actions.colour_tokens.toggled.connect(self._set_colours)
        self.chat_view.markdown.toggled.connect(self.actions.markdown.setChecked)
        self.actions.markdown.toggled.connect(self._set_markdown)
        self.chat_view.sig_regenerate_requested.connect(self.regenerate)
        self.chat_view.sig_edit_submitted.connect(self.edit_and_resend)
        self.chat_view.sig_system_prompt_edited.connect(self.set_system_prompt)
        self.exports.sig_exported.connect(lambda message: self.statusBar().showMessage(message, 5000))
        self.exports.sig_failed.connect(self.show_error)

    def _connect_actions(self) -> None:
        a = self.actions
        a.new_chat.triggered.connect(self.new_chat)
        a.rename.triggered.connect(self.conversation_panel.edit_current)
        a.delete.triggered.connect(lambda: self.chats.conversation and self.confirm_delete(self.chats.conversation.id))
        a.export_markdown.triggered.connect(lambda: self.export_markdown())
        for kind in ("png", "svg", "csv", "json"):
            getattr(a, f"export_{kind}").triggered.connect(lambda _=False, kind=kind: self.exports.charts(kind))
        a.quit.triggered.connect(self.close)
        a.salvage.triggered.connect(self.chats.salvage)
        a.choose_models.triggered.connect(self.choose_models)
        a.stop.triggered.connect(self.controller.stop)
        a.regenerate.triggered.connect(lambda: self.regenerate())
        a.system_prompt.triggered.connect(self.chat_view.edit_system_prompt)
        a.benchmark.triggered.connect(lambda: self.open_benchmark())
        a.load_test.triggered.connect(lambda: self.open_load_test())
        a.train_heads.triggered.connect(lambda: self.open_training())

    # -- the engine --------------------------------------------------------------------

    def load_engine(self, config: EngineConfig, choice: keys.EngineChoice | None = None) -> None:
        """Load `config` where `choice` says (default: where the last load did)."""
        self._freed = None
        if not self._keep_banner:  # a new load clears the old one's messages, not what start-up found
            self.banner.hide()
        self._keep_banner = False
        self._set_ready(False, "Loading the model…")
        self.engine_label.setText("Loading…")
        self.progress.setValue(0)
        self.progress.show()
        self.controller.load(config, choice)

    def choose_models(self) -> None:
        """Open the model pair dialog; on OK, reload with its models and use its sampling settings."""
        if self.pair_dialog is not None:  # already open: bring it forward rather than open a second
            self.pair_dialog.raise_()
            self.pair_dialog.activateWindow()
            return
        # The check runs in the engine process: this one never imports torch or llama.cpp.
        dialog = self.pair_dialog = PairDialog(self, settings=QSettings(), check=self.controller.preflight)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(
            lambda: self.apply_pair(dialog.engine_config(), dialog.sampling_config(), dialog.engine_choice())
        )
        dialog.finished.connect(self._forget_pair_dialog)
        dialog.open()  # window-modal: the rest of the app (other windows, the tray) stays usable

    def _more_pair_settings(self) -> None:
        """The pair bar's More…: the dialog, on the bar's choice (one it refused, too: the dialog says all of why)."""
        opened = self.pair_dialog is None
        self.choose_models()
        shown = self.pair_bar.config()
        if opened and shown != self.pair_dialog.engine_config():  # an open dialog keeps what the user set there
            self.pair_dialog.set_config(shown)

    def _forget_pair_dialog(self) -> None:
        self.pair_dialog = None

    def open_with_model(self, path: str, role: str = "target") -> None:
        """A model dropped on the window: the pair dialog opens with it as the target (Shift: the draft)."""
        self.choose_models()
        self.pair_dialog.use_model(path, role)

    def apply_pair(
        self, config: EngineConfig, sampling: SamplingConfig, choice: keys.EngineChoice | None = None
    ) -> None:
        """Use this pair and sampling, where `choice` says (default: where the window runs now)."""
        choice = choice or self.controller.choice
        keys.set_engine_config(config)
        keys.set_sampling_config(sampling)
        keys.set_engine_choice(choice)
        self.sampling = sampling
        loaded = self.controller.loaded
        # On llama-server, vLLM or SGLang the server's pair is used whatever the dialog's says.
        same = loaded is not None and choice == self.controller.choice and (choice.adapter or loaded.config == config)
        if not same:
            self.load_engine(config, choice)

    def _on_load_started(self, config: EngineConfig) -> None:
        """A load began: asked for here, or the controller's own after the engine process stopped."""
        self.pair_bar.set_config(config)
        self.pair_bar.set_remote(self.controller.choice.remote)
        self.pair_bar.set_busy(True)  # said before the controller's busy signal, which comes after this one
        self._set_ready(False, "Loading the model…")
        self.engine_label.setText("Loading…")
        if not self.progress.isVisible():
            self.progress.setValue(0)
            self.progress.show()

    def _on_load_progress(self, message: str, fraction: float) -> None:
        self.progress.setValue(round(fraction * 100))
        self.statusBar().showMessage(f"{message}…" if fraction < 1 else message)

    def _on_engine_stopped(self, message: str) -> None:
        """The engine process died (the banner says how, through sig_error): Send starts it again."""
        self._engine_stopped = message
        self.progress.hide()
        self.engine_label.setText("Engine stopped")
        self._set_ready(True)  # the next Send starts it again

    def _on_loaded(self, config: EngineConfig | None) -> None:
        loaded = self.controller.loaded
        self.progress.hide()
        self.engine_label.setText(describe_engine(loaded, self.controller.choice))
        self.engine_label.setToolTip(self.engine_label.text())  # a server's description can be long
        self.statusBar().showMessage("Connected." if config is None else "Model loaded.", 5000)
        if self._engine_stopped and self.banner.text() == self._engine_stopped:
            self._show_info("The engine process was started again; the models are loaded.")
        self._engine_stopped = ""
        self._start_clean(loaded)
        if config is not None:
            self.pair_bar.set_config(config)  # as the engine holds it
        if isinstance(loaded, ServerPair):  # no config, no cost model: the charts say what they lack
            self.charts.set_cost_model(None)
            self.charts.set_drafter(None)
            self.charts.set_notes(loaded.notes)
            self._set_ready(True)
            return
        self.charts.set_notes(())
        self.charts.set_cost_model(loaded.costs)  # a CostSnapshot: nothing changes it
        # A draft model given by name makes the drafter "model", whatever config.drafter says.
        self.charts.set_drafter("model" if config.draft else config.drafter, loaded.target.backend)
        notes = engine_notes(loaded)  # e.g. a Medusa tree cut to one branch on llama.cpp
        if notes:
            self.banner.show_message(" ".join(notes), "info")
        self._set_ready(True)

    def _start_clean(self, loaded: LoadedPair | ServerPair) -> None:
        """A different pair loaded: the charts and the side by side forget the runs of the one before, which
        would read as this pair's under its headline. The same pair loaded again (after the engine process
        restarted, or a benchmark) keeps them."""
        config = loaded.config
        pair = (self.controller.choice, config if config is not None else loaded.describe())
        if self._shown_pair is not None and pair != self._shown_pair:
            self.charts.reset()
            self.compare_view.clear_results()
        self._shown_pair = pair

    def _on_load_failed(self, message: str) -> None:
        self.progress.hide()
        self.engine_label.setText("No model loaded")
        self.statusBar().showMessage("The model did not load.", 5000)
        actions = [("Choose models…", self.choose_models)]
        choice = self.controller.choice
        if choice.remote:
            self.engine_label.setText(f"Not connected to the {choice.label()}")
            actions.append(("Use the local engine", self._use_local_engine))
        elif keys.engine_config() != keys.DEFAULT_ENGINE_CONFIG:
            actions.append(("Use the built-in model", self._use_default_models))
        if self.controller.retries:  # the server did not answer: Send connects again
            self._set_ready(True)
        else:
            self._set_ready(False, "No model loaded: choose a model pair (Models ▸ Model pair…, Ctrl+M).")
        self.show_error(f"The model did not load. {message}", actions)

    def _on_unloaded(self, freed: EngineConfig) -> None:
        """The engine's models were freed for a benchmark (they load again when its dialog closes)
        or a training (when it ends); told after the job, they load again now."""
        self._freed = freed
        training = self.train_dialog is not None and self.train_dialog.running
        what = "training" if training else "the benchmark"
        self.engine_label.setText("No model loaded")
        self._set_ready(False, f"The models are freed while {what} runs.")
        self.statusBar().showMessage(f"The models were freed for {what}.", 5000)
        open_dialogs = [
            d for d in (self.findChild(BenchDialog), self.findChild(LoadDialog)) if d is not None and d.isVisible()
        ]
        if not training and not open_dialogs:
            self._after_benchmark()

    def _use_local_engine(self) -> None:
        keys.set_engine_choice(keys.LOCAL)
        self.load_engine(keys.engine_config(), keys.LOCAL)

    def _use_default_models(self) -> None:
        keys.set_engine_config(keys.DEFAULT_ENGINE_CONFIG)
        self.load_engine(keys.DEFAULT_ENGINE_CONFIG)

    def show_error(self, message: str, actions=()) -> None:
        """The one place errors reach the user: the banner, plus a line in the status bar."""
        log.warning("%s", message)  # and the terminal, for whoever started the app from one
        self.banner.show_message(message, "error", list(actions))
        self.statusBar().showMessage(message.split(". ")[0], 8000)

    def _show_info(self, message: str) -> None:
        self.banner.show_message(message, "info")

    def _on_save_failed(self, message: str) -> None:
        self.show_error(message, self._offer_salvage())
        self._save_failure = message

    def _show_store_notice(self, message: str) -> None:
        self.banner.show_message(message, "info", self._offer_salvage())

    def _offer_salvage(self) -> list:
        """Where the store has met a damaged page: File ▸ Salvage conversations, and a button that does it."""
        self.actions.salvage.setEnabled(self.store.damaged)
        # Once the button has closed the banner, or it would close the one that says how the salvage went.
        salvage = ("Salvage conversations", lambda: QTimer.singleShot(0, self.chats.salvage))
        return [salvage] if self.store.damaged else []

    def _on_save_recovered(self) -> None:
        if self._save_failure and self.banner.text() == self._save_failure:  # still up: replace it
            self._show_info("Saving works again: everything shown is saved.")
        self._save_failure = ""

    # -- runs ------------------------------------------------------------------------------

    def send_message(self, text: str) -> None:
        self.chats.send(text, self.sampling)

    def regenerate(self) -> None:
        self.chats.regenerate(self.sampling)

    def edit_and_resend(self, position: int, text: str) -> None:
        self.chats.edit_and_resend(position, text, self.sampling)

    def set_system_prompt(self, text: str, as_default: bool = False) -> None:
        """This chat's system prompt; with `as_default`, also the one new chats start with."""
        if as_default:
            QSettings().setValue(keys.DEFAULT_SYSTEM_PROMPT, text)
            self.chats.default_system_prompt = text
        self.chats.set_system_prompt(text)

    def run_comparison(self, prompt: str) -> None:
        self._compare_sampling = self.sampling.as_greedy()  # as EngineController.compare runs it
        self.controller.compare([{"role": "user", "content": prompt}], self.sampling)

    def _on_run_started(self, kind: str) -> None:
        self.pair_bar.set_busy(True)  # the controller says it is busy after this
        self.charts.set_sharing_cores(self.controller.shares_cores)
        self.charts.begin_run()
        if kind == COMPARE:
            self.compare_view.begin()
        self._run_kind = kind

    def _on_steps(self, steps: list) -> None:  # the engine's StepEvents, a batch as the server sent it
        self.charts.add_steps(steps)
        if self._run_kind == COMPARE:
            for step in steps:
                self.compare_view.add_step(step.run, step)

    def _on_run_finished(self, kind: str, result) -> None:
        self._run_kind = None
        self.charts.end_run()
        if kind == CHAT and result is not None:
            self._last_reply = result.stats
        if kind != COMPARE:
            return
        if result is None:
            self.compare_view.show_failure("See the message above.")
        else:
            self.compare_view.show_comparison(result, self._compare_sampling.greedy)

    def last_run_stats(self) -> RunStats | None:
        """The last chat reply's figures (Help ▸ What the numbers mean, app/shell/numbers_help.py)."""
        return self._last_reply

    def _on_busy_changed(self, busy: bool) -> None:
        # Read the state rather than trust the argument: another listener may already
        # have started the next run while this signal was still being delivered.
        generating = self.controller.busy and not self.controller.loading
        self.chat_view.set_busy(generating)
        self.compare_view.set_busy(generating)
        self.pair_bar.set_busy(self.controller.busy)  # a reply, a load, or a benchmark's or training's job
        self.actions.stop.setEnabled(generating)

    def _set_ready(self, ready: bool, reason: str = "") -> None:
        self.chat_view.set_ready(ready, reason)
        self.actions.regenerate.setEnabled(ready)
        self.compare_view.set_ready(ready)

    # -- conversations ---------------------------------------------------------------------

    def new_chat(self) -> None:
        """An empty chat pane; the conversation is saved once its first message is sent."""
        self.chats.open(None)
        self.tabs.setCurrentWidget(self.chat_view)
        self.chat_view.composer.setFocus()

    def confirm_delete(self, conversation_id: str) -> None:
        conversation = self.chats.find(conversation_id)
        if conversation is None:
            return
        question = f"Delete “{conversation.title}”? This cannot be undone."
        if QMessageBox.question(self, "Delete conversation", question) == QMessageBox.StandardButton.Yes:
            self.chats.delete(conversation_id)

    def export_markdown(self, conversation_id: str | None = None) -> None:
        conversation = self.chats.find(conversation_id) if conversation_id else self.chats.conversation
        if conversation is not None:
            self.exports.conversation(conversation)

    def _set_markdown(self, enabled: bool) -> None:
        self.chat_view.set_markdown(enabled)  # the chat only: comparisons show tokens, to mark divergences

    def _set_colours(self, enabled: bool) -> None:
        self.chat_view.set_colours_enabled(enabled)
        for pane in self.compare_view.panes.values():
            pane.view.set_colours_enabled(enabled)

    # -- the benchmark and training dialogs ------------------------------------------------

    def open_benchmark(self) -> BenchDialog:
        """Models ▸ Benchmark…: on the loaded pair (or the saved one), on this window's engine, window-modal."""
        existing = self.findChild(BenchDialog)
        if existing is not None and existing.isVisible():
            existing.raise_()
            existing.activateWindow()
            return existing
        loaded = self.controller.loaded
        config = loaded.config if loaded is not None and loaded.config is not None else keys.engine_config()
        dialog = BenchDialog(
            self,
            config=config,
            host=self.controller,
            apply_config=lambda chosen: self.apply_pair(chosen, self.sampling),
        )
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(self._after_benchmark)
        dialog.open()
        return dialog

    def open_load_test(self) -> LoadDialog:
        """Models ▸ Load test…: the loaded pair (or the saved one) with many requests at once, on this
        window's engine (the sweep reloads the pair with room for them and restores it), window-modal."""
        existing = self.findChild(LoadDialog)
        if existing is not None and existing.isVisible():
            existing.raise_()
            existing.activateWindow()
            return existing
        loaded = self.controller.loaded
        config = loaded.config if loaded is not None and loaded.config is not None else keys.engine_config()
        dialog = LoadDialog(self, config=config, host=self.controller)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.finished.connect(self._after_benchmark)
        dialog.open()
        return dialog

    def _after_benchmark(self) -> None:
        """The models freed for a benchmark of another pair, or a training, load again (unless another
        load came since)."""
        if self._freed is not None and not self._shut_down:
            self.load_engine(self._freed)

    def open_training(self) -> TrainDialog:
        """Models ▸ Train heads…: the window's train dialog, made on first use."""
        if self.train_dialog is None:
            self.train_dialog = TrainDialog(self, host=self.controller)  # it trains in this window's engine process
            self.train_dialog.sig_finished.connect(lambda _result: self._after_benchmark())
        self.train_dialog.show()
        self.train_dialog.raise_()
        self.train_dialog.activateWindow()
        return self.train_dialog

    # -- closing ---------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt API
        if not self._shut_down:
            self._save_settings()
            self.statusBar().showMessage("Stopping…")
            self.controller.shutdown()  # cancels the run, joins the worker thread, stops the engine process
            self.chats.close()
            self.store.close()  # a clean close checkpoints the WAL into the database file
            self._shut_down = True
        event.accept()
