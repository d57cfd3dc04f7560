"""Where a token came from, in colour and words: the tints, the legend, the tooltip.

Tints are translucent so the same colours read on light and dark palettes; plain
target tokens get none, so a reply decoded without drafting looks like ordinary
text and the drafted parts stand out.
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QPainter, QPixmap
from PySide6.QtWidgets import QApplication, QCheckBox, QHBoxLayout, QLabel, QWidget

from engine import Source, TokenInfo

SOURCE_COLOURS: dict[Source, QColor | None] = {
    Source.ACCEPTED: QColor(44, 160, 44, 80),  # green: the draft guessed right
    Source.RESAMPLED: QColor(255, 127, 14, 110),  # orange: the target overruled the draft
    Source.BONUS: QColor(31, 119, 180, 80),  # blue: free token after a fully accepted draft
    Source.PLAIN: None,
    Source.UNREPORTED: None,  # a remote server that does not say: no tint rather than a guess
}

SOURCE_NAMES = {
    Source.ACCEPTED: "accepted draft",
    Source.RESAMPLED: "resampled",
    Source.BONUS: "bonus",
    Source.PLAIN: "plain target",
    Source.UNREPORTED: "unreported",
}

SOURCE_DESCRIPTIONS = {
    Source.ACCEPTED: "A token the drafter proposed and the target accepted.",
    Source.RESAMPLED: "Drawn by the target after it rejected a draft token (greedy: the target's argmax).",
    Source.BONUS: "Drawn from the target after every drafted token was accepted: one more for free.",
    Source.PLAIN: "An ordinary target token: nothing was drafted for this step.",
    Source.UNREPORTED: "From a remote server that does not say where each token came from.",
}


def token_tooltip(info: TokenInfo) -> str:
    """p(x), q(x) and min(1, p/q) where they are defined, in plain text."""
    p = f"{info.p:.4f}" if info.p == info.p else "not reported (a remote server)"  # NaN: not sent
    lines = [f"{SOURCE_NAMES[info.source]} token {info.text!r}", f"p(x) = {p}  (target)"]
    if info.q is not None:
        lines.append(f"q(x) = {info.q:.4f}  (draft)")
    elif info.source is Source.ACCEPTED:
        lines.append("q(x): none (this drafter proposes tokens without probabilities)")
    if info.acceptance is not None:
        lines.append(f"min(1, p/q) = {info.acceptance:.4f}")
    return "\n".join(lines)


class Legend(QWidget):
    """Swatches naming each colour, and the check box that turns colours on and off."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(10)
        self.toggle = QCheckBox("Colour tokens")
        self.toggle.setChecked(True)
        self.toggle.setToolTip("Tint each generated token by where it came from (Ctrl+Shift+C)")
        layout.addWidget(self.toggle)
        for source in Source:
            if source is not Source.UNREPORTED:  # a local engine always says
                layout.addWidget(_swatch(source))
        layout.addStretch(1)


def _swatch(source: Source) -> QWidget:
    """A small square tinted as tokens are (over the text background), then the name."""
    size = 14
    pixmap = QPixmap(size, size)
    pixmap.fill(QApplication.palette().base().color())
    painter = QPainter(pixmap)
    colour = SOURCE_COLOURS[source]
    if colour is not None:
        painter.fillRect(0, 0, size, size, colour)
    painter.setPen(QApplication.palette().mid().color())
    painter.drawRect(0, 0, size - 1, size - 1)
    painter.end()
    swatch = QWidget()
    swatch.setToolTip(SOURCE_DESCRIPTIONS[source])
    layout = QHBoxLayout(swatch)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(4)
    square = QLabel()
    square.setPixmap(pixmap)
    layout.addWidget(square)
    layout.addWidget(QLabel(SOURCE_NAMES[source]))
    return swatch
