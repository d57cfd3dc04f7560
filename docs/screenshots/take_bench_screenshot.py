"""Take the benchmark dialog's screenshot (bench.png) with the real embedded model.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_bench_screenshot.py

Runs the shipped prompt set once (64 tokens a reply, peers on) with the
n-gram drafter and automatic k (run it on a quiet machine), then grabs the dialog. Uses a temporary settings
folder, so it never touches yours. The numbers in the picture are whatever
this machine measured; docs/benchmarks.md holds the ones taken on a quiet one.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import app  # noqa: E402,F401 - applies the PySide6 refcount workaround first
from PySide6.QtCore import QCoreApplication, QSettings  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from engine import EngineConfig  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIG = EngineConfig()  # the app's default pair: embedded model, n-gram drafter, automatic k


def main() -> int:
    QCoreApplication.setOrganizationName("SpecDeckScreenshots")
    QCoreApplication.setApplicationName("SpecDeckScreenshots")
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, tempfile.mkdtemp())
    application = QApplication(sys.argv[:1])
    from app.application import app_icon
    from app.bench_dialog import BenchDialog

    application.setWindowIcon(app_icon())
    dialog = BenchDialog(config=CONFIG)
    dialog.resize(1280, 900)
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(64)
    dialog.peers.setChecked(True)
    dialog.show()
    finished = []
    dialog.sig_finished.connect(finished.append)
    dialog.run()
    deadline = time.monotonic() + 1800
    while not finished or dialog.running:
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark did not finish in time")
        application.processEvents()
        time.sleep(0.02)
    if finished[0] is None:
        raise RuntimeError(f"the benchmark failed: {dialog.status.text()}")
    for _ in range(20):  # let the layouts settle
        application.processEvents()
        time.sleep(0.02)
    dialog.grab().save(str(HERE / "bench.png"))
    dialog.close()
    dialog.deleteLater()  # delete the dialog while the application still exists, not at interpreter exit
    application.processEvents()
    print("wrote", HERE / "bench.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
