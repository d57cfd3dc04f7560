"""Medusa heads in the app: where trained heads go, which ones the pair dialog offers, a picker.

Heads trained in the app are saved under the app data folder (heads/, beside
conversations/; under $SPECDECK_DATA_DIR when that is set) and remembered in
the settings, so the pair dialog can offer them. "Shipped" means the heads that
come with SpecDeck for the target (resources/heads/), which the engine picks
itself when the heads folder is left empty.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from PySide6.QtCore import QSettings, QStandardPaths, Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QPushButton, QWidget

from app.conversations import DATA_DIR_ENV
from app.presets import PREFIX

TRAINED_KEY = "medusa/trained"  # JSON list of folders trained in the app, newest first
LAST_TRAINED_KEY = "medusa/last_trained"
MAX_REMEMBERED = 12
SHIPPED_LABEL = "Shipped heads for the target"


def heads_root() -> Path:
    """Where the train dialog saves heads by default."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override) / "heads"
    return Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)) / "heads"


def default_output_dir(target_name: str) -> Path:
    """heads/medusa-<target name>, e.g. heads/medusa-smollm2-135m-instruct.q4_1."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", target_name.lower()).strip("-.") or "model"
    return heads_root() / f"medusa-{slug}"


def is_heads_folder(folder: str | os.PathLike) -> bool:
    return (Path(folder) / "config.json").is_file() and any(Path(folder).glob("medusa_lm_head.*"))


def remember_trained(folder: str, settings: QSettings | None = None) -> None:
    """Put `folder` first in the list the pair dialog offers, and make it the pair dialog's heads
    (chosen once the user picks the Medusa drafter; the drafter itself is left as it is)."""
    settings = settings if settings is not None else QSettings()
    folders = [folder] + [f for f in trained_folders(settings) if f != folder]
    settings.setValue(TRAINED_KEY, json.dumps(folders[:MAX_REMEMBERED]))
    settings.setValue(LAST_TRAINED_KEY, folder)
    settings.setValue(f"{PREFIX}/heads", folder)


def trained_folders(settings: QSettings | None = None) -> list[str]:
    settings = settings if settings is not None else QSettings()
    try:
        folders = json.loads(settings.value(TRAINED_KEY, "[]", type=str))
    except ValueError:
        return []
    return [str(f) for f in folders if isinstance(f, str)] if isinstance(folders, list) else []


def last_trained(settings: QSettings | None = None) -> str:
    settings = settings if settings is not None else QSettings()
    folder = settings.value(LAST_TRAINED_KEY, "", type=str)
    return folder if folder and is_heads_folder(folder) else ""


def known_heads(settings: QSettings | None = None) -> list[str]:
    """Heads folders to offer: trained in the app (newest first), then any others under heads_root()."""
    folders = [f for f in trained_folders(settings) if is_heads_folder(f)]
    root = heads_root()
    if root.is_dir():
        for sub in sorted(root.iterdir()):
            if sub.is_dir() and is_heads_folder(sub) and str(sub) not in folders:
                folders.append(str(sub))
    return folders


def describe_heads(folder: str) -> str:
    """One line about a heads folder: how many heads, for which model, how well they did."""
    from engine.errors import SpecDeckError
    from engine.heads.medusa import read_config

    try:
        config = read_config(folder)
    except SpecDeckError as error:
        return str(error)
    text = f"{config.num_heads} heads"
    if config.base_model:
        text += f" for {config.base_model}"
    facts = config.training
    if facts.get("steps"):
        text += f", {facts['steps']} training steps"
    accuracy = facts.get("validation_head_accuracy")
    if accuracy:
        text += "; held-out top-1 agreement " + ", ".join(f"{a:.0%}" for a in accuracy)
    return text


def engine_notes(engine) -> tuple[str, ...]:
    """The engine's plain-text notes about the loaded pair (e.g. a tree cut to a chain), if it has any."""
    notes = getattr(engine, "notes", ()) if engine is not None else ()
    return tuple(str(n) for n in notes or () if n)


class HeadsPicker(QWidget):
    """An editable list of heads folders (the shipped heads first) and a Browse… button."""

    sig_chosen = Signal()
    """A folder was picked from the list or the file dialog, or typing finished."""

    def __init__(self, parent=None, settings: QSettings | None = None) -> None:
        super().__init__(parent)
        self.combo = QComboBox(self)
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QComboBox.NoInsert)
        self.combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(24)
        self.combo.addItem(SHIPPED_LABEL, "")
        self.combo.setItemData(0, "The heads that ship with SpecDeck for this target (the embedded model has some)",
                               Qt.ToolTipRole)  # fmt: skip
        for folder in known_heads(settings):
            self.combo.addItem(folder, folder)
            self.combo.setItemData(self.combo.count() - 1, describe_heads(folder), Qt.ToolTipRole)
        self.combo.lineEdit().setPlaceholderText("a folder with config.json and medusa_lm_head.safetensors")
        self.combo.lineEdit().editingFinished.connect(self.sig_chosen)
        self.combo.activated.connect(self.sig_chosen)
        self.browse = QPushButton("Browse…", self)
        self.browse.setAutoDefault(False)
        self.browse.clicked.connect(self._browse)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.combo, 1)
        layout.addWidget(self.browse)

    def folder(self) -> str:
        """The chosen folder; "" for the shipped heads."""
        text = self.combo.currentText()
        index = self.combo.findText(text, Qt.MatchExactly)
        return self.combo.itemData(index) if index >= 0 else text.strip()

    def set_folder(self, folder: str) -> None:
        index = self.combo.findData(folder or "")
        if index >= 0:
            self.combo.setCurrentIndex(index)
        else:
            self.combo.setEditText(folder)
        self.combo.lineEdit().setCursorPosition(0)

    def choices(self) -> list[str]:
        return [self.combo.itemData(i) for i in range(self.combo.count())]

    def _browse(self) -> None:
        start = self.folder() or str(heads_root() if heads_root().is_dir() else Path.home())
        folder = QFileDialog.getExistingDirectory(self, "Choose a Medusa heads folder", start)
        if folder:
            self.set_folder(folder)
            self.sig_chosen.emit()
