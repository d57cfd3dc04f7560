"""The pair dialog's Engine row: where the pair runs, and a connection test that never blocks the window.

"Local" is the window's own engine process (the default). "SpecDeck server" loads
the dialog's pair on a SpecDeck server (its paths are the server's). llama-server,
vLLM and SGLang serve a model of their own, with their own speculative decoding;
for the side by side's vanilla run they take a second URL, a server of the same
model started without speculation.

"Test connection" asks the server what it serves on a worker thread and shows its
description and notes, or the error's own message. A test speaks for exactly the
choice it tested: any edit voids it (`tested`), as an edit voids the dialog's pair
check, and a newer test makes an older one's answer stale (a generation counter).
"""

from __future__ import annotations

import threading

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QWidget

from app.pair.widgets import SEVERITY_COLOURS
from app.runtime.remote import check_connection
from app.shell.settings import ENGINE_KINDS, LOCAL, EngineChoice
from engine import SpecDeckError

PLACEHOLDERS = {
    "specdeck": "http://127.0.0.1:8000",
    "llama-server": "http://127.0.0.1:8080",
    "vllm": "http://127.0.0.1:8000",
    "sglang": "http://127.0.0.1:30000",
}  # their default ports


class EngineRow(QGroupBox):
    sig_changed = Signal()
    """The choice changed (the kind, an address or the key): the last test no longer applies."""

    sig_tested = Signal(bool)
    """A connection test ended; True when the server answered and can be used."""

    _sig_result = Signal(int, object)  # from the worker thread: generation, (choice, ok, text, notes)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Engine", parent)
        self._generation = 0
        self._tested: EngineChoice | None = None  # the choice the last successful test was about
        self._answered: EngineChoice | None = None  # the choice the last finished test was about
        self._answer: tuple[str, str] = ("", "")  # its status text and style
        self._sig_result.connect(self._on_result, Qt.QueuedConnection)

        self.kind = QComboBox(self)
        for kind, label in ENGINE_KINDS.items():
            self.kind.addItem(label, kind)
        self.kind.setToolTip("Where the pair runs: this computer's engine process, or a server")
        self.url = QLineEdit(self)
        self.api_key = QLineEdit(self)
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("optional: the key the server was started with")
        self.vanilla_url = QLineEdit(self)
        self.vanilla_url.setPlaceholderText("optional: the same model without speculative decoding")
        self.vanilla_url.setToolTip(
            "A second server of the same model, started without speculative decoding: "
            "the side by side's vanilla run goes there"
        )
        self.test_button = QPushButton("Test connection", self)
        self.test_button.setAutoDefault(False)  # Enter belongs to Load
        self.test_button.clicked.connect(self.test)
        self.status = QLabel(self)
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.PlainText)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        test_row = QHBoxLayout()
        test_row.addWidget(self.test_button, 0, Qt.AlignTop)
        test_row.addWidget(self.status, 1)
        self._test_row = QWidget(self)
        self._test_row.setLayout(test_row)
        test_row.setContentsMargins(0, 0, 0, 0)
        self._form = QFormLayout(self)
        self._form.addRow("&Run on:", self.kind)
        self._form.addRow("&URL:", self.url)
        self._form.addRow("API &key:", self.api_key)
        self._form.addRow("&Vanilla server URL:", self.vanilla_url)
        self._form.addRow(self._test_row)

        self.kind.currentIndexChanged.connect(self._changed)
        for field in (self.url, self.api_key, self.vanilla_url):
            field.textChanged.connect(self._changed)
        self._show_fields()

    # -- the choice ---------------------------------------------------------------------

    def choice(self) -> EngineChoice:
        kind = self.kind.currentData()
        if kind == LOCAL.kind:
            return LOCAL
        vanilla = self.vanilla_url.text().strip() if EngineChoice(kind).adapter else ""
        return EngineChoice(kind, self.url.text().strip(), self.api_key.text(), vanilla)

    def set_choice(self, choice: EngineChoice) -> None:
        self.kind.setCurrentIndex(max(self.kind.findData(choice.kind), 0))
        self.url.setText(choice.url)
        self.api_key.setText(choice.api_key)
        self.vanilla_url.setText(choice.vanilla_url)
        self._changed()

    def tested(self) -> bool:
        """Whether the last test succeeded for exactly the choice shown (Local needs none)."""
        choice = self.choice()
        return not choice.remote or self._tested == choice

    # -- testing ------------------------------------------------------------------------

    def test(self) -> None:
        """Connect on a worker thread; the status says what answered, and `sig_tested` how it went."""
        choice = self.choice()
        if not choice.remote:
            return
        self._generation += 1
        self._show_status(f"Connecting to {choice.url or 'the server'}…")
        self.test_button.setEnabled(False)
        threading.Thread(
            target=self._run_test, args=(self._generation, choice), daemon=True, name="engine-test"
        ).start()

    def forget(self) -> None:
        """A closed dialog: a test still running reports to nobody."""
        self._generation += 1

    def _run_test(self, generation: int, choice: EngineChoice) -> None:
        """On the worker thread: never raise, always report."""
        try:
            text, notes = check_connection(choice)
            outcome = (choice, True, text, notes)
        except SpecDeckError as error:
            outcome = (choice, False, str(error), ())
        except Exception as error:  # noqa: BLE001 - a bug, not a bad server: still no traceback in the dialog
            outcome = (choice, False, f"The test failed ({type(error).__name__}: {error}).", ())
        try:
            self._sig_result.emit(generation, outcome)
        except RuntimeError:
            pass  # the dialog was deleted while the test ran

    def _on_result(self, generation: int, outcome) -> None:
        if generation != self._generation:
            return  # a newer test is running, or the dialog closed
        choice, ok, text, notes = outcome
        self.test_button.setEnabled(True)
        self._answered, self._tested = choice, (choice if ok else None)
        self._answer = ("\n".join((text, *notes)), "" if ok else f"color: {SEVERITY_COLOURS['error']}")
        if choice != self.choice():  # edited while it ran: the answer is about another choice
            self._changed()
        else:
            self._show_status(*self._answer)
        self.sig_tested.emit(ok and choice == self.choice())

    def _changed(self) -> None:
        self._show_fields()
        choice = self.choice()
        if not self.test_button.isEnabled():
            pass  # a test runs: its answer, or "changed", comes when it ends
        elif self._answered is None:
            self._show_status("Not tested yet: press Test connection.")
        elif self._answered != choice:
            self._show_status("Changed since the last test: press Test connection.")
        else:  # edited back to what was tested
            self._show_status(*self._answer)
        self.sig_changed.emit()

    def _show_status(self, text: str, style: str = "") -> None:
        self.status.setStyleSheet(style)
        self.status.setText(text)

    def _show_fields(self) -> None:
        kind = self.kind.currentData()
        remote = kind != LOCAL.kind
        for widget in (self.url, self.api_key, self._test_row):
            self._form.setRowVisible(widget, remote)
        self._form.setRowVisible(self.vanilla_url, EngineChoice(kind).adapter)
        self.url.setPlaceholderText(PLACEHOLDERS.get(kind, ""))
