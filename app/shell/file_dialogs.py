"""Save dialogs for exports, remembering the folder last used.

A failed write (full disk, no permission) becomes a banner message, like every
other error; nothing here raises into the event loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings, QStandardPaths
from PySide6.QtWidgets import QFileDialog

from app.shell import settings as keys
from app.chat.conversations import Conversation, export_markdown, write_text_atomically

if TYPE_CHECKING:
    from app.shell.main_window import MainWindow

_CHART_FORMATS = {"png": "PNG image (*.png)", "svg": "SVG drawings, one per panel (*.svg)", "csv": "CSV table (*.csv)",
                  "json": "JSON document (*.json)"}  # fmt: skip


def _ask_path(window: MainWindow, caption: str, name: str, file_filter: str) -> Path | None:
    settings = QSettings()
    home = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    folder = keys.read(settings, keys.EXPORT_FOLDER, home) or home
    path, _ = QFileDialog.getSaveFileName(window, caption, str(Path(folder) / name), file_filter)
    if not path:
        return None
    settings.setValue(keys.EXPORT_FOLDER, str(Path(path).parent))
    return Path(path)


def _safe_name(title: str) -> str:
    name = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip()
    return name or "conversation"


def export_conversation(window: MainWindow, conversation: Conversation) -> None:
    path = _ask_path(window, "Export conversation", f"{_safe_name(conversation.title)}.md", "Markdown (*.md)")
    if path is None:
        return
    try:
        write_text_atomically(path, export_markdown(conversation))
    except OSError as error:
        window.show_error(f"Could not write {path}: {error.strerror or error}.")
        return
    window.statusBar().showMessage(f"Exported to {path}", 5000)


def export_charts(window: MainWindow, kind: str) -> None:
    path = _ask_path(window, f"Export charts as {kind.upper()}", f"specdeck-charts.{kind}", _CHART_FORMATS[kind])
    if path is None:
        return
    try:
        written = getattr(window.charts, f"export_{kind}")(path)
    except OSError as error:
        window.show_error(f"Could not write {path}: {error.strerror or error}.")
        return
    if kind == "svg":  # one file per panel, beside the name chosen
        window.statusBar().showMessage(f"Charts exported as {len(written)} SVG files in {path.parent}", 5000)
    else:
        window.statusBar().showMessage(f"Charts exported to {path}", 5000)
