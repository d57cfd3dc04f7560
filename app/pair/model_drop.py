"""Dropping a model from the file manager: a .gguf file or a model folder, on a window or a model field.

`ModelDrops` watches widgets as an event filter, so a widget keeps its own
drops of text (typing a path by dragging a text selection still works) and only
local files are taken. A drop is checked with `resolve`, which reads a file's
first bytes only; what is not a model is refused with the reason, for the view
to show, except on a text field that takes files itself (the chat's input),
which gets them as before. Holding Shift makes the dropped model the draft model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QMimeData, QObject, Qt
from PySide6.QtWidgets import QWidget

from engine import SpecDeckError, resolve

TARGET, DRAFT = "target", "draft"


def dropped_files(mime: QMimeData) -> list[str]:
    """The local files and folders a drag carries; links to web pages are not files."""
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile()] if mime.hasUrls() else []


def model_from_drop(mime: QMimeData) -> tuple[str, str]:
    """(the dropped model's path, "") when the drag holds one model, else ("", why it is refused)."""
    paths = dropped_files(mime)
    if not paths:
        return "", "Only files can be dropped here: drop a .gguf file or a model folder."
    if len(paths) > 1:
        return "", f"{len(paths)} files were dropped: drop one model at a time (a .gguf file or a model folder)."
    path = paths[0]
    try:
        resolve(path)
    except SpecDeckError as error:
        return "", f"{Path(path).name} was not opened: it is not a model. {error}"
    return path, ""


class ModelDrops(QObject):
    """Takes drops of local files on the widgets it watches: `on_model(path, role)` or `on_refused(message)`."""

    def __init__(self, parent: QObject, on_model: Callable[[str, str], None], on_refused: Callable[[str], None]):
        super().__init__(parent)
        self._on_model, self._on_refused = on_model, on_refused
        self._roles: dict[QObject, str] = {}
        self._only_models: set[QObject] = set()  # widgets that take other files themselves
        self._taking: set[QObject] = set()  # watched widgets whose current drag is ours

    def watch(self, widget: QWidget, role: str = TARGET, *, only_models: bool = False) -> None:
        """Drops on `widget` name the model for `role` (TARGET or DRAFT; Shift makes any drop DRAFT).

        With `only_models`, a drag that is not one model is left to the widget, refusal unsaid.
        """
        self._roles[widget] = role
        if only_models:
            self._only_models.add(widget)
        widget.setAcceptDrops(True)
        widget.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt API
        kind = event.type()
        if kind not in (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop) or watched not in self._roles:
            return False
        if kind == QEvent.Type.DragEnter:  # decided once per drag, not at every move
            files = dropped_files(event.mimeData())
            ours = bool(files) and (watched not in self._only_models or bool(model_from_drop(event.mimeData())[0]))
            (self._taking.add if ours else self._taking.discard)(watched)
        if watched not in self._taking:
            return False  # text and the like, or a file for a field that takes files: the widget's own business
        event.acceptProposedAction()  # any file, so that a refused one is told why rather than ignored
        if kind == QEvent.Type.Drop:
            shift = bool(event.modifiers() & Qt.KeyboardModifier.ShiftModifier)
            path, problem = model_from_drop(event.mimeData())
            if path:
                self._on_model(path, DRAFT if shift else self._roles[watched])
            else:
                self._on_refused(problem)
        return True
