"""Follow the newest text of a scroll area, as chat apps do, unless the user scrolled up.

While the view is at its bottom it stays there as text arrives (a new message, a
streaming reply, a reply redrawn as Markdown). Once the user scrolls up it stays
where they are, and when more text arrives a "Jump to latest" button floats over
the bottom of the view; clicking it, or scrolling back down, follows again.

It watches the vertical scroll bar rather than the text: the range grows when the
laid-out text grows (whenever Qt lays it out), and only the user, or `jump`, moves
the value otherwise.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QToolButton

AT_BOTTOM_SLACK = 4  # pixels from the end that still count as "at the bottom"


class FollowLatest(QObject):
    """Keeps `area` scrolled to its end while the user is there; offers a way back when not."""

    def __init__(self, area: QAbstractScrollArea) -> None:
        super().__init__(area)
        self._area = area
        self._bar = area.verticalScrollBar()
        self.following = True
        self.button = QToolButton(area)  # over the viewport, not in it: it does not scroll away
        self.button.setText("↓ Jump to latest")
        self.button.setToolTip("Scroll to the newest message and follow it again")
        self.button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.button.setAutoRaise(False)
        self.button.hide()
        self.button.clicked.connect(self.jump)
        self._bar.rangeChanged.connect(self._on_range_changed)
        self._bar.valueChanged.connect(self._on_value_changed)
        area.installEventFilter(self)

    def jump(self) -> None:
        """Scroll to the end and follow from now on."""
        self.following = True
        self._bar.setValue(self._bar.maximum())
        self.button.hide()

    def hold(self, value: int) -> None:
        """Stay at `value` (the user's place, kept across a redraw of the whole text)."""
        self._bar.setValue(value)
        self.following = self._at_bottom()

    def _at_bottom(self) -> bool:
        return self._bar.value() >= self._bar.maximum() - AT_BOTTOM_SLACK

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self.following:
            self._bar.setValue(maximum)
        elif not self._at_bottom():
            self._show_button()  # more text below the user's place

    def _on_value_changed(self, _value: int) -> None:
        self.following = self._at_bottom()
        if self.following:
            self.button.hide()

    def _show_button(self) -> None:
        if not self.button.isVisible():
            self.button.adjustSize()
            self._place_button()
            self.button.show()
            self.button.raise_()

    def _place_button(self) -> None:
        viewport = self._area.viewport().geometry()  # in the area's coordinates
        size = self.button.sizeHint()
        self.button.setGeometry(
            viewport.center().x() - size.width() // 2,
            viewport.bottom() - size.height() - 8,
            size.width(),
            size.height(),
        )

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt API
        if watched is self._area and event.type() == QEvent.Type.Resize and self.button.isVisible():
            self._place_button()
        return False
