"""Take the benchmark dialog's screenshot (bench.png) with the real embedded model.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_bench_screenshot.py

Runs the shipped prompt set once (64 tokens a reply, peers on) with the
n-gram drafter and automatic k (run it on a quiet machine), then "Find the best
settings" on the same prompts, then grabs the dialog. `--prompts FILE` takes
another prompt set (a short one to look at the layout quickly). Uses a temporary settings
folder, so it never touches yours. The numbers in the picture are whatever
this machine measured; docs/benchmarks.md holds the ones taken on a quiet one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from shots import application as make_application
from shots import settle, wait

from engine import EngineConfig

HERE = Path(__file__).resolve().parent
CONFIG = EngineConfig()  # the app's default pair: embedded model, n-gram drafter, automatic k


def main() -> int:
    application = make_application()
    from app.bench.dialog import BenchDialog

    dialog = BenchDialog(
        config=CONFIG, apply_config=lambda config: None
    )  # no window: "Use these settings" does nothing
    dialog.resize(1280, 1080)
    if "--prompts" in sys.argv:
        dialog.prompts_edit.setText(sys.argv[sys.argv.index("--prompts") + 1])
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(64)
    dialog.peers.setChecked(True)
    dialog.show()
    finished = []
    dialog.sig_finished.connect(finished.append)
    dialog.run()
    wait(application, lambda: finished and not dialog.running)
    if finished[0] is None:
        raise RuntimeError(f"the benchmark failed: {dialog.status.text()}")
    tuned = []
    dialog.sig_tuned.connect(tuned.append)
    dialog.autotune()
    wait(application, lambda: tuned and not dialog.running)
    if tuned[0] is None:
        raise RuntimeError(f"auto-tune failed: {dialog.status.text()}")
    settle(application)
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else HERE / "bench.png"
    dialog.grab().save(str(out))
    dialog.close()
    dialog.deleteLater()  # delete the dialog while the application still exists, not at interpreter exit
    application.processEvents()
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
