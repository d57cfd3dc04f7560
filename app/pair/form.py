"""The settings half of the pair dialog: models, draft length, sampling and hardware, as a `PairChoice`."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QWidget,
)

from engine.core.draft_length import K_LIMIT
from engine.errors import SpecDeckError
from engine.models.locate import ModelRef
from engine.models.recommended import describe, recommended_sampling

from app.pair.heads import HeadsPicker
from app.pair.widgets import AutoNumberField, ModelPicker
from app.pair.presets import BACKENDS, DEVICES, DTYPES, PairChoice

DRAFTERS = (("Draft model", "model"), ("N-gram lookup (no draft model)", "ngram"),
            ("Medusa heads (on the target's hidden states)", "medusa"), ("EAGLE head", "eagle"),
            ("Lookahead decoding (no model)", "lookahead"), ("Early exit: the target's first layers", "early-exit"),
            ("None: plain decoding", "none"))  # fmt: skip
DRAFTER_TIPS = {
    "medusa": "Medusa heads guess the next few tokens from the target's last hidden state (PyTorch only)",
    "eagle": "A one-layer EAGLE head runs in the target's feature space and drafts a tree (PyTorch only)",
    "lookahead": "The target guesses ahead itself (a Jacobi window) and verifies n-grams it has seen (PyTorch only)",
    "early-exit": "The target's own first layers draft, its full depth verifies (PyTorch only)",
}


def _combo(items, parent) -> QComboBox:
    combo = QComboBox(parent)
    for item in items:
        text, data = item if isinstance(item, tuple) else (item, item)
        combo.addItem(text, data)
    return combo


def _spin(low: int, high: int, parent, special: str | None = None, step: int = 1) -> QSpinBox:
    spin = QSpinBox(parent)
    spin.setRange(low, high)
    spin.setSingleStep(step)
    if special:
        spin.setSpecialValueText(special)  # shown at the minimum, which means "let the engine choose"
    return spin


class PairForm(QWidget):
    sig_key_edited = Signal()
    """A model field is being typed in: the last check no longer applies."""
    sig_key_changed = Signal()
    """Something the check looks at changed and is settled: check again."""

    def __init__(self, models: list[ModelRef], parent=None, settings=None) -> None:
        super().__init__(parent)
        # -- models
        self.backend = _combo(BACKENDS, self)
        self.backend.setToolTip("auto: GGUF files run on llama.cpp, Hugging Face folders on PyTorch")
        self.target = ModelPicker(models, "target", self)
        self.drafter = _combo(DRAFTERS, self)
        for data, tip in DRAFTER_TIPS.items():
            self.drafter.setItemData(self.drafter.findData(data), tip, Qt.ToolTipRole)
        self.draft = ModelPicker(models, "draft model", self)
        self.draft_backend = _combo(BACKENDS, self)
        self.heads = HeadsPicker(self, settings)
        self.heads.setToolTip("Trained Medusa heads for this target (Models ▸ Train heads… makes some)")
        self.eagle_heads = HeadsPicker(self, settings, kind="eagle")
        self.eagle_heads.setToolTip("A trained EAGLE head for this target (Models ▸ Train heads…, Kind EAGLE, "
                                    "makes one)")  # fmt: skip
        self.tree_depth = AutoNumberField((4, 6, 8, 10), self, "Deepest level of the draft tree; auto = 8. "
                                          "Deeper trees can accept more tokens per step and cost more to draft")
        self.ngram_max = _spin(1, 8, self)
        self.ngram_max.setToolTip("Longest run of recent tokens looked up in the earlier text")
        self.lookahead_window = AutoNumberField((5, 7, 10, 15), self, "W: how many future positions the target "
                                                "guesses each step (the Jacobi window); 1 to 64, auto fits it to "
                                                "this machine")  # fmt: skip
        self.lookahead_ngram = AutoNumberField((3, 4, 5), self, "N: tokens in each n-gram collected from the "
                                               "window and verified as a continuation; 2 to 16")  # fmt: skip
        self.lookahead_candidates = AutoNumberField((3, 7, 10, 15), self, "G: at most this many n-grams are "
                                                    "verified per step; 1 to 64")  # fmt: skip
        self.exit_layer = AutoNumberField((4, 8, 12, 16), self, "The draft runs the target's first L layers, then "
                                          "its LM head; auto measures a few exits and keeps the best")  # fmt: skip
        for widget in (self.ngram_max, self.tree_depth, self.exit_layer, self.lookahead_window,
                       self.lookahead_ngram, self.lookahead_candidates):  # fmt: skip
            widget.setSizePolicy(QSizePolicy.Fixed, QSizePolicy.Fixed)  # a number, not a path: keep it short
        lookahead = QWidget(self)
        row = QHBoxLayout(lookahead)
        row.setContentsMargins(0, 0, 0, 0)
        for text, field in (("&Window W", self.lookahead_window), ("N-gram size N", self.lookahead_ngram),
                            ("Candidates G", self.lookahead_candidates)):  # fmt: skip
            label = QLabel(text, lookahead)
            label.setBuddy(field)
            row.addWidget(label)
            row.addWidget(field)
            row.addSpacing(12)
        row.addStretch(1)
        models_box = QGroupBox("Models", self)
        form = self._models_form = QFormLayout(models_box)
        form.addRow("&Backend:", self.backend)
        form.addRow("&Target:", self.target)
        form.addRow("D&rafter:", self.drafter)
        form.addRow("&Draft model:", self.draft)
        form.addRow("Draft backend:", self.draft_backend)
        form.addRow("Medusa &heads:", self.heads)
        form.addRow("EA&GLE head:", self.eagle_heads)
        form.addRow("Tree depth:", self.tree_depth)
        form.addRow("N-gram length:", self.ngram_max)
        form.addRow("Lookahead:", lookahead)
        form.addRow("E&xit layer:", self.exit_layer)
        # The rows only one drafter uses: shown while it is chosen.
        self._drafter_rows = {
            self.draft: "model", self.draft_backend: "model", self.heads: "medusa", self.eagle_heads: "eagle",
            self.tree_depth: "eagle", self.ngram_max: "ngram", lookahead: "lookahead", self.exit_layer: "early-exit",
        }  # fmt: skip

        # -- draft length
        self.k_auto = QCheckBox("&Automatic", self)
        self.k_auto.setToolTip("Pick k each step from the measured acceptance and costs (0 when drafting does not pay)")
        self.k_max = _spin(1, K_LIMIT, self)
        self.k = _spin(1, K_LIMIT, self)
        length_box = QGroupBox("Draft length k", self)
        length = QFormLayout(length_box)
        length.addRow(self.k_auto)
        length.addRow("Largest k:", self.k_max)
        length.addRow("Fixed k:", self.k)

        # -- sampling
        self.temperature = QDoubleSpinBox(self)
        self.temperature.setRange(0.0, 5.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setSpecialValueText("0 (greedy)")
        self.top_k = _spin(0, 100_000, self, special="off")
        self.top_p = QDoubleSpinBox(self)
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setToolTip("1 = off")
        self.min_p = QDoubleSpinBox(self)
        self.min_p.setRange(0.0, 0.99)
        self.min_p.setSingleStep(0.01)
        self.min_p.setSpecialValueText("off")
        self.min_p.setToolTip("Keep only tokens at least this fraction as likely as the most likely one")
        self.seed = _spin(0, 2**31 - 1, self)
        self.order = QLabel("Applied to p and q alike, in order:\ntemperature, top-k, top-p, min-p", self)
        self.order.setToolTip("The rejection rule compares the target's p and the draft's q after the same "
                              "processing, so the output is distributed exactly as the processed p.")  # fmt: skip
        self.recommended = QLabel(self)
        self.recommended.setWordWrap(True)
        self.use_recommended = QPushButton("Use these", self)
        self.use_recommended.setToolTip("Set the sampling the model's files recommend")
        self.use_recommended.clicked.connect(self.apply_recommended)
        self._recommended: dict = {}
        self.max_tokens = _spin(1, 131_072, self, step=64)
        sampling_box = QGroupBox("Sampling", self)
        sampling = QFormLayout(sampling_box)
        sampling.addRow("Te&mperature:", self.temperature)
        sampling.addRow("Top-k:", self.top_k)
        sampling.addRow("Top-p:", self.top_p)
        sampling.addRow("Min-p:", self.min_p)
        sampling.addRow("Seed:", self.seed)
        sampling.addRow("Max tokens:", self.max_tokens)
        sampling.addRow(self.order)
        sampling.addRow(self.recommended)
        sampling.addRow(self.use_recommended)
        self.order.setMinimumHeight(self.order.sizeHint().height())  # a form squeezes two-line labels

        # -- hardware
        self.device = _combo(DEVICES, self)
        self.device.setToolTip("PyTorch only; llama.cpp offloads with GPU layers instead")
        self.dtype = _combo(DTYPES, self)
        self.dtype.setToolTip("PyTorch only; a GGUF file on llama.cpp keeps its own quantization")
        self.threads = _spin(0, 256, self, special="auto")
        self.gpu_layers = _spin(-1, 999, self, special="all")
        self.gpu_layers.setToolTip("llama.cpp: layers to offload to the GPU (0 = none)")
        self.n_ctx = _spin(0, 1_048_576, self, special="model default", step=1024)
        self.n_ctx.setToolTip("Tokens the context holds; model default is min(trained context, 4096)")
        hardware_box = QGroupBox("Hardware", self)
        hardware = QFormLayout(hardware_box)
        hardware.addRow("De&vice:", self.device)
        hardware.addRow("D&type:", self.dtype)
        hardware.addRow("Threads:", self.threads)
        hardware.addRow("GPU layers:", self.gpu_layers)
        hardware.addRow("Context size:", self.n_ctx)

        # Models across the top (paths are long), the numbers in three columns below.
        for box_form in (length, sampling, hardware):
            box_form.setFieldGrowthPolicy(QFormLayout.FieldsStayAtSizeHint)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.addWidget(models_box, 0, 0, 1, 3)
        grid.addWidget(length_box, 1, 0)
        grid.addWidget(sampling_box, 1, 1)
        grid.addWidget(hardware_box, 1, 2)

        self.target.sig_edited.connect(self.sig_key_edited)
        self.draft.sig_edited.connect(self.sig_key_edited)
        self.target.sig_chosen.connect(self.sig_key_changed)
        self.draft.sig_chosen.connect(self.sig_key_changed)
        self.heads.sig_chosen.connect(self.sig_key_changed)
        self.eagle_heads.sig_chosen.connect(self.sig_key_changed)
        for field in self._auto_fields():
            field.sig_edited.connect(self.sig_key_edited)
            field.sig_chosen.connect(self.sig_key_changed)
        for combo in (self.backend, self.drafter, self.draft_backend, self.dtype):
            combo.currentIndexChanged.connect(self.sig_key_changed)
        self.n_ctx.valueChanged.connect(self.sig_key_changed)
        self.target.sig_browsed.connect(self.set_browse_dir)
        self.draft.sig_browsed.connect(self.set_browse_dir)
        self.drafter.currentIndexChanged.connect(self._enable)
        self.target.sig_chosen.connect(self._update_recommended)
        self.target.sig_edited.connect(self._update_recommended)
        self.k_auto.toggled.connect(self._enable)
        self.set_choice(PairChoice())

    def choice(self) -> PairChoice:
        return PairChoice(
            target=self.target.spec(), drafter=self.drafter.currentData() or "ngram", draft=self.draft.spec(),
            heads=self.heads.folder(), eagle_heads=self.eagle_heads.folder(), tree_depth=self.tree_depth.value(),
            lookahead_window=self.lookahead_window.value(), lookahead_ngram=self.lookahead_ngram.value(),
            lookahead_candidates=self.lookahead_candidates.value(), exit_layer=self.exit_layer.value(),
            backend=self.backend.currentData(), draft_backend=self.draft_backend.currentData(),
            k_auto=self.k_auto.isChecked(), k=self.k.value(), k_max=self.k_max.value(),
            ngram_max=self.ngram_max.value(), temperature=round(self.temperature.value(), 4),
            top_k=self.top_k.value(), top_p=round(self.top_p.value(), 4), min_p=round(self.min_p.value(), 4),
            seed=self.seed.value(),
            max_tokens=self.max_tokens.value(), device=self.device.currentData(), dtype=self.dtype.currentData(),
            threads=self.threads.value(), gpu_layers=self.gpu_layers.value(), n_ctx=self.n_ctx.value(),
        )  # fmt: skip

    def set_choice(self, c: PairChoice) -> None:
        self.target.set_spec(c.target)
        self.draft.set_spec(c.draft)
        self.heads.set_folder(c.heads)
        self.eagle_heads.set_folder(c.eagle_heads)
        for field, value in zip(self._auto_fields(), (c.tree_depth, c.lookahead_window, c.lookahead_ngram,
                                                      c.lookahead_candidates, c.exit_layer), strict=True):  # fmt: skip
            field.set_value(value)
        combos = ((self.backend, c.backend), (self.drafter, c.drafter), (self.draft_backend, c.draft_backend),
                  (self.device, c.device), (self.dtype, c.dtype))  # fmt: skip
        for combo, value in combos:
            combo.setCurrentIndex(max(combo.findData(value), 0))
        self.k_auto.setChecked(c.k_auto)
        for spin, value in ((self.k, c.k), (self.k_max, c.k_max), (self.ngram_max, c.ngram_max),
                            (self.temperature, c.temperature), (self.top_k, c.top_k), (self.top_p, c.top_p),
                            (self.min_p, c.min_p),
                            (self.seed, c.seed), (self.max_tokens, c.max_tokens), (self.threads, c.threads),
                            (self.gpu_layers, c.gpu_layers), (self.n_ctx, c.n_ctx)):  # fmt: skip
            spin.setValue(value)
        self._enable()
        self._update_recommended()
        # Typed-in specs emit nothing when set in code; say that the selection moved.
        self.sig_key_changed.emit()

    def _update_recommended(self) -> None:
        """Say what sampling the target's files recommend, if they do (and offer to use it)."""
        try:
            self._recommended = recommended_sampling(self.target.spec())
        except (SpecDeckError, OSError):
            self._recommended = {}
        if self._recommended:
            self.recommended.setText(f"The model recommends {describe(self._recommended)}.")
        self.recommended.setVisible(bool(self._recommended))
        self.use_recommended.setVisible(bool(self._recommended))

    def apply_recommended(self) -> None:
        """Set the recommended values (what the model does not name keeps its default: off)."""
        values = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, **self._recommended}
        for name, value in values.items():
            getattr(self, name).setValue(value)

    @staticmethod
    def key_of(c: PairChoice) -> tuple:
        """What a check depends on: when this changes, the last check says nothing about the selection."""
        model = c.drafter == "model"
        own = {"eagle": (c.tree_depth,), "lookahead": (c.lookahead_window, c.lookahead_ngram, c.lookahead_candidates),
               "early-exit": (c.exit_layer,)}.get(c.drafter, ())  # fmt: skip
        return (c.target.strip(), c.drafter, c.draft.strip() if model else None, c.backend,
                c.draft_backend if model else None, c.dtype, c.n_ctx, c.heads_folder(), own)  # fmt: skip

    def check_key(self) -> tuple:
        return self.key_of(self.choice())

    def browse_dir(self) -> str:
        return self.target.start_dir

    def set_browse_dir(self, folder: str) -> None:
        if folder:
            self.target.start_dir = self.draft.start_dir = folder

    def _auto_fields(self) -> tuple[AutoNumberField, ...]:
        return (self.tree_depth, self.lookahead_window, self.lookahead_ngram, self.lookahead_candidates,
                self.exit_layer)  # fmt: skip

    def _enable(self) -> None:
        drafter = self.drafter.currentData()
        for widget, kind in self._drafter_rows.items():
            widget.setEnabled(kind == drafter)
            self._models_form.setRowVisible(widget, kind == drafter)
        self.k_max.setEnabled(self.k_auto.isChecked())
        self.k.setEnabled(not self.k_auto.isChecked())
