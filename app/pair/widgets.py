"""Pieces of the pair dialog and the pair bar: a model picker, an "auto or a number" field, llama.cpp's GPU
layers field, a check that never raises, and the view of the doctor's findings."""

from __future__ import annotations

import html
import os

from PySide6.QtCore import QRectF, QRegularExpression, Qt, QUrl, Signal
from PySide6.QtGui import QAction, QColor, QFont, QImage, QPainter, QPalette, QRegularExpressionValidator
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QMenu,
    QPushButton,
    QTextBrowser,
    QWidget,
)

from engine import EngineUnavailable, Finding, ModelRef, Preflight, SpecDeckError

AUTO = "auto"

SEVERITY_COLOURS = {"ok": "#009E73", "info": "#0072B2", "warning": "#E69F00", "error": "#D55E00"}
SEVERITY_GLYPHS = {"ok": "✓", "info": "i", "warning": "!", "error": "✕"}
_SOURCES = {
    "embedded": "built-in",
    "pypi": "installed from PyPI",
    "file": "GGUF",
    "folder": "folder",
    "hf-cache": "Hugging Face cache",
    "ollama": "Ollama",
    "llama.cpp-cache": "llama.cpp cache",
}


def format_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def model_label(ref: ModelRef) -> str:
    kind = _SOURCES.get(ref.source, ref.source)
    if ref.source == "folder" and ref.kind == "gguf":
        kind = "GGUF"
    facts = [kind, ref.quant, format_size(ref.size_bytes)]  # a GGUF's quantization type beside its name
    return f"{ref.name}  ({', '.join(f for f in facts if f)})"


def add_models(combo: QComboBox, models, label=model_label) -> None:
    """List `models` in `combo`: `label(ref)` as the text, the spec as data, the path as the tooltip."""
    for ref in models:
        combo.addItem(label(ref), ref.spec)
        combo.setItemData(combo.count() - 1, ref.path, Qt.ToolTipRole)


class ModelPicker(QWidget):
    """An editable list of the models found on this machine, and a Browse… menu for files and folders.

    What a user types is a model spec (a path or repo id); a listed model shows
    its name and keeps its spec as item data.
    """

    sig_edited = Signal()
    """The text changed by typing: what it names is not settled yet."""
    sig_chosen = Signal()
    """A model was picked from the list or a file dialog, or typing finished: worth checking now."""
    sig_browsed = Signal(str)
    """The folder a file dialog was left in (the next one starts there)."""

    def __init__(self, models: list[ModelRef], role: str, parent=None) -> None:
        super().__init__(parent)
        self.role = role
        self.combo = QComboBox(self)
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QComboBox.NoInsert)  # a typed path must not join the list
        self.combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(24)
        add_models(self.combo, models)
        self.combo.lineEdit().setPlaceholderText("default, a .gguf file, a model folder or a repo id")
        self.combo.lineEdit().textEdited.connect(self.sig_edited)
        self.combo.lineEdit().editingFinished.connect(self.sig_chosen)
        self.combo.activated.connect(self.sig_chosen)

        self.browse = QPushButton("Browse…", self)
        self.browse.setAutoDefault(False)  # Enter belongs to the dialog's Load button
        menu = QMenu(self.browse)
        menu.addAction(QAction("GGUF file…", menu, triggered=self._browse_file))
        menu.addAction(QAction("Hugging Face model folder…", menu, triggered=self._browse_folder))
        self.browse.setMenu(menu)
        self.start_dir = os.path.expanduser("~")

        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.combo, 1)
        layout.addWidget(self.browse)

    def spec(self) -> str:
        text = self.combo.currentText()
        index = self.combo.findText(text, Qt.MatchExactly)
        return self.combo.itemData(index) if index >= 0 else text.strip()

    def set_spec(self, spec: str) -> None:
        index = self.combo.findData(spec)
        if index >= 0:
            self.combo.setCurrentIndex(index)
        else:
            self.combo.setEditText(spec)
        self.combo.lineEdit().setCursorPosition(0)  # show a long name or path from its start

    def _browse_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, f"Choose the {self.role} (GGUF file)", self._browse_start(), "GGUF models (*.gguf);;All files (*)"
        )
        self._picked(path)

    def _browse_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, f"Choose the {self.role} (model folder)", self._browse_start())
        self._picked(path)

    def _browse_start(self) -> str:
        current = os.path.expanduser(self.spec())
        if os.path.exists(current):
            return current if os.path.isdir(current) else os.path.dirname(current)
        return self.start_dir

    def _picked(self, path: str) -> None:
        if path:  # empty when the user cancelled
            self.start_dir = os.path.dirname(path)
            self.sig_browsed.emit(self.start_dir)
            self.set_spec(path)
            self.sig_chosen.emit()


