"""The settings half of the pair dialog: models, the drafter and its options, draft length, sampling and
hardware, as the engine's own `EngineConfig` and `SamplingConfig`.

The drafter list and each drafter's fields come from the engine's registry
(`all_drafters`, the chains it suggests, `option_settings`; the widgets in
app/pair/options.py), so a new drafter appears here with its options and no
drafter is named in this file.
"""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QLabel,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.pair.options import OptionField, make_field
from app.pair.widgets import GpuLayersField, ModelPicker
from engine import (
    BACKENDS,
    COMPILES,
    DEVICES,
    DTYPES,
    K_LIMIT,
    EngineConfig,
    ModelRef,
    SamplingConfig,
    SpecDeckError,
    all_drafters,
    describe_recommended,
    drafter_spec,
    is_drafter,
    option_settings,
    recommended_sampling,
    suggested_chains,
)


def dialog_order(specs) -> list:
    """The registry's drafters in the order the dialog lists them: a drafter that loads a draft model
    first (the classic pair), plain decoding (nothing to set, nothing to report) last, the rest between."""

    def rank(spec) -> int:
        if spec.loads_model:
            return 0
        plain = not option_settings(spec) and not dataclasses.fields(spec.stats) and not spec.needs
        return 2 if plain else 1

    return sorted(specs, key=rank)


def listed_drafters() -> dict:
    """The drafters a user picks from (the registry's and the chains it suggests), by name, in `dialog_order`."""
    return {spec.name: spec for spec in dialog_order([*all_drafters(), *suggested_chains()])}


def add_drafter(combo: QComboBox, spec) -> None:
    """List `spec` in a drafter combo box: its label, its name as data, its summary as the tooltip."""
    combo.addItem(spec.choice_label or spec.label, spec.name)
    combo.setItemData(combo.count() - 1, spec.summary, Qt.ToolTipRole)


