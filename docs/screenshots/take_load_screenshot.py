"""Take the Load view's screenshot (load-view.png) with the real embedded model.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_load_screenshot.py [--batches 1,2,4,8,16]
        [--max-tokens N] [--requests N] [--out FILE]
    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_load_screenshot.py --from SWEEP.json [--out FILE]

Runs the load sweep (speculative against plain decoding with B requests in flight, automatic
and fixed k) from Models ▸ Load test… on the app's default pair, on an engine process of its
own, then grabs the dialog. Run it on a quiet machine: every B runs the shipped prompts in
both modes (--max-tokens and --requests shorten it: replies of N tokens, N requests per run).
--from draws a sweep saved by `specdeck-cli bench --concurrency ... --json SWEEP.json` instead of
running one (the README's picture: docs/bench/load-torch-float32.json, measured on a quiet machine).
Uses a temporary settings folder, so it never touches yours. The numbers in the
picture are whatever this machine measured; docs/benchmarks.md holds the ones taken on a quiet one.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from shots import application as make_application
from shots import settle, wait

from engine import EngineConfig

HERE = Path(__file__).resolve().parent
CONFIG = EngineConfig(k=4, threads=1)  # one thread: on a busy machine llama.cpp's threads wait for each other


def main() -> int:
    application = make_application()
    from app.bench.load_dialog import LoadDialog

    dialog = LoadDialog(config=CONFIG)  # no window: its own engine process, stopped when it closes
    dialog.resize(1100, 820)
    if "--batches" in sys.argv:
        dialog.batches_edit.setText(sys.argv[sys.argv.index("--batches") + 1])
    if "--max-tokens" in sys.argv:
        dialog.max_tokens.setValue(int(sys.argv[sys.argv.index("--max-tokens") + 1]))
    if "--requests" in sys.argv:  # not on the form: the sweep's default is the prompts, at least 2 B
        requests, form = int(sys.argv[sys.argv.index("--requests") + 1]), dialog.request
        dialog.request = lambda: dataclasses.replace(form(), requests=requests)
    dialog.show()
    if "--from" in sys.argv:
        import json

        from engine.bench.load_results import LoadSweep

        saved = json.loads(Path(sys.argv[sys.argv.index("--from") + 1]).read_text(encoding="utf-8"))
        dialog.show_sweep(LoadSweep.from_dict(saved))
        return _save(application, dialog)
    finished = []
    dialog.sig_finished.connect(finished.append)
    dialog.run()
    wait(application, lambda: finished and not dialog.running)
    if finished[0] is None:
        raise RuntimeError(f"the load test failed: {dialog.status.text()}")
    return _save(application, dialog)


def _save(application, dialog) -> int:
    settle(application)
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else HERE / "load-view.png"
    dialog.grab().save(str(out))
    dialog.close()
    dialog.deleteLater()  # delete the dialog while the application still exists, not at interpreter exit
    application.processEvents()
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