def auto_or_number(text) -> str:
    """ "auto" or the digits of a whole number ("0" too: the check explains why it will not do);
    anything else (a hand-edited file) becomes "auto"."""
    text = str(text).strip().lower().removeprefix("+")
    return str(int(text)) if text.isdigit() and text.isascii() else AUTO


class PathPicker(QWidget):
    """A folder typed or chosen with Browse… (a drafter's folder option the app has no list of)."""

    sig_chosen = Signal()
    """A folder was chosen in the file dialog, or typing finished."""

    def __init__(self, label: str, parent=None) -> None:
        super().__init__(parent)
        self.label = label
        self.edit = QLineEdit(self)
        self.edit.editingFinished.connect(self.sig_chosen)
        self.browse = QPushButton("Browse…", self)
        self.browse.setAutoDefault(False)  # Enter belongs to the dialog's Load button
        self.browse.clicked.connect(self._browse)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.edit, 1)
        layout.addWidget(self.browse)

    def folder(self) -> str:
        return self.edit.text().strip()

    def set_path(self, path: str) -> None:
        self.edit.setText(path)
        self.edit.setCursorPosition(0)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, f"Choose the {self.label.lower()}", self.folder())
        if folder:
            self.set_path(folder)
            self.sig_chosen.emit()


class AutoNumberField(QComboBox):
    """ "auto" or a whole number: an editable list with "auto" and a few suggestions.

    Only digits or "auto" can be typed; the value is kept as typed, so a number
    the engine would refuse (a window of 0) reaches the check, which says why,
    rather than being silently changed.
    """

    sig_edited = Signal()
    """Typing: the value is not settled yet."""
    sig_chosen = Signal()
    """A value was picked from the list, or typing finished."""

    def __init__(self, suggestions=(), parent=None, tooltip: str = "") -> None:
        super().__init__(parent)
        self.setEditable(True)
        self.setInsertPolicy(QComboBox.NoInsert)
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(5)
        for text in (AUTO, *(str(s) for s in suggestions)):
            self.addItem(text)
        pattern = QRegularExpression("auto|\\+?[0-9]{1,4}", QRegularExpression.CaseInsensitiveOption)
        self.setValidator(QRegularExpressionValidator(pattern, self))
        self.lineEdit().setPlaceholderText(AUTO)
        if tooltip:
            self.setToolTip(tooltip)
        self.lineEdit().textEdited.connect(self.sig_edited)
        self.lineEdit().editingFinished.connect(self._finished)
        self.activated.connect(self.sig_chosen)

    def value(self) -> str:
        """ "auto" or the number as text."""
        return auto_or_number(self.currentText() or AUTO)

    def set_value(self, value) -> None:
        text = auto_or_number(value)
        index = self.findText(text, Qt.MatchExactly)
        if index >= 0:
            self.setCurrentIndex(index)
        self.setEditText(text)

    def _finished(self) -> None:
        if self.currentText() != self.value():  # "" or "AUTO" or "+3": show what it means
            self.setEditText(self.value())
        self.sig_chosen.emit()


class GpuLayersField(QComboBox):
    """llama.cpp's GPU layers: "auto" (none: offload is opt-in until it has run on a GPU), "all"
    (-1), or a number of layers; with `follows`, first "as the target" (None: the target's value).

    Only those can be typed; what the engine chose shows once the pair is loaded.
    """

    sig_edited = Signal()
    """Typing: the value is not settled yet."""
    sig_chosen = Signal()
    """A value was picked from the list, or typing finished."""

    ALL = "all"

    def __init__(self, parent=None, follows: str = "") -> None:
        super().__init__(parent)
        self.follows = follows  # the text of "as the target", or "" when there is nothing to follow
        self.setEditable(True)
        self.setInsertPolicy(QComboBox.NoInsert)
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(len(follows) or 5)
        for text in ((follows,) if follows else ()) + (AUTO, self.ALL, "0"):
            self.addItem(text)
        words = "|".join(QRegularExpression.escape(w) for w in ((follows,) if follows else ()) + (AUTO, self.ALL))
        pattern = QRegularExpression(f"{words}|\\+?[0-9]{{1,4}}", QRegularExpression.CaseInsensitiveOption)
        self.setValidator(QRegularExpressionValidator(pattern, self))
        self.lineEdit().setPlaceholderText(follows or AUTO)  # what an empty field means
        self.lineEdit().textEdited.connect(self.sig_edited)
        self.lineEdit().editingFinished.connect(self._finished)
        self.activated.connect(self.sig_chosen)

    def value(self):
        """ "auto", -1 for "all", the number, or None for "as the target"; an unreadable text is "auto"."""
        text = self.currentText().strip().lower()
        if self.follows and text in (self.follows.lower(), ""):
            return None
        if text == self.ALL:
            return -1
        number = auto_or_number(text)
        return AUTO if number == AUTO else int(number)

    def set_value(self, value) -> None:
        if value is None:
            text = self.follows or AUTO
        elif isinstance(value, int) and not isinstance(value, bool) and value < 0:
            text = self.ALL
        else:
            text = self.ALL if str(value).strip().lower() == self.ALL else auto_or_number(value)
        index = self.findText(text, Qt.MatchExactly)
        if index >= 0:
            self.setCurrentIndex(index)
        self.setEditText(text)

    def _finished(self) -> None:
        self.set_value(self.value())  # "" or "AUTO" or "+3": show what it means
        self.sig_chosen.emit()


