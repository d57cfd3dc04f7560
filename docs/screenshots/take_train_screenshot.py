"""Take the README's screenshot of Models ▸ Train heads… while it trains an EAGLE head for the embedded model.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_train_screenshot.py [steps shown, default 60]

Writes train-heads.png beside this file: the dialog with Kind = EAGLE part-way
through a run on the built-in corpus, its accuracy chart showing depth 1 and
depth 2. Short sequences and a small feature cache (CACHE_TOKENS; the app caches
262144 target tokens, ~10 minutes on two CPU cores) let a few minutes of CPU
draw a curve. The head goes to a temporary folder and is thrown away; settings
are temporary too.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from shots import DATA, settle, wait
from shots import application as make_application

HERE = Path(__file__).resolve().parent
CACHE_TOKENS = 32_768  # target hidden states cached before training (the app's default is 262144)


def main() -> int:
    shown_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    application = make_application()
    from app.training.dialog import TrainDialog

    dialog = TrainDialog(target="default")
    dialog.form.set_kind("eagle")
    dialog.form.steps.setValue(400)
    dialog.form.batch_size.setValue(4)
    dialog.form.seq_len.setValue(64)
    form_options = dialog.form.options
    dialog.form.options = lambda: {**form_options(), "cache_tokens": CACHE_TOKENS}
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
