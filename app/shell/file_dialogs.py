"""Save dialogs for exports, remembering the folder last used.

`Exports` asks where, writes, and says how it went by signal: the window shows
`sig_exported` in its status bar and `sig_failed` in its banner, like every
other error. A failed write (full disk, no permission) is such a message;
nothing here raises into the event loop, and nothing here knows the window.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QSettings, QStandardPaths, Signal
from PySide6.QtWidgets import QFileDialog, QWidget

from app.charts.live import LiveCharts
from app.chat.conversations import Conversation, export_markdown, write_text_atomically
from app.shell import settings as keys

_CHART_FORMATS = {
    "png": "PNG image (*.png)",
    "svg": "SVG drawings, one per panel (*.svg)",
    "csv": "CSV table (*.csv)",
    "json": "JSON document (*.json)",
}


class Exports(QObject):
    """File ▸ Export…: a conversation as Markdown, the live charts as PNG, SVG, CSV or JSON."""

    sig_exported = Signal(str)
    """A file (or files) were written: a line for the status bar that says where."""

    sig_failed = Signal(str)
    """A write failed: the message for the user (what, where, why)."""

    def __init__(self, parent: QWidget, charts: LiveCharts) -> None:
        super().__init__(parent)
        self._dialog_parent = parent
        self._charts = charts

    def conversation(self, conversation: Conversation) -> None:
        path = self._ask_path("Export conversation", f"{_safe_name(conversation.title)}.md", "Markdown (*.md)")
        if path is None:
            return
        try:
            write_text_atomically(path, export_markdown(conversation))
        except OSError as error:
            self.sig_failed.emit(f"Could not write {path}: {error.strerror or error}.")
            return
        self.sig_exported.emit(f"Exported to {path}")

    def charts(self, kind: str) -> None:
        """`kind`: "png", "svg", "csv" or "json"."""
        path = self._ask_path(f"Export charts as {kind.upper()}", f"specdeck-charts.{kind}", _CHART_FORMATS[kind])
        if path is None:
            return
        try:
            written = getattr(self._charts, f"export_{kind}")(path)
        except OSError as error:
            self.sig_failed.emit(f"Could not write {path}: {error.strerror or error}.")
            return
        if kind == "svg":  # one file per panel, beside the name chosen
            self.sig_exported.emit(f"Charts exported as {len(written)} SVG files in {path.parent}")
        else:
            self.sig_exported.emit(f"Charts exported to {path}")

    def _ask_path(self, caption: str, name: str, file_filter: str) -> Path | None:
        settings = QSettings()
        home = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
        folder = keys.read(settings, keys.EXPORT_FOLDER, home) or home
        path, _ = QFileDialog.getSaveFileName(self._dialog_parent, caption, str(Path(folder) / name), file_filter)
        if not path:
            return None
        settings.setValue(keys.EXPORT_FOLDER, str(Path(path).parent))
        return Path(path)


def _safe_name(title: str) -> str:
    name = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip()
    return name or "conversation"