def checked(check, config, retry: str = "Press Check pair to try again.") -> Preflight:
    """`check(config)` (a Preflight), on a worker thread: never raises. A check that cannot run (the
    engine process did not start, or stopped during the check: `retry` says what to do) or fails is an
    error finding that says so."""
    try:
        return check(config)
    except EngineUnavailable as e:
        return Preflight((Finding("error", "The engine could not check this pair", f"{e} {retry}"),))
    except SpecDeckError as e:
        return Preflight((Finding("error", "The engine could not check this pair", str(e)),))
    except Exception as e:  # a bug, not a bad model: still no traceback in the user's face
        return Preflight((Finding("error", "The check failed", f"{type(e).__name__}: {e}"),))


class FindingsView(QTextBrowser):
    """The doctor's findings in plain words, each with a severity badge, under a one-line verdict."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setMinimumHeight(150)
        self._badges = {s: severity_badge(s, self.font()) for s in SEVERITY_COLOURS}
        self.verdict = ""  # the headline shown; tests and the dialog read it

    def loadResource(self, kind: int, url: QUrl):
        # The badges are painted, not files: answer their "severity:" URLs here.
        if url.scheme() == "severity" and url.path() in self._badges:
            return self._badges[url.path()]
        return super().loadResource(kind, url)

    def show_message(self, text: str, severity: str | None = None) -> None:
        self._render(text, severity, ())

    def show_result(self, result) -> None:
        """`result`: the engine's `Preflight` (findings, compatible, warnings)."""
        if not result.compatible:
            verdict = "Cannot be loaded: fix what is marked below, then check again."
            severity = "error"
        elif result.warnings:
            verdict = f"Can be loaded, with {result.warnings} warning{'s' if result.warnings > 1 else ''}."
            severity = "warning"
        else:
            verdict = "Can be loaded."
            severity = "ok"
        # Errors first: they are what stands between the user and the Load button.
        order = {"error": 0, "warning": 1, "info": 2, "ok": 3}
        self._render(verdict, severity, sorted(result.findings, key=lambda f: order.get(f.severity, 4)))

    def _render(self, verdict: str, severity: str | None, findings) -> None:
        self.verdict = verdict
        text = self.palette().color(QPalette.ColorRole.Text).name()
        colour = SEVERITY_COLOURS.get(severity, text)
        rows = [f"<p style='margin:2px 0 6px 0'><b style='color:{colour}'>{html.escape(verdict)}</b></p>"]
        rows.append("<table cellspacing='0' cellpadding='3' width='100%'>")
        for f in findings:
            rows.append(finding_row(f))
        rows.append("</table>")
        self.setHtml("".join(rows))


def finding_row(f: Finding) -> str:
    return (
        f"<tr><td width='22' valign='top'><img src='severity:{f.severity}' width='16' height='16'></td>"
        f"<td valign='top'><b>{html.escape(f.title)}</b><br>{html.escape(f.detail)}</td></tr>"
    )


def severity_badge(severity: str, font: QFont, size: int = 32) -> QImage:
    """A round badge in the severity's colour with a glyph; painted, so it looks the same on every platform."""
    image = QImage(size, size, QImage.Format_ARGB32_Premultiplied)
    image.fill(Qt.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.Antialiasing)
    painter.setPen(Qt.NoPen)
    painter.setBrush(QColor(SEVERITY_COLOURS[severity]))
    painter.drawEllipse(QRectF(1, 1, size - 2, size - 2))
    glyph_font = QFont(font)
    glyph_font.setBold(True)
    glyph_font.setPixelSize(int(size * 0.62))
    painter.setFont(glyph_font)
    painter.setPen(QColor("white"))
    painter.drawText(QRectF(0, 0, size, size), Qt.AlignCenter, SEVERITY_GLYPHS[severity])
    painter.end()
    return image
