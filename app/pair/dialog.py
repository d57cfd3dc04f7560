"""`PairDialog`: choose a target, a drafter and the settings to run them with, checked before loading.

An incompatible pair must not be loaded by accident, so Load stays disabled
until a check has passed for exactly what is selected: any change to the models
or to the settings the check looks at voids it. Checks read metadata only, but
even half a second is too long to freeze a window, so they run on a worker
thread and report back through a queued signal; a newer check makes older
results stale (a generation counter drops them).

Who checks is the caller's choice (`check`, a function of an EngineConfig that gives
a Preflight): the window passes its controller's, which asks the window's engine
process (started for it if need be), so that the window's own process never
imports torch or llama.cpp, which the check needs to read devices; standalone
and in tests the default checks in this process. A check that cannot run (the
engine process does not start, or stops during the check) is an error finding
that says so; the dialog keeps working, and Check pair tries again.

The Engine row at the top says where the pair runs (app/pair/engine_row.py).
On a server, Load waits for a connection test of exactly the URL and key shown.
On a SpecDeck server the pair below loads there: its paths are the server's, so
the check (of this computer's files) informs without holding Load back,
and the server checks its own when it loads. llama-server, vLLM and SGLang
serve their own model: the pair is not used, and only sampling applies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
)

from app.pair.drafters_list import DraftersButton
from app.pair.engine_row import EngineRow
from app.pair.form import PairForm
from app.pair.model_drop import DRAFT, TARGET, ModelDrops
from app.pair.presets import PresetStore
from app.pair.widgets import SEVERITY_COLOURS, FindingsView, checked
from app.shell import settings as keys
from engine import EngineConfig, Finding, PairReport, Preflight, SamplingConfig, list_models, preflight

# The dialog's own state (geometry, the last folder browsed); the pair itself is keys.ENGINE_CONFIG.
PREFIX = "pair_dialog"

AUTO_CHECK_MS = 300  # after a settled change; long enough to skip the steps of a spin box held down
SERVER_PAIR = "The server's model and speculative decoding are used."


class PairDialog(QDialog):
    sig_check_finished = Signal(bool)
    """A check of the current selection ended; True when it can be loaded."""
    _sig_result = Signal(int, object)  # from the worker thread: generation, (Preflight, the key it checked)

    def __init__(
        self, parent=None, settings: QSettings | None = None, check: Callable[[EngineConfig], Preflight] | None = None
    ) -> None:
        """`check(config) -> Preflight` runs on a worker thread (default: `engine.preflight`, here)."""
        super().__init__(parent)
        self.setWindowTitle("Models and settings")
        self.settings = settings if settings is not None else QSettings()
        self._check = check if check is not None else preflight
        self.presets = PresetStore(self.settings)
        self._result: Preflight | None = None
        self._checked_key = None  # the selection the last finished check was about
        self._generation = 0
        self._busy = False
        self._shown_once = False
        self._auto_check = QTimer(self, singleShot=True, interval=AUTO_CHECK_MS, timeout=self.check)
        self._sig_result.connect(self._on_result, Qt.QueuedConnection)

        self.form = PairForm(list_models(), self, settings=self.settings)
        self.form.sig_key_edited.connect(self._invalidate)
        self.form.sig_key_changed.connect(self._invalidate_and_schedule)

        self._was_adapter = False  # the engine row chose a server with its own pair
        self.engine_row = EngineRow(self)
        self.engine_row.sig_changed.connect(self._on_engine_changed)
        self.engine_row.sig_tested.connect(lambda ok: self._update_buttons())
        self.server_pair = QLabel(SERVER_PAIR, self)  # in place of the pair's check, for such a server
        # One line high: with the findings hidden it would otherwise take the dialog's spare height.
        self.server_pair.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.server_pair.hide()

        presets_row = self._make_presets_row()

        self.check_button = QPushButton("Check pair", self)
        self.check_button.setToolTip("Read both models' metadata and say whether they can work together")
        self.check_button.clicked.connect(self.check)
        self.findings = FindingsView(self)

        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel, self)
        self.load_button = self.buttons.button(QDialogButtonBox.Ok)
        self.load_button.setText("Load")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

        check_row = QHBoxLayout()
        check_row.addWidget(self.check_button)
        self.drafters_button = DraftersButton(
            self.form, self.settings, self
        )  # every drafter for the target, and why not
        check_row.addWidget(self.drafters_button)
        check_row.addStretch(1)
        # Said when the saved pair could not be read (damaged, or from a newer SpecDeck): the defaults show.
        self.notice = QLabel(self)
        self.notice.setWordWrap(True)
        self.notice.setTextFormat(Qt.TextFormat.PlainText)
        self.notice.setStyleSheet(f"color: {SEVERITY_COLOURS['error']}")
        self.notice.hide()
        layout = QVBoxLayout(self)
        layout.addWidget(self.notice)
        layout.addWidget(self.engine_row)
        layout.addWidget(self.server_pair)
        layout.addLayout(presets_row)
        layout.addWidget(self.form)
        layout.addLayout(check_row)
        layout.addWidget(self.findings, 1)
        layout.addStretch(0)  # the spare height while the findings are hidden (a server's own pair)
        layout.addWidget(self.buttons)

        resets: list[str] = []
        config = keys.engine_config(self.settings, resets)
        saved = bool(keys.read(self.settings, keys.ENGINE_CONFIG, ""))  # else the default pair of a first run
        self.form.set_config(config, keys.sampling_config(self.settings, resets), drafter_chosen=saved)
        self.engine_row.set_choice(keys.engine_choice(self.settings, resets))
        self._show_notice(keys.describe_resets(resets) if resets else "")
        self.form.set_browse_dir(keys.read(self.settings, f"{PREFIX}/browse_dir", ""))
        self._auto_check.stop()  # the first check runs when the dialog is shown, not while it is built
        self._invalidate()
        self.findings.show_message("Not checked yet: press Check pair.")
        geometry = keys.read(self.settings, f"{PREFIX}/geometry", QByteArray())  # garbage: the default size
        if geometry.isEmpty() or not self.restoreGeometry(geometry):
            self.resize(860, 720)
        # A .gguf file or a model folder dropped on the dialog is the target; on a model field, that field's.
        self.drops = ModelDrops(self, self.use_model, lambda message: self.findings.show_message(message, "error"))
        self.drops.watch(self, TARGET)
        self.drops.watch(self.form.target.combo.lineEdit(), TARGET)
        draft = self.form.model_option()
        if draft is not None:
            self.drops.watch(self.form.field(*draft).combo.lineEdit(), DRAFT)

    # -- the public API ------------------------------------------------------------

    def engine_config(self) -> EngineConfig:
        return self.form.config()

    def sampling_config(self) -> SamplingConfig:
        return self.form.sampling()

    def engine_choice(self) -> keys.EngineChoice:
        """Where the pair runs: the window's own engine, or a server."""
        return self.engine_row.choice()

    def set_config(self, config: EngineConfig, sampling: SamplingConfig | None = None) -> None:
        """Show `config` (and `sampling`, when given); nothing loads until Load."""
        self.form.set_config(config, sampling)

    def report(self) -> PairReport | None:
        """The doctor's report from the last check of a draft model (None for n-gram or before a check)."""
        return self._result.report if self._result is not None else None

    def findings_list(self) -> tuple[Finding, ...]:
        return self._result.findings if self._result is not None else ()

    def can_load(self) -> bool:
        """True when the last check passed and nothing it looked at has changed since; on a server,
        when the last connection test succeeded for exactly the choice shown."""
        if self.engine_choice().remote:
            return self.engine_row.tested()
        return self._result is not None and self._result.compatible and self._checked_key == self.form.check_key()

    def check(self) -> None:
        """Check the current selection on a worker thread; `sig_check_finished` says how it went."""
        self._auto_check.stop()
        if self.engine_choice().adapter:
            return  # the server's own pair: nothing here to check
        self._generation += 1
        generation, config = self._generation, self.form.config()
        self._set_busy(True)
        self.findings.show_message("Checking…")
        self._update_buttons()
        threading.Thread(target=self._run_check, args=(generation, config), daemon=True, name="pair-check").start()

    def accept(self) -> None:
        if not self.can_load():
            # Enter in a field, or a caller, can get here with Load disabled: check (or test) instead.
            if self.engine_choice().remote:
                self.engine_row.test()
            else:
                self.check()
            return
        keys.set_engine_config(self.form.config(), self.settings)  # the one pair the window loads, too
        keys.set_sampling_config(self.form.sampling(), self.settings)
        keys.set_engine_choice(self.engine_choice(), self.settings)
        super().accept()

    def done(self, result: int) -> None:
        self._auto_check.stop()  # a closed dialog checks nothing (it would show a busy cursor over the window)
        self.engine_row.forget()
        self.drafters_button.dialog.done(0)
        self._set_busy(False)
        self._generation += 1  # a check still running reports to nobody
        self.settings.setValue(f"{PREFIX}/geometry", self.saveGeometry())
        self.settings.setValue(f"{PREFIX}/browse_dir", self.form.browse_dir())
        super().done(result)

    # -- presets -------------------------------------------------------------------

    def preset_names(self) -> list[str]:
        return self.presets.names()

    def save_preset(self, name: str) -> None:
        self.presets.save(name, self.form.config(), self.form.sampling())
        self._fill_presets(select=name.strip())

    def load_preset(self, name: str) -> bool:
        pair = self.presets.get(name)
        if pair is None:
            if name in self.presets.names():  # saved, but unreadable (a hand edit, a newer SpecDeck)
                self.findings.show_message(f"The preset “{name}” could not be read: it is left as it is.", "error")
            return False
        self.form.set_config(*pair)
        self._fill_presets(select=name)
        return True

    def delete_preset(self, name: str) -> None:
        self.presets.delete(name)
        self._fill_presets()

    def _make_presets_row(self) -> QHBoxLayout:
        self.preset_combo = QComboBox(self)
        self.preset_combo.setMinimumContentsLength(18)
        self.preset_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.preset_combo.activated.connect(self._on_preset_activated)
        save = QPushButton("Save as…", self)
        save.setToolTip("Keep the current models and settings under a name")
        save.clicked.connect(self._ask_save_preset)
        self.delete_button = QPushButton("Delete", self)
        self.delete_button.clicked.connect(self._ask_delete_preset)
        for button in (save, self.delete_button):
            button.setAutoDefault(False)  # Enter belongs to Load
        row = QHBoxLayout()
        row.addWidget(QLabel("Preset:", self))
        row.addWidget(self.preset_combo, 1)
        row.addWidget(save)
        row.addWidget(self.delete_button)
        self._fill_presets()
        return row

    def _fill_presets(self, select: str | None = None) -> None:
        self.preset_combo.clear()
        self.preset_combo.addItem("(choose a preset)", None)
        for name in self.presets.builtin_names():  # first, and not deletable
            self.preset_combo.addItem(name, name)
            self.preset_combo.setItemData(self.preset_combo.count() - 1, "Comes with SpecDeck", Qt.ToolTipRole)
        for name in self.presets.names():
            self.preset_combo.addItem(name, name)
        index = self.preset_combo.findData(select) if select else 0
        self.preset_combo.setCurrentIndex(max(index, 0))
        self._enable_delete(self.preset_combo.currentData())

    def _on_preset_activated(self, index: int) -> None:
        name = self.preset_combo.itemData(index)
        if name is not None:
            self.load_preset(name)
        self._enable_delete(name)

    def _enable_delete(self, name: str | None) -> None:
        """Only a saved preset can be deleted (a built-in one comes back anyway)."""
        self.delete_button.setEnabled(name is not None and name in self.presets.names())

    def _ask_save_preset(self) -> None:
        current = self.preset_combo.currentData() or ""
        name, ok = QInputDialog.getText(self, "Save preset", "Name of the preset:", text=current)
        if not ok or not name.strip():
            return
        if name.strip() in self.presets.names() and name.strip() != current:
            answer = QMessageBox.question(self, "Save preset", f"Replace the preset “{name.strip()}”?")
            if answer != QMessageBox.Yes:
                return
        self.save_preset(name)

    def _ask_delete_preset(self) -> None:
        name = self.preset_combo.currentData()
        if (
            name is not None
            and QMessageBox.question(self, "Delete preset", f"Delete the preset “{name}”?") == QMessageBox.Yes
        ):
            self.delete_preset(name)

    # -- checking ------------------------------------------------------------------

    def _run_check(self, generation: int, config: EngineConfig) -> None:
        """On the worker thread: never raise, always report."""
        result = checked(self._check, config)  # the pair bar's check too
        try:
            self._sig_result.emit(generation, (result, self.form.key_of(config)))
        except RuntimeError:
            pass  # the dialog was deleted while the check ran

    def _on_result(self, generation: int, payload) -> None:
        if generation != self._generation:
            return  # a newer check is running, or the dialog closed
        result, key = payload
        self._set_busy(False)
        self._result, self._checked_key = result, key
        if key == self.form.check_key():
            self.findings.show_result(result)
        else:  # the selection changed while the check ran
            self._invalidate()
        self._update_buttons()
        self.sig_check_finished.emit(self.can_load())

    def _invalidate(self) -> None:
        if self._result is not None and self._checked_key != self.form.check_key():
            self.findings.show_message("The selection changed since the last check: press Check pair.")
        self._update_buttons()

    def _invalidate_and_schedule(self) -> None:
        self._invalidate()
        if self.isVisible():  # a hidden or closed dialog checks only when asked to
            self._auto_check.start()

    def _update_buttons(self) -> None:
        self.load_button.setEnabled(self.can_load() and not self._busy)
        first = (
            "Test the connection first: Load is enabled once the server answers"
            if self.engine_choice().remote
            else "Check the pair first: Load is enabled when it passes"
        )
        self.load_button.setToolTip("" if self.can_load() else first)

    def _on_engine_changed(self) -> None:
        """The engine row changed: a server with its own pair leaves nothing here to check or edit
        but the sampling."""
        adapter = self.engine_choice().adapter
        if self._was_adapter and not adapter:  # the pair is used again: check it
            self._invalidate_and_schedule()
        self._was_adapter = adapter
        self.form.set_pair_enabled(not adapter)
        self.check_button.setEnabled(not adapter)
        self.drafters_button.setEnabled(not adapter)
        self.server_pair.setVisible(adapter)
        self.findings.setVisible(not adapter)
        self._update_buttons()

    def _set_busy(self, busy: bool) -> None:
        if busy == self._busy:
            return
        self._busy = busy
        if busy:
            QApplication.setOverrideCursor(Qt.BusyCursor)
        else:
            QApplication.restoreOverrideCursor()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._shown_once:  # check what was restored, so a usual pair is one click away
            self._shown_once = True
            self._auto_check.start()

    # -- drops ---------------------------------------------------------------------

    def use_model(self, path: str, role: str = TARGET) -> None:
        """Make `path` the target, or the draft model (choosing the drafter that loads one); then check."""
        picker = self.form.target
        draft = self.form.model_option()
        if role == DRAFT and draft is not None:
            drafter, option = draft
            picker = self.form.field(drafter, option)
            self.form.drafter.setCurrentIndex(self.form.drafter.findData(drafter))
        picker.set_spec(path)
        picker.sig_chosen.emit()

    def _show_notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))
