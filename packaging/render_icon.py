"""Render resources/io.github.specdeck.SpecDeck.svg to the PNG and ICO files beside it.

The SVG is the source (drawn by hand); run this after changing it:

    python packaging/render_icon.py

The PNG (256 px) is the window icon where SVG icons are not supported, the
icon a .desktop install copies, and PyInstaller's `icon=` (on Windows and macOS
PyInstaller converts it to .ico / .icns itself when Pillow is installed).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QImage, QPainter  # noqa: E402
from PySide6.QtSvg import QSvgRenderer  # noqa: E402

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
NAME = "io.github.specdeck.SpecDeck"


def render(renderer: QSvgRenderer, size: int) -> QImage:
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def main() -> int:
    application = QGuiApplication(sys.argv[:1])  # noqa: F841 - QPainter needs one
    renderer = QSvgRenderer(str(RESOURCES / f"{NAME}.svg"))
    if not renderer.isValid():
        print(f"cannot read {RESOURCES / f'{NAME}.svg'}", file=sys.stderr)
        return 1
    return 0 if render(renderer, 256).save(str(RESOURCES / f"{NAME}.png")) else 1


if __name__ == "__main__":
    sys.exit(main())
