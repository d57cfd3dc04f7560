"""`PairBar`: the model pair in one line above the chat (target, drafter, draft model, k); a change loads.

LM Studio puts the draft model beside the chat. Here the pair dialog (Models ▸ Model pair…) holds
every setting, and this bar the four a user changes while chatting, built from the dialog's own
pieces: the drafters in the dialog's order (`form.listed_drafters`), the models this machine has
(`engine.list_models`, listed as the dialog's pickers list them), "auto or a number" for k
(`widgets.AutoNumberField`), and the engine's check (`check`: the window passes its controller's
preflight, as to the dialog, through `widgets.checked`). A change is checked first, off the GUI
thread; a pair that passes goes to the window (`sig_pair_chosen`), which loads it; a pair that
cannot work is not loaded, and the bar says why (the check's first error) until the next change.
Everything else (backend, hardware, sampling, a drafter's other options, a model that is not
listed) stays as the dialog set it, and "More…" opens the dialog.

The window tells the bar what loads (`set_config`: the bar's own pairs, the dialog's, a restart's),
and when its fields must not change (`set_busy`: a reply runs or a load is in progress;
`set_remote`: the window runs on a server, whose pair the dialog chooses).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QStyle,
    QStyleOptionComboBox,
    QStylePainter,
    QWidget,
)

from app.pair.form import add_drafter, draft_model_option, listed_drafters
from app.pair.widgets import AUTO, SEVERITY_COLOURS, AutoNumberField, add_models, checked
from engine import EngineConfig, figures, list_models

# A model box asks for room for about MODEL_CHARS characters and gives it up down to MIN_CHARS when the
# line is short of room (a narrow window, or a reason to show): a longer name is elided in the middle.
MODEL_CHARS, DRAFTER_CHARS, MIN_CHARS = 20, 22, 8
REASON_PX = 230  # the room a reason takes from the boxes, at most (the rest is elided; its tooltip says it all)
K_SUGGESTIONS = (2, 3, 4, 5, 6, 8)
NO_DRAFT = "(choose one)"
RETRY = "Choose the pair again to retry."
POLL_MS = 50  # how often a running check is looked at (it reads metadata: well under a second)
FIELDS_REMOTE = "The window runs on a server: choose its pair in Models ▸ Model pair…"


class ElidedCombo(QComboBox):
    """A combo box that elides its text where Qt would cut it off (in the middle, by default: a model's
    quantization is at the end of its name); its tooltip is the chosen item's (a model's full path)."""

    def __init__(
        self, chars: int, parent=None, min_chars: int = MIN_CHARS, elide: Qt.TextElideMode = Qt.ElideMiddle
    ) -> None:
        super().__init__(parent)
        self.elide = elide
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(chars)
        self._give_up = max(0, chars - min_chars)
        self.currentIndexChanged.connect(lambda: self.setToolTip(self.currentData(Qt.ToolTipRole) or ""))

    def text_width(self) -> int:
        """The width the style gives the text (it draws it one pixel in on each side)."""
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        rect = self.style().subControlRect(QStyle.CC_ComboBox, option, QStyle.SC_ComboBoxEditField, self)
        return max(0, rect.width() - 2)

    def shown_text(self) -> str:
        return self.fontMetrics().elidedText(self.currentText(), self.elide, self.text_width())

    def select(self, data, text: str | None = None) -> None:
        """Choose the item whose data is `data`, listed first (as `text`, `data` its tooltip) if none is."""
        index = self.findData(data)
        if index < 0:
            self.addItem(text or str(data), data)
            index = self.count() - 1
            self.setItemData(index, str(data), Qt.ToolTipRole)
        self.setCurrentIndex(index)

    def minimumSizeHint(self):  # noqa: N802 - Qt API
        # Qt sizes a box by the width of "x" times its minimum contents length; it may shrink to MIN_CHARS of them.
        hint = super().minimumSizeHint()
        hint.setWidth(hint.width() - self._give_up * self.fontMetrics().horizontalAdvance("x"))
        return hint

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt API
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        painter.drawComplexControl(QStyle.CC_ComboBox, option)
        option.currentText = self.shown_text()
        painter.drawControl(QStyle.CE_ComboBoxLabel, option)


class ElidedLabel(QLabel):
    """One line of text, elided at the end when the line is short of room; the tooltip says it all."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._text = ""
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # takes what room is left, no more

    def set_full_text(self, text: str, tip: str = "") -> None:
        self._text = text
        self.setToolTip(tip or text)
        # Room for the text, up to REASON_PX: taken from the boxes beside it, which elide their names.
        self.setMinimumWidth(min(self.fontMetrics().horizontalAdvance(text), REASON_PX))
        self._elide()

    def full_text(self) -> str:
        return self._text

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        self.setText(self.fontMetrics().elidedText(self._text, Qt.ElideRight, max(0, self.width())))


