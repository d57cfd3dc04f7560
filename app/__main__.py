"""`specdeck` and `python -m app`: open the main window and load the saved model pair."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from app.shell.qt_platform import check_xcb_libraries

    # Before any Qt: without its system libraries Qt aborts with a message that names none.
    problem = check_xcb_libraries()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    # Qt and the window are imported here, not at module level, so that the entry
    # point script starts (and fails, if PySide6 is missing) with a plain traceback.
    from app.shell.application import create_application
    from app.shell.main_window import MainWindow

    application = create_application(argv)
    window = MainWindow()
    window.show()
    window.start()
    return application.exec()


if __name__ == "__main__":
    sys.exit(main())
