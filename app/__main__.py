"""`specdeck` and `python -m app`: open the main window and load the saved model pair."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    # Qt and the window are imported here, not at module level, so that the entry
    # point script starts (and fails, if PySide6 is missing) with a plain traceback.
    from app.application import create_application
    from app.main_window import MainWindow

    application = create_application(argv)
    window = MainWindow()
    window.show()
    window.start()
    return application.exec()


if __name__ == "__main__":
    sys.exit(main())
