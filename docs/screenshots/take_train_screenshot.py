"""Take the README's screenshot of Models ▸ Train heads… while it trains the embedded model's heads.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_train_screenshot.py [steps shown, default 24]

Writes train-heads.png beside this file: the dialog part-way through a run on the
built-in corpus (short sequences, so that a few minutes of CPU draw a curve).
The heads go to a temporary folder and are thrown away; settings are temporary too.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from shots import DATA, application as make_application, settle, wait

HERE = Path(__file__).resolve().parent


def main() -> int:
    shown_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    application = make_application()
    from app.train_dialog import TrainDialog

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
        settle(application)
        dialog.grab().save(str(HERE / "train-heads.png"))
        print("wrote train-heads.png at step", dialog.charts.steps[-1] if dialog.charts.steps else 0)
    finally:
        dialog.shutdown()  # stops after the current step
        dialog.close()
        shutil.rmtree(DATA, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