def draft_model_option(spec) -> str | None:
    """The name of the option of `spec` that names a draft model ("draft"), or None when it loads none."""
    return next((setting.name for setting in option_settings(spec) if setting.kind == "model"), None)


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
        self.specs = listed_drafters()
        self.drafter = QComboBox(self)
        for spec in self.specs.values():
            add_drafter(self.drafter, spec)
        defaults = ", ".join(f"{s.label.split(' (')[0]} on {b}" for s in all_drafters() for b in s.default_on)
        self.drafter.setToolTip(
            f"Until you choose one, the drafter measured fastest on the backend the target runs on: {defaults}"
        )
        models_box = self.models_box = QGroupBox("Models", self)
        form = self._models_form = QFormLayout(models_box)
        form.addRow("&Backend:", self.backend)
        form.addRow("&Target:", self.target)
        form.addRow("D&rafter:", self.drafter)
        # Each drafter's options, from its settings; their rows show while it is chosen.
        self.options: dict[str, dict[str, OptionField]] = {}
        self._drafter_rows: dict[QWidget, str] = {}
        self._models, self._settings = models, settings
        for spec in self.specs.values():
            self._add_fields(spec)

        # -- draft length
        self.k_auto = QCheckBox("&Automatic", self)
        self.k_auto.setToolTip("Pick k each step from the measured acceptance and costs (0 when drafting does not pay)")
        self.k_max = _spin(1, K_LIMIT, self)
        self.k = _spin(1, K_LIMIT, self)
        self.k.setValue(4)  # fixed k's usual start, until a config sets one
        length_box = self.length_box = QGroupBox("Draft length k", self)
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
        self.order.setToolTip(
            "The rejection rule compares the target's p and the draft's q after the same "
            "processing, so the output is distributed exactly as the processed p."
        )
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
        self.compile = _combo(COMPILES, self)
        self.compile.setToolTip(
            "PyTorch only: auto = eager on every device; on = static shapes on any device, with "
            "CUDA graphs on a CUDA GPU (opt-in: not yet verified on a GPU); off = eager"
        )
        self.threads = _spin(0, 256, self, special="auto")
        self.gpu_layers = GpuLayersField(self)
        self.gpu_layers.setToolTip(
            "llama.cpp: layers to offload to the GPU. auto: none (offload is opt-in, not yet "
            "verified on a GPU); all; 0 = none; or a number of layers"
        )
        self.n_ctx = _spin(0, 1_048_576, self, special="model default", step=1024)
        self.n_ctx.setToolTip("Tokens the context holds; model default is min(trained context, 4096)")
        hardware_box = self.hardware_box = QGroupBox("Hardware", self)
        hardware = QFormLayout(hardware_box)
        hardware.addRow("De&vice:", self.device)
        hardware.addRow("D&type:", self.dtype)
        hardware.addRow("Compile:", self.compile)
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
        self.target.sig_chosen.connect(self.sig_key_changed)
        for combo in (self.backend, self.drafter, self.dtype, self.device, self.compile):
            combo.currentIndexChanged.connect(self.sig_key_changed)
        self.gpu_layers.sig_edited.connect(self.sig_key_edited)
        self.gpu_layers.sig_chosen.connect(self.sig_key_changed)
        self.n_ctx.valueChanged.connect(self.sig_key_changed)
        self.target.sig_browsed.connect(self.set_browse_dir)
        self.drafter.currentIndexChanged.connect(self._enable)
        # Until a drafter is chosen (a first run: no saved pair), it follows the backend that runs.
        self.drafter.currentIndexChanged.connect(self._drafter_changed)
        self.backend.currentIndexChanged.connect(self._follow_default_drafter)
        self.target.sig_chosen.connect(self._follow_default_drafter)
        self.target.sig_chosen.connect(self._update_recommended)
        self.target.sig_edited.connect(self._update_recommended)
        self.k_auto.toggled.connect(self._enable)
        self._config, self._sampling = EngineConfig(), SamplingConfig()
        self._drafter_chosen, self._showing = True, False
        self.set_config(self._config, self._sampling)

    def _add_fields(self, spec) -> None:
        fields = [make_field(spec, setting, self, self._models, self._settings) for setting in option_settings(spec)]
        self.options[spec.name] = {field.name: field for field in fields}
        for row_label, widget in _rows(fields, self):
            self._models_form.addRow(row_label, widget)
            self._drafter_rows[widget] = spec.name
        for field in fields:
            field.edited.connect(self.sig_key_edited)
            field.chosen.connect(self.sig_key_changed)
            if isinstance(field.widget, ModelPicker):
                field.widget.sig_browsed.connect(self.set_browse_dir)
            if isinstance(field.widget, ModelPicker) and getattr(self.target, "start_dir", None):
                field.widget.start_dir = self.target.start_dir

    def _list_drafter(self, name: str) -> None:
        """A drafter the list lacks (a chain chosen on the command line, "ngram+model"): listed, with its fields."""
        if name in self.specs or not is_drafter(name):
            return
        spec = self.specs[name] = drafter_spec(name)
        add_drafter(self.drafter, spec)
        self._add_fields(spec)

    def config(self) -> EngineConfig:
        """The pair as the engine takes it: what the widgets show, over the config last set
        (so that a field the form does not show, such as measure_costs, is kept)."""
        spec = self.specs.get(self.drafter.currentData()) or next(iter(self.specs.values()))
        values = {name: field.value() for name, field in self.options[spec.name].items()}
        return dataclasses.replace(
            self._config,
            target=self.target.spec(),
            drafter=spec.name,
            options=spec.options(**values),
            backend=self.backend.currentData(),
            device=self.device.currentData(),
            dtype=self.dtype.currentData(),
            compile=self.compile.currentData(),
            n_ctx=self.n_ctx.value() or None,
            threads=self.threads.value() or None,
            gpu_layers=self.gpu_layers.value(),
            k="auto" if self.k_auto.isChecked() else self.k.value(),
            k_max=self.k_max.value(),
        )

    def sampling(self) -> SamplingConfig:
        return dataclasses.replace(
            self._sampling,
            temperature=round(self.temperature.value(), 4),
            top_k=self.top_k.value(),
            top_p=round(self.top_p.value(), 4),
            min_p=round(self.min_p.value(), 4),
            seed=self.seed.value(),
            max_tokens=self.max_tokens.value(),
        )

    def set_config(
        self, config: EngineConfig, sampling: SamplingConfig | None = None, drafter_chosen: bool = True
    ) -> None:
        """Show `config` (and `sampling`, when given). The other drafters' fields show their defaults.
        `drafter_chosen` False (a first run: the default pair): until the user picks a drafter, the
        drafter follows the backend the target runs on (the one measured fastest there)."""
        self._showing = True
        try:
            self._show_config(config, sampling)
        finally:
            self._showing = False
        self._drafter_chosen = drafter_chosen
        self._follow_default_drafter()
        # Typed-in specs emit nothing when set in code; say that the selection moved.
        self.sig_key_changed.emit()

    def _drafter_changed(self) -> None:
        if not self._showing:
            self._drafter_chosen = True  # the user's choice: kept whatever the backend

    def _follow_default_drafter(self) -> None:
        """While no drafter is chosen: the default for the target and backend shown (EngineConfig's own,
        engine/config.py default_drafter_for: suffix decoding on PyTorch, n-gram lookup on llama.cpp)."""
        if self._drafter_chosen or self._showing:
            return
        default = EngineConfig(target=self.target.spec() or "default", backend=self.backend.currentData()).drafter
        index = self.drafter.findData(default)
        if index >= 0 and index != self.drafter.currentIndex():
            self._showing = True
            try:
                self.drafter.setCurrentIndex(index)
            finally:
                self._showing = False

    def _show_config(self, config: EngineConfig, sampling: SamplingConfig | None) -> None:
        self._config = config
        self.target.set_spec(config.target)
        self._list_drafter(config.drafter)
        chosen = config.drafter_options()
        for name, fields in self.options.items():
            for field in fields.values():
                field.set_value(getattr(chosen, field.name) if name == config.drafter else field.unset)
        combos = (
            (self.backend, config.backend),
            (self.drafter, config.drafter),
            (self.device, config.device),
            (self.dtype, config.dtype),
            (self.compile, config.compile),
        )
        for combo, value in combos:
            combo.setCurrentIndex(max(combo.findData(value), 0))
        self.k_auto.setChecked(config.k == "auto")
        self.gpu_layers.set_value(config.gpu_layers)
        numbers = [(self.k_max, config.k_max), (self.threads, config.threads or 0), (self.n_ctx, config.n_ctx or 0)]
        if config.k != "auto":
            numbers.append((self.k, config.k))
        if sampling is not None:
            self._sampling = sampling
            numbers += [
                (self.temperature, sampling.temperature),
                (self.top_k, sampling.top_k),
                (self.top_p, sampling.top_p),
                (self.min_p, sampling.min_p),
                (self.seed, sampling.seed),
                (self.max_tokens, sampling.max_tokens),
            ]
        for spin, value in numbers:
            spin.setValue(value)
        self._enable()
        self._update_recommended()

    def set_pair_enabled(self, enabled: bool) -> None:
        """Whether the models, the draft length and the hardware can be edited: not while a server
        that serves its own model is chosen (sampling still applies there)."""
        for box in (self.models_box, self.length_box, self.hardware_box):
            box.setEnabled(enabled)

    def field(self, drafter: str, option: str) -> QWidget:
        """The widget of one drafter option (for the dialog and tests)."""
        return self.options[drafter][option].widget

    def model_option(self) -> tuple[str, str] | None:
        """(drafter, option) of the first drafter option that names a draft model, if any drafter has one."""
        for name, spec in self.specs.items():
            option = draft_model_option(spec)
            if option is not None:
                return name, option
        return None

    def _update_recommended(self) -> None:
        """Say what sampling the target's files recommend, if they do (and offer to use it)."""
        try:
            self._recommended = recommended_sampling(self.target.spec())
        except (SpecDeckError, OSError):
            self._recommended = {}
        if self._recommended:
            self.recommended.setText(f"The model recommends {describe_recommended(self._recommended)}.")
        self.recommended.setVisible(bool(self._recommended))
        self.use_recommended.setVisible(bool(self._recommended))

    def apply_recommended(self) -> None:
        """Set the recommended values (what the model does not name keeps its default: off)."""
        values = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, **self._recommended}
        for name, value in values.items():
            getattr(self, name).setValue(value)

    @staticmethod
    def key_of(config: EngineConfig) -> EngineConfig:
        """What a check depends on: when this changes, the last check says nothing about the selection.
        The draft length and the threads a backend runs with change nothing it checks; the device and
        the GPU layers say where the models sit, whose memory the check looks at."""
        default = _DEFAULT
        return dataclasses.replace(
            config, k=default.k, k_max=default.k_max, threads=default.threads, measure_costs=default.measure_costs
        )

    def check_key(self) -> EngineConfig:
        return self.key_of(self.config())

    def browse_dir(self) -> str:
        return self.target.start_dir

    def set_browse_dir(self, folder: str) -> None:
        if folder:
            for picker in [self.target] + [f.widget for f in self._fields() if isinstance(f.widget, ModelPicker)]:
                picker.start_dir = folder

    def _fields(self) -> list[OptionField]:
        return [field for fields in self.options.values() for field in fields.values()]

    def _enable(self) -> None:
        drafter = self.drafter.currentData()
        for widget, kind in self._drafter_rows.items():
            widget.setEnabled(kind == drafter)
            self._models_form.setRowVisible(widget, kind == drafter)
        self.k_max.setEnabled(self.k_auto.isChecked())
        self.k.setEnabled(not self.k_auto.isChecked())


_DEFAULT = EngineConfig()
SHORT_PER_LINE = 3  # a drafter's numbers and choices side by side, this many to a line


def _rows(fields: list[OptionField], parent: QWidget) -> list[tuple[str, QWidget]]:
    """A drafter's form rows: each model or folder on its own row (paths are long); its numbers and
    choices on the row of its one such option, or together, a few to a line."""
    rows = [(f"{field.setting.label}:", field.widget) for field in fields if field.wide]
    short = [field for field in fields if not field.wide]
    if len(short) == 1:
        rows.append((f"{short[0].setting.label}:", short[0].widget))
    elif short:
        box = QWidget(parent)
        grid = QGridLayout(box)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(6)
        for i, field in enumerate(short):
            line, column = divmod(i, SHORT_PER_LINE)
            label = QLabel(field.setting.label, box)
            label.setBuddy(field.widget)
            label.setToolTip(field.setting.help)
            grid.addWidget(label, line, 2 * column, Qt.AlignRight)
            grid.addWidget(field.widget, line, 2 * column + 1)
        grid.setColumnStretch(2 * SHORT_PER_LINE, 1)
        rows.append(("Options:", box))
    return rows
