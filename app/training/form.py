"""The settings half of the train dialog: kind, target, data, sizes and output folder, as train_heads' arguments."""

from __future__ import annotations

import shlex
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.pair.heads import default_output_dir
from app.pair.widgets import ModelPicker
from engine import ConfigError, SpecDeckError, list_models, resolve

DATA_KINDS = (
    ("Built-in corpus: documentation and licences on this computer", "builtin"),
    ("A text file (.txt, .md, .jsonl)", "file"),
    ("A folder of text files", "folder"),
    ("Only replies the target writes itself", "none"),
)
OBJECTIVES = (("Fast: regress the target's cached features", "features"), ("Exact: full-vocabulary KL, slow", "kl"))
KINDS = (("Medusa heads", "medusa"), ("EAGLE head", "eagle"), ("EAGLE-3 head", "eagle3"))
ONE_HEAD = ("eagle", "eagle3")  # one decoder layer drafting a tree: no Medusa sizes, a draft vocabulary
DEFAULT_DRAFT_VOCAB = 8192  # engine.training.eagle.DEFAULT_DRAFT_VOCAB (not imported: it loads torch)


def _spin(low: int, high: int, value: int, parent, step: int = 1, special: str | None = None) -> QSpinBox:
    spin = QSpinBox(parent)
    spin.setRange(low, high)
    spin.setSingleStep(step)
    spin.setValue(value)
    if special:
        spin.setSpecialValueText(special)
    return spin


def _path_row(edit: QLineEdit, button: QPushButton) -> QWidget:
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(edit, 1)
    layout.addWidget(button)
    button.setAutoDefault(False)  # Enter belongs to Start
    return row


