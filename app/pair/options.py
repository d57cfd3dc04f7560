"""A drafter's option fields, built from the registry's settings (`engine.option_settings`).

Each `Setting` says what its value is (a model, a folder, a backend, "auto" or a
number, one of a few choices, a number in a range), and that decides the widget:
a new drafter's options appear in the pair dialog without a line here. The one
drafter-shaped widget is the heads picker: a folder setting of a drafter whose
heads the app trains (app/pair/heads.py's KINDS) lists the trained folders of that
kind, since a heads folder is useful only with heads made for that drafter.

`OptionField` gives every widget one face: `value()` in the options dataclass's
terms ("auto" or an int for an "auto" setting, None for "as the target"),
`set_value()`, and the form's two signals (`edited` while typing, `chosen` once
settled).
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QSizePolicy, QSpinBox, QWidget

from app.pair.heads import KINDS as HEAD_KINDS
from app.pair.heads import HeadsPicker, newest_trained
from app.pair.widgets import AUTO, AutoNumberField, GpuLayersField, ModelPicker, PathPicker, auto_or_number
from engine import BACKENDS, DEVICES, DTYPES

WIDE_KINDS = ("model", "path")  # a path is long: these get a row of their own
CHOICES_OF_KIND = {"backend": BACKENDS, "device": DEVICES, "dtype": DTYPES}
SAME_AS_TARGET = "as the target"  # a None default of a load option: it follows the target's
_LADDER = (3, 4, 5, 6, 8, 10, 12, 16, 24, 32)  # what an "auto" field suggests, within its range
_NO_MAXIMUM = 1_000_000


class OptionField(QObject):
    """One option's widget and its value, whatever the widget."""

    edited = Signal()
    """Typing: the value is not settled yet."""
    chosen = Signal()
    """A value was picked, or typing finished."""

    def __init__(self, setting, widget: QWidget, get, put) -> None:
        super().__init__(widget)
        self.setting, self.widget = setting, widget
        self._get, self._put = get, put
        self.unset = setting.default  # shown while the config names another drafter

    @property
    def name(self) -> str:
        return self.setting.name

    @property
    def wide(self) -> bool:
        return self.setting.kind in WIDE_KINDS

    def value(self):
        return self._get()

    def set_value(self, value) -> None:
        self._put(self.setting.default if value is None and self.setting.default is not None else value)


def make_field(spec, setting, parent: QWidget, models=(), settings=None) -> OptionField:
    """The widget for `setting`, an option of the drafter `spec`."""
    kind, default = setting.kind, setting.default
    if kind == "model":
        picker = ModelPicker(list(models), setting.label.lower(), parent)
        field = OptionField(setting, picker, picker.spec, lambda v: picker.set_spec(v or ""))
        picker.sig_edited.connect(field.edited)
        picker.sig_chosen.connect(field.chosen)
    elif kind == "path":
        if spec.name in HEAD_KINDS:
            picker = HeadsPicker(parent, settings, kind=spec.name)
            put = lambda v: picker.set_folder(v or "")  # noqa: E731
        else:
            picker = PathPicker(setting.label, parent)
            put = lambda v: picker.set_path(v or "")  # noqa: E731
        field = OptionField(setting, picker, lambda: picker.folder() or None, put)
        picker.sig_chosen.connect(field.chosen)
        if spec.name in HEAD_KINDS:
            field.unset = newest_trained(spec.name, settings) or None  # heads just trained: ready to pick
    elif kind == "gpu-layers":
        layers = GpuLayersField(parent, follows=SAME_AS_TARGET if default is None else "")
        field = OptionField(setting, layers, layers.value, layers.set_value)
        layers.sig_edited.connect(field.edited)
        layers.sig_chosen.connect(field.chosen)
    elif setting.choices or kind in CHOICES_OF_KIND:
        field = _choice_field(setting, parent)
    elif setting.auto:
        auto = AutoNumberField(_suggestions(setting), parent)
        field = OptionField(setting, auto, lambda: _auto_value(auto.value()), auto.set_value)
        auto.sig_edited.connect(field.edited)
        auto.sig_chosen.connect(field.chosen)
    elif isinstance(default, bool):
        box = QCheckBox(parent)
        field = OptionField(setting, box, box.isChecked, lambda v: box.setChecked(bool(v)))
        box.toggled.connect(field.chosen)
    elif isinstance(default, float):
        spin = QDoubleSpinBox(parent)
        spin.setRange(_low(setting, -_NO_MAXIMUM), _high(setting))
        field = OptionField(setting, spin, lambda: round(spin.value(), 4), lambda v: spin.setValue(float(v)))
        spin.valueChanged.connect(field.chosen)
    elif isinstance(default, int) or setting.minimum is not None or setting.maximum is not None:
        field = _int_field(setting, parent)
    else:
        edit = QLineEdit(parent)
        field = OptionField(setting, edit, lambda: edit.text().strip() or None, lambda v: edit.setText(str(v or "")))
        edit.textEdited.connect(field.edited)
        edit.editingFinished.connect(field.chosen)
    field.widget.setToolTip(setting.help)
    if not field.wide:
        field.widget.setSizePolicy(QSizePolicy.Fixed, QSizePolicy.Fixed)  # a number, not a path: keep it short
    return field


def _choice_field(setting, parent) -> OptionField:
    combo = QComboBox(parent)
    if setting.default is None:  # a load option left to follow the target's
        combo.addItem(SAME_AS_TARGET, None)
    for choice in setting.choices or CHOICES_OF_KIND[setting.kind]:
        combo.addItem(str(choice), choice)

    def put(value) -> None:
        combo.setCurrentIndex(max(combo.findData(value), 0))

    field = OptionField(setting, combo, combo.currentData, put)
    combo.currentIndexChanged.connect(field.chosen)
    return field


def _int_field(setting, parent) -> OptionField:
    """A whole number in the setting's range; a None default ("as the target") sits below the minimum."""
    spin = QSpinBox(parent)
    low, high = int(_low(setting, 0)), int(_high(setting))
    follows = setting.default is None
    spin.setRange(low - 1 if follows else low, high)
    if follows:
        spin.setSpecialValueText(SAME_AS_TARGET)

    def get():
        return None if follows and spin.value() == spin.minimum() else spin.value()

    def put(value) -> None:
        spin.setValue(spin.minimum() if value is None else int(value))

    field = OptionField(setting, spin, get, put)
    spin.valueChanged.connect(field.chosen)
    return field


def _low(setting, fallback):
    return setting.minimum if setting.minimum is not None else fallback


def _high(setting):
    return setting.maximum if setting.maximum is not None else _NO_MAXIMUM


def _suggestions(setting) -> tuple[int, ...]:
    """A few numbers to pick besides "auto", inside the setting's range."""
    low, high = _low(setting, 1), _high(setting)
    return tuple(n for n in _LADDER if low <= n <= high)[:4]


def _auto_value(text: str):
    """The field's text as the option's value: "auto", or the number (even a bad 0: the check says why)."""
    text = auto_or_number(text)
    return AUTO if text == AUTO else int(text)