def model_name(spec: str) -> str:
    """A short name for a model spec the machine's list lacks: a file's name (as the list names
    GGUF files: without .gguf), a folder's, or the repo id's last part."""
    name = os.path.basename(spec.rstrip("/\\")) or spec
    return name.removesuffix(".gguf") or name


class PairBar(QWidget):
    sig_pair_chosen = Signal(object)
    """The pair the bar was changed to passed the check (an EngineConfig): load it."""
    sig_more_requested = Signal()
    """More…: the pair dialog, for everything else."""
    sig_checked = Signal(bool)
    """A check of the bar's pair ended: True when it can load (sig_pair_chosen came first), False when
    the bar says why not."""

    def __init__(self, check, models=None, parent=None) -> None:
        """`check(config) -> Preflight`, called on a worker thread; `models`: what the boxes list
        (default: the models on this machine, `engine.list_models`)."""
        super().__init__(parent)
        self._check = check
        self._config = EngineConfig()  # the pair loaded, or loading: what a change is made to
        # The running check: its pair and where its thread puts the Preflight. The thread touches no Qt
        # object (a signal emitted on a bar being deleted crashed), and a newer change or a pair set from
        # outside replaces it (a stale result is never read).
        self._pending: tuple[EngineConfig, queue.SimpleQueue] | None = None
        self._poll = QTimer(self, interval=POLL_MS, timeout=self._take_result)
        self._filling = False  # set_config fills the fields: that is no change of the user's
        self._busy = self._remote = False
        models = list_models() if models is None else models

        self.target = ElidedCombo(MODEL_CHARS, self)
        add_models(self.target, models, label=lambda ref: ref.name)
        self.specs = listed_drafters()
        self.drafter = ElidedCombo(DRAFTER_CHARS, self, elide=Qt.ElideRight)
        for spec in self.specs.values():
            add_drafter(self.drafter, spec)
        self.draft = ElidedCombo(MODEL_CHARS, self)
        self.draft.addItem(NO_DRAFT, None)
        add_models(self.draft, models, label=lambda ref: ref.name)
        self.k = AutoNumberField(
            K_SUGGESTIONS,
            self,
            tooltip=f"{figures.DRAFT_LENGTH.tip} auto: chosen at each step from the measured acceptance and costs.",
        )
        self.k.setMinimumContentsLength(3)  # room for "auto" (a few letters are narrower than Qt's "x")
        self.more = QPushButton("More…", self)
        self.more.setToolTip(
            "Every setting of the pair: backend, hardware, sampling, the drafter's options "
            "(Models ▸ Model pair…, Ctrl+M)"
        )
        self.more.clicked.connect(self.sig_more_requested)
        self.reason = ElidedLabel(self)

        self.target_label = QLabel("Target", self)
        self.drafter_label = QLabel("Drafter", self)
        self.draft_label = QLabel("Draft", self)
        self.k_label = QLabel("k", self)
        self.k_label.setToolTip(figures.DRAFT_LENGTH.name)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        for label, field in (
            (self.target_label, self.target),
            (self.drafter_label, self.drafter),
            (self.draft_label, self.draft),
            (self.k_label, self.k),
        ):
            label.setBuddy(field)
            layout.addWidget(label)
            layout.addWidget(field)
            layout.addSpacing(4)
        layout.addWidget(self.more)
        layout.addSpacing(6)
        layout.addWidget(self.reason, 1)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)  # the rest of the toolbar's line

        for combo in (self.target, self.drafter, self.draft):
            combo.currentIndexChanged.connect(self._changed)
        self.k.sig_chosen.connect(self._changed)
        for field in (self.target, self.drafter, self.draft, self.k):
            # A wheel turned over the toolbar on its way elsewhere must not load another pair.
            field.setFocusPolicy(Qt.StrongFocus)
            field.installEventFilter(self)
        self.set_config(self._config)

    # -- what the window tells the bar ---------------------------------------------

    def set_config(self, config: EngineConfig) -> None:
        """Show `config`, the pair loaded or loading (nothing is checked or loaded); a check still
        running is forgotten, and so is what the last one said."""
        self._forget_check()
        self._config = config
        self._filling = True
        try:
            self.target.select(config.target, model_name(config.target))
            if config.drafter not in self.specs:
                self._list_drafter(config.drafter)
            self.drafter.setCurrentIndex(max(self.drafter.findData(config.drafter), 0))
            option = draft_model_option(self.specs[config.drafter]) if config.drafter in self.specs else None
            draft = getattr(config.options, option, None) if option else None
            if draft:
                self.draft.select(draft, model_name(draft))
            elif option:  # the drafter loads a model but none is named: the check will say so
                self.draft.setCurrentIndex(0)
            self.k.set_value(config.k)
        finally:
            self._filling = False
        self._show_draft()
        self._say("")

    def set_busy(self, busy: bool) -> None:
        """A reply runs or a load is in progress: the fields wait, and show the pair that is used."""
        self._busy = busy
        if busy and self.config() != self._config:  # a choice not loaded (refused, or still checking)
            self.set_config(self._config)
        self._enable()

    def set_remote(self, remote: bool) -> None:
        """The window runs on a server: its pair is the dialog's to choose (More… stays)."""
        self._remote = remote
        self._enable()

    # -- what the bar shows --------------------------------------------------------

    def config(self) -> EngineConfig:
        """The pair the fields show: the last one set, with their target, drafter, draft model and k."""
        name = self.drafter.currentData()
        config = self._config
        if name in self.specs:
            option = draft_model_option(self.specs[name])
            config = config.with_drafter(name, **({option: self.draft.currentData()} if option else {}))
        k = self.k.value()
        return dataclasses.replace(config, target=self.target.currentData(), k=k if k == AUTO else int(k))

    def fields_enabled(self) -> bool:
        return self.target.isEnabled()

    def message(self) -> str:
        """What the bar says beside its fields: why the chosen pair was not loaded, or that it is being checked."""
        return self.reason.full_text()

    # -- changes -------------------------------------------------------------------

    def _changed(self) -> None:
        if self._filling:
            return
        self._show_draft()
        self._forget_check()
        config = self.config()
        if config == self._config:  # back to the pair that is loaded
            self._say("")
            return
        self._say("Checking the pair…")
        check, answer = self._check, queue.SimpleQueue()
        threading.Thread(
            target=lambda: answer.put(checked(check, config, RETRY)), daemon=True, name="pair-bar-check"
        ).start()
        self._pending = (config, answer)
        self._poll.start()

    def _forget_check(self) -> None:
        self._pending = None
        self._poll.stop()

    def _take_result(self) -> None:
        """The timer's: the running check's result, once its thread has put it."""
        if self._pending is None:
            return self._poll.stop()
        config, answer = self._pending
        try:
            result = answer.get_nowait()
        except queue.Empty:
            return
        self._forget_check()
        if result.compatible:
            self._config = config  # before the window hears it: its load's busy signal keeps it shown
            self._say("")
            self.sig_pair_chosen.emit(config)
        else:
            error = result.errors[0]
            self._say(f"Not loaded: {error.title}", f"{error.title}. {error.detail}", error=True)
        self.sig_checked.emit(result.compatible)

    # -- plumbing ------------------------------------------------------------------

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt API
        """The fields take the wheel only once clicked into (focused)."""
        if event.type() == QEvent.Wheel and not watched.hasFocus():
            return True
        return super().eventFilter(watched, event)

    def _list_drafter(self, name: str) -> None:
        """A drafter the list lacks (a chain chosen on the command line): listed, like the dialog does;
        a name that is no drafter at all is shown as it is (the load said what is wrong with it)."""
        from engine import drafter_spec, is_drafter

        if is_drafter(name):
            self.specs[name] = drafter_spec(name)
            add_drafter(self.drafter, self.specs[name])
        else:
            self.drafter.addItem(name, name)

    def _show_draft(self) -> None:
        spec = self.specs.get(self.drafter.currentData())
        loads_model = spec is not None and draft_model_option(spec) is not None
        self.draft_label.setVisible(loads_model)
        self.draft.setVisible(loads_model)

    def _enable(self) -> None:
        enabled = not self._busy and not self._remote
        for widget in (self.target, self.drafter, self.draft, self.k):
            widget.setEnabled(enabled)
        self.target.setToolTip(FIELDS_REMOTE if self._remote else self.target.currentData(Qt.ToolTipRole) or "")

    def _say(self, text: str, tip: str = "", error: bool = False) -> None:
        self.reason.setStyleSheet(f"color: {SEVERITY_COLOURS['error']}" if error else "")
        self.reason.set_full_text(text, tip)
        self.layout().activate()  # the boxes make room now, not at the next pass of the event loop