class TrainForm(QWidget):
    sig_kind_changed = Signal(str)
    """The kind of heads changed ("medusa", "eagle" or "eagle3")."""

    def __init__(self, target: str, parent=None) -> None:
        super().__init__(parent)
        self._default_out = ""  # the output folder last filled in from the target's name
        self._running = False
        self.kind = QComboBox(self)
        for text, kind in KINDS:
            self.kind.addItem(text, kind)
        self.kind.setToolTip(
            "Medusa: a few heads, each guessing one token further ahead from the target's last "
            "hidden state. EAGLE: one decoder layer that guesses the target's next hidden state, "
            "drafting a tree step by step (usually accepted more often). EAGLE-3: one layer fed "
            "by three of the target's layers, trained on its own guesses, with its own draft "
            "vocabulary"
        )
        self.target = ModelPicker(list_models(), "target", self)
        self.data_kind = QComboBox(self)
        for text, kind in DATA_KINDS:
            self.data_kind.addItem(text, kind)
        self.data_path = QLineEdit(self)
        self.data_path.setPlaceholderText("the file or folder to train on")
        self.data_browse = QPushButton("Browse…", self)
        # A check box says whether; the number beside it says how many replies (a spin box reading
        # "off" at 0 left the number unexplained).
        self.self_generate_on = QCheckBox("Also train on replies the target writes itself:", self)
        self.self_generate = _spin(1, 100_000, 100, self, step=10)
        self.self_generate.setSuffix(" replies")
        tip = (
            "Prompts the target answers itself before training: the closest data to what it will be asked to "
            "guess, and slow to make (a reply at a time)"
        )
        self.self_generate_on.setToolTip(tip)
        self.self_generate.setToolTip(tip)
        self.num_heads = _spin(1, 8, 4, self)
        self.num_layers = _spin(1, 4, 1, self)
        self.draft_vocab = _spin(0, 1_000_000, DEFAULT_DRAFT_VOCAB, self, step=1024, special="all")
        self.draft_vocab.setToolTip(
            "EAGLE proposes only the ids most frequent in the training data: fewer ids "
            "make each draft step cheaper (0 = the whole vocabulary)"
        )
        self.steps = _spin(1, 1_000_000, 500, self, step=100)
        self.batch_size = _spin(1, 256, 4, self)
        self.seq_len = _spin(16, 4096, 256, self, step=64)
        self.objective = QComboBox(self)
        for text, objective in OBJECTIVES:
            self.objective.addItem(text, objective)
        self.objective.setToolTip(
            "Fast runs the target once and trains on its stored hidden states for many "
            "epochs; exact runs it at every step and matches its whole distribution"
        )
        self.out_dir = QLineEdit(self)
        self.out_browse = QPushButton("Browse…", self)

        data_box = QGroupBox("Target and data", self)
        data_form = QFormLayout(data_box)
        data_form.addRow("&Kind:", self.kind)
        data_form.addRow("&Target:", self.target)
        data_form.addRow("&Data:", self.data_kind)
        data_form.addRow("File or folder:", _path_row(self.data_path, self.data_browse))
        self_generated = QWidget(self)
        row = QHBoxLayout(self_generated)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.self_generate_on)
        row.addWidget(self.self_generate)
        row.addStretch(1)
        data_form.addRow("Target's own replies:", self_generated)
        data_form.addRow("&Save heads in:", _path_row(self.out_dir, self.out_browse))
        sizes_box = QGroupBox("Heads and training", self)
        sizes = QGridLayout(sizes_box)
        self.size_labels = {}
        for column, (label, spin) in enumerate(
            (
                ("Heads:", self.num_heads),
                ("Layers per head:", self.num_layers),
                ("Steps:", self.steps),
                ("Batch:", self.batch_size),
                ("Tokens per sequence:", self.seq_len),
            )
        ):
            self.size_labels[spin] = QLabel(label, self)
            sizes.addWidget(self.size_labels[spin], 0, 2 * column)
            sizes.addWidget(spin, 0, 2 * column + 1)
        sizes.addWidget(QLabel("Objective:", self), 1, 0)
        sizes.addWidget(self.objective, 1, 1, 1, 5)
        self.draft_vocab_label = QLabel("Draft vocabulary:", self)
        sizes.addWidget(self.draft_vocab_label, 1, 8)  # under "Tokens per sequence:", the widest label
        sizes.addWidget(self.draft_vocab, 1, 9)
        sizes.setColumnStretch(2 * 5, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(data_box)
        layout.addWidget(sizes_box)

        self.data_kind.currentIndexChanged.connect(lambda: self.set_running(self._running))
        self.self_generate_on.toggled.connect(lambda: self.set_running(self._running))
        self.kind.currentIndexChanged.connect(self._kind_changed)
        self.data_browse.clicked.connect(self._browse_data)
        self.out_browse.clicked.connect(self._browse_out)
        self.target.sig_chosen.connect(self._follow_target)
        self.target.set_spec(target)
        self._follow_target()
        self.set_running(False)

    def heads_kind(self) -> str:
        return self.kind.currentData()

    def set_kind(self, kind: str) -> None:
        self.kind.setCurrentIndex(max(self.kind.findData(kind), 0))

    def options(self) -> dict:
        """train_heads' arguments for what the form shows; ConfigError when something is missing."""
        kind = self.data_kind.currentData()
        path = self.data_path.text().strip()
        if kind in ("file", "folder") and not path:
            raise ConfigError(f"Choose the {kind} to train on, or use the built-in corpus.")
        if not self.out_dir.text().strip():
            raise ConfigError("Choose the folder to save the heads in.")
        data = {"builtin": ["builtin"], "file": [path], "folder": [path], "none": []}[kind]
        options = {
            "kind": self.heads_kind(),
            "target_spec": self.target.spec(),
            "data": data,
            "out_dir": str(Path(self.out_dir.text().strip()).expanduser()),
            "steps": self.steps.value(),
            "batch_size": self.batch_size.value(),
            "seq_len": self.seq_len.value(),
            "self_generate": self.self_generated(),
            "objective": self.objective.currentData(),
        }
        if self.heads_kind() in ONE_HEAD:  # one head, drafted by depth: Medusa's sizes do not apply
            options["draft_vocab"] = self.draft_vocab.value()
        else:
            options.update(num_heads=self.num_heads.value(), num_layers=self.num_layers.value())
        return options

    def self_generated(self) -> int:
        """How many replies the target writes itself before training (0: none)."""
        return self.self_generate.value() if self.self_generate_on.isChecked() else 0

    def set_running(self, running: bool) -> None:
        """Nothing can change while a run uses these settings."""
        self._running = running
        eagle = self.heads_kind() in ONE_HEAD
        for widget in (
            self.kind,
            self.target,
            self.data_kind,
            self.steps,
            self.batch_size,
            self.seq_len,
            self.out_dir,
            self.out_browse,
        ):
            widget.setEnabled(not running)
        only_replies = self.data_kind.currentData() == "none"  # the target's replies are the only data
        if only_replies:
            self.self_generate_on.setChecked(True)
        self.self_generate_on.setEnabled(not running and not only_replies)
        self.self_generate.setEnabled(not running and self.self_generate_on.isChecked())
        for widget in (
            self.num_heads,
            self.num_layers,
            self.size_labels[self.num_heads],
            self.size_labels[self.num_layers],
        ):
            widget.setEnabled(not running and not eagle)
        # EAGLE trains on cached features only; the draft vocabulary is EAGLE's alone.
        self.objective.setEnabled(not running and not eagle)
        self.draft_vocab.setVisible(eagle)
        self.draft_vocab_label.setVisible(eagle)
        self.draft_vocab.setEnabled(not running)
        needs_path = self.data_kind.currentData() in ("file", "folder") and not running
        self.data_path.setEnabled(needs_path)
        self.data_browse.setEnabled(needs_path)

    def _kind_changed(self) -> None:
        eagle = self.heads_kind() in ONE_HEAD
        if eagle:
            self.objective.setCurrentIndex(self.objective.findData("features"))
        tip = "EAGLE has one head (one decoder layer); these are Medusa's sizes" if eagle else ""
        for widget in (self.num_heads, self.num_layers):
            widget.setToolTip(tip)
        self.set_running(self._running)
        self._follow_target()
        self.sig_kind_changed.emit(self.heads_kind())

    def _follow_target(self) -> None:
        """Keep the default output folder in step with the target and kind, unless another folder was chosen."""
        if self.out_dir.text().strip() not in ("", self._default_out):
            return
        spec = self.target.spec()
        try:
            name = resolve(spec).name
        except SpecDeckError:
            name = Path(spec).name or spec
        self._default_out = str(default_output_dir(name, self.heads_kind()))
        self.out_dir.setText(self._default_out)

    def _browse_data(self) -> None:
        start = self.data_path.text() or str(Path.home())
        if self.data_kind.currentData() == "folder":
            path = QFileDialog.getExistingDirectory(self, "Choose a folder of text files", start)
        else:
            path, _ = QFileDialog.getOpenFileName(
                self, "Choose a text file", start, "Text (*.txt *.md *.jsonl);;All files (*)"
            )
        if path:
            self.data_path.setText(path)

    def _browse_out(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Save the heads in", self.out_dir.text() or str(Path.home()))
        if path:
            self.out_dir.setText(path)


def command_line(options: dict) -> str:
    """The specdeck-cli command that trains the same heads (recorded with them)."""
    kind = options.get("kind", "medusa")
    args = ["specdeck-cli", "train-heads", "--kind", kind, "--target", options["target_spec"]]
    for source in options["data"]:
        args += ["--data", source]
    if options["self_generate"]:
        args += ["--self-generate", str(options["self_generate"])]
    args += ["--objective", options.get("objective", "features"), "--out", options["out_dir"]]
    if kind in ONE_HEAD:
        args += ["--draft-vocab", str(options.get("draft_vocab", DEFAULT_DRAFT_VOCAB))]
    else:
        args += ["--heads", str(options["num_heads"]), "--layers", str(options["num_layers"])]
    args += [
        "--steps",
        str(options["steps"]),
        "--batch-size",
        str(options["batch_size"]),
        "--seq-len",
        str(options["seq_len"]),
    ]
    return " ".join(shlex.quote(a) for a in args)
