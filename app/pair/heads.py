"""Trained drafter heads in the app (Medusa heads, EAGLE and EAGLE-3 heads): where they go, which
ones the pair dialog offers, a picker.

Heads trained in the app are saved under the app data folder (heads/, beside
conversations/; under $SPECDECK_DATA_DIR when that is set) and remembered in
the settings, so the pair dialog can offer them. "Shipped" means the heads that
come with SpecDeck for the target (resources/heads/), which the engine picks
itself when the heads folder is left empty.

A folder's kind is read from its files: Medusa heads are config.json with
medusa_lm_head.safetensors; an EAGLE head is config.json (without Medusa's keys)
with model.safetensors or pytorch_model.bin (engine/heads/eagle.py), an EAGLE-3 head
the same with a draft vocabulary of its own in config.json (engine/heads/eagle3.py).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QStandardPaths, Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QPushButton, QWidget

import engine
from app.chat.conversations import DATA_DIR_ENV
from engine import (
    describe_heads,  # one line about a heads folder, as the pair check says it
    heads_config_kind,
)

TRAINED_KEY = "medusa/trained"  # JSON list of folders trained in the app (either kind), newest first
LAST_TRAINED_KEY = "medusa/last_trained"
MAX_REMEMBERED = 12
KINDS = ("medusa", "eagle", "eagle3")
KIND_NAMES = {"medusa": "Medusa heads", "eagle": "EAGLE head", "eagle3": "EAGLE-3 head"}
_EAGLE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def resources_dir() -> Path:
    """engine.models.shipped.resources_dir, which cannot be imported here: its module loads torch."""
    bundle = getattr(sys, "_MEIPASS", None)
    return Path(bundle) / "resources" if bundle else Path(engine.__file__).resolve().parents[1] / "resources"


def shipped_models(kind: str) -> list[str]:
    """The models SpecDeck ships heads of `kind` for (resources/heads/{kind}-{model}/), e.g. ["smollm2-135m"]."""
    folder = resources_dir() / "heads"
    if not folder.is_dir():
        return []
    return sorted(
        sub.name[len(kind) + 1 :]
        for sub in folder.iterdir()
        if sub.name.startswith(f"{kind}-") and (sub / "config.json").is_file()
    )


def shipped_label(kind: str) -> str | None:
    """The first entry of a heads picker: the shipped heads and the models they are for; None when
    no heads of this kind ship at all (the picker then offers no shipped entry)."""
    models = shipped_models(kind)
    return f"Shipped {KIND_NAMES[kind]} (for {', '.join(models)} only)" if models else None


def heads_root() -> Path:
    """Where the train dialog saves heads by default."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override) / "heads"
    return Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)) / "heads"


def default_output_dir(target_name: str, kind: str = "medusa") -> Path:
    """heads/<kind>-<target name>, e.g. heads/medusa-smollm2-135m-instruct.q4_1."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", target_name.lower()).strip("-.") or "model"
    return heads_root() / f"{kind}-{slug}"


def heads_kind(folder: str | os.PathLike) -> str | None:
    """ "medusa", "eagle" or "eagle3" for a heads folder, None for anything else."""
    folder = Path(folder)
    config = folder / "config.json"
    if not config.is_file():
        return None
    if any(folder.glob("medusa_lm_head.*")):
        return "medusa"
    if any((folder / name).is_file() for name in _EAGLE_WEIGHTS):
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        kind = heads_config_kind(data) if isinstance(data, dict) else None
        return kind if kind != "medusa" else None  # Medusa's weights are another file
    return None


def is_heads_folder(folder: str | os.PathLike, kind: str | None = None) -> bool:
    """A folder of trained heads (of `kind`, when given)."""
    found = heads_kind(folder)
    return found is not None and (kind is None or found == kind)


def remember_trained(folder: str, settings: QSettings | None = None, kind: str = "medusa") -> None:
    """Put `folder` first in the list the pair dialog offers; its picker of that kind then starts
    on it (`newest_trained`) unless the saved pair names other heads (the drafter is left as it is)."""
    settings = settings if settings is not None else QSettings()
    folders = [folder] + [f for f in trained_folders(settings) if f != folder]
    settings.setValue(TRAINED_KEY, json.dumps(folders[:MAX_REMEMBERED]))
    settings.setValue(LAST_TRAINED_KEY, folder)


def newest_trained(kind: str, settings: QSettings | None = None) -> str:
    """The heads of `kind` trained last in the app (still there), or "" (the shipped ones)."""
    return next((f for f in trained_folders(settings) if is_heads_folder(f, kind)), "")


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


def known_heads(settings: QSettings | None = None, kind: str | None = None) -> list[str]:
    """Heads folders (of `kind`, when given) to offer: trained in the app (newest first), then any
    others under heads_root()."""
    folders = [f for f in trained_folders(settings) if is_heads_folder(f, kind)]
    root = heads_root()
    if root.is_dir():
        for sub in sorted(root.iterdir()):
            if sub.is_dir() and is_heads_folder(sub, kind) and str(sub) not in folders:
                folders.append(str(sub))
    return folders


def engine_notes(engine) -> tuple[str, ...]:
    """The engine's plain-text notes about the loaded pair (e.g. a tree cut to a chain), if it has any."""
    notes = getattr(engine, "notes", ()) if engine is not None else ()
    return tuple(str(n) for n in notes or () if n)


class HeadsPicker(QWidget):
    """An editable list of heads folders of one kind (the shipped ones first) and a Browse… button."""

    sig_chosen = Signal()
    """A folder was picked from the list or the file dialog, or typing finished."""

    def __init__(self, parent=None, settings: QSettings | None = None, kind: str = "medusa") -> None:
        super().__init__(parent)
        self.kind = kind
        self.combo = QComboBox(self)
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QComboBox.NoInsert)
        self.combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(24)
        label = shipped_label(kind)
        if label is not None:
            self.combo.addItem(label, "")
            self.combo.setItemData(
                0,
                f"The {KIND_NAMES[kind]} that ship with SpecDeck: the engine uses them when "
                "the target is one of these models",
                Qt.ToolTipRole,
            )
        for folder in known_heads(settings, kind):
            self.combo.addItem(folder, folder)
            self.combo.setItemData(self.combo.count() - 1, describe_heads(folder), Qt.ToolTipRole)
        files = {"medusa": "medusa_lm_head.safetensors"}.get(kind, "model.safetensors")
        if label is None:  # nothing ships: the empty field asks for a folder
            self.combo.setCurrentIndex(-1)
            self.combo.setEditText("")
            files += f" (no {KIND_NAMES[kind]} ships with SpecDeck: train one with Models > Train heads…)"
        self.combo.lineEdit().setPlaceholderText(f"a folder with config.json and {files}")
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
        title = {
            "medusa": "Choose a Medusa heads folder",
            "eagle": "Choose an EAGLE head folder",
            "eagle3": "Choose an EAGLE-3 head folder",
        }[self.kind]
        folder = QFileDialog.getExistingDirectory(self, title, start)
        if folder:
            self.set_folder(folder)
            self.sig_chosen.emit()
