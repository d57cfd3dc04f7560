"""Take the README's screenshot of Models ▸ Train heads… while it trains the embedded model's heads.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_train_screenshot.py [steps shown, default 24]

Writes train-heads.png beside this file: the dialog part-way through a run on the
built-in corpus (short sequences, so that a few minutes of CPU draw a curve).
The heads go to a temporary folder and are thrown away; settings are temporary too.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
DATA = tempfile.mkdtemp(prefix="specdeck-train-shot-")
os.environ["SPECDECK_DATA_DIR"] = DATA

import app  # noqa: E402,F401 - applies the PySide6 refcount workaround first
from PySide6.QtCore import QCoreApplication, QEventLoop, QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

HERE = Path(__file__).resolve().parent


def wait(application: QApplication, condition, timeout: float = 1800.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the dialog did not get there in time")
        application.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.02)


def main() -> int:
    shown_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    QCoreApplication.setOrganizationName("SpecDeckScreenshots")
    QCoreApplication.setApplicationName("SpecDeckScreenshots")
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, tempfile.mkdtemp())
    application = QApplication(sys.argv[:1])
    from app.application import app_icon
    from app.train_dialog import TrainDialog

    application.setWindowIcon(app_icon())
    dialog = TrainDialog(target="default")
    dialog.form.steps.setValue(400)
    dialog.form.batch_size.setValue(2)
    dialog.form.seq_len.setValue(64)
    dialog.resize(960, 760)
    dialog.show()
    try:
        dialog.start()
        wait(application, lambda: len(dialog.charts.steps) >= shown_steps or not dialog.running)
        dialog.charts.redraw()
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            application.processEvents()
            time.sleep(0.02)
        dialog.grab().save(str(HERE / "train-heads.png"))
        print("wrote train-heads.png at step", dialog.charts.steps[-1] if dialog.charts.steps else 0)
    finally:
        dialog.shutdown()  # stops after the current step
        dialog.close()
        shutil.rmtree(DATA, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
