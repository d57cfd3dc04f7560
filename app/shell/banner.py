"""A message strip above the content: the one place errors are shown.

Non-modal on purpose (as in browsers and IDEs): the window stays usable while the
message is there, a test can read it without fighting a modal dialog, and the
user can act on it with the buttons it offers ("Choose models…").
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QStyle, QToolButton, QWidget

_STYLES = {
    "error": ("SP_MessageBoxCritical", "rgba(214, 39, 40, 28)", "rgba(214, 39, 40, 140)"),
    "info": ("SP_MessageBoxInformation", "rgba(31, 119, 180, 24)", "rgba(31, 119, 180, 120)"),
}


class Banner(QFrame):
    """An icon, a message, optional action buttons and a close button."""

    sig_closed = Signal()
    """The user dismissed the banner."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.icon = QLabel()
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextFormat(Qt.TextFormat.PlainText)  # engine messages are text, never markup
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.close_button = QToolButton()
        self.close_button.setAutoRaise(True)
        self.close_button.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_TitleBarCloseButton))
        self.close_button.setToolTip("Dismiss")
        self.close_button.clicked.connect(self._dismiss)
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(8, 4, 4, 4)
        self._layout.addWidget(self.icon, 0, Qt.AlignmentFlag.AlignTop)
        self._layout.addWidget(self.message, 1)
        self._actions: list[QPushButton] = []
        self._layout.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.kind = ""
        self.hide()

    def show_message(self, text: str, kind: str = "error", actions: list[tuple[str, Callable[[], None]]] = ()) -> None:
        icon_name, fill, border = _STYLES[kind]
        self.kind = kind
        self.setStyleSheet(f"QFrame#banner {{ background: {fill}; border: 1px solid {border}; border-radius: 4px; }}")
        size = self.style().pixelMetric(QStyle.PixelMetric.PM_SmallIconSize)
        icon = self.style().standardIcon(getattr(QStyle.StandardPixmap, icon_name))
        self.icon.setPixmap(icon.pixmap(size, size))
        self.message.setText(text)
        for button in self._actions:
            button.deleteLater()
        self._actions = []
        for label, callback in actions:
            button = QPushButton(label)
            button.clicked.connect(callback)
            button.clicked.connect(self._dismiss)
            self._layout.insertWidget(self._layout.count() - 1, button, 0, Qt.AlignmentFlag.AlignTop)
            self._actions.append(button)
        self.show()

    def text(self) -> str:
        return self.message.text() if self.isVisibleTo(self.parentWidget()) else ""

    def action_labels(self) -> list[str]:
        return [button.text() for button in self._actions]

    def _dismiss(self) -> None:
        self.hide()
        self.sig_closed.emit()
