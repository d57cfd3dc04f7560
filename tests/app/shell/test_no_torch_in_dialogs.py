"""The benchmark and training dialogs run their work in the engine process: the window's process
loads no torch, transformers or llama.cpp for them. Checked on a fresh interpreter that opens the
real window, benchmarks one prompt, trains two steps of Medusa heads for a tiny random model, and
then lists what it imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.app.shell.test_no_torch_in_gui import HEAVY, ROOT

SCRIPT = r"""
import json, sys
from PySide6.QtCore import QTimer

from app.shell.application import create_application
from app.shell.main_window import MainWindow
from engine import EngineConfig

application = create_application([])
window = MainWindow()
window.show()
outcome = {}

def fail(message):
    outcome.setdefault("error", message)
    window.close()

def loaded(config):
    window.controller.sig_loaded.disconnect(loaded)
    dialog = window.open_benchmark()
    dialog.prompts_edit.setText(PROMPTS)
    dialog.repeat.setValue(1)
    dialog.max_tokens.setValue(4)
    dialog.sig_finished.connect(lambda report: benchmarked(dialog, report))
    dialog.run()

def benchmarked(dialog, report):
    if report is None:
        return fail("the benchmark failed: " + dialog.status.text())
    outcome["bench"] = {"prompts": [p.id for p in report.prompts], "rows": dialog.table.rowCount(),
                        "status": dialog.status.text()}
    dialog.reject()
    training = window.open_training()
    form = training.form
    form.target.set_spec(TINY)
    form.data_kind.setCurrentIndex(form.data_kind.findData("file"))
    form.data_path.setText(TEXT)
    form.num_heads.setValue(2)
    form.steps.setValue(2)
    form.batch_size.setValue(2)
    form.seq_len.setValue(32)
    form.out_dir.setText(OUT)
    training.sig_finished.connect(lambda result: trained(training, result))
    training.start()

def trained(training, result):
    if result is None:
        return fail("the training failed: " + training.status.text())
    outcome["train"] = {"step": result.step, "points": len(training.charts.steps), "status": training.status.text()}
    window.controller.sig_loaded.connect(lambda config: window.close())  # the window's pair, loaded again

window.controller.sig_loaded.connect(loaded)
window.controller.sig_load_failed.connect(fail)
window.controller.sig_error.connect(fail)
QTimer.singleShot(300_000, lambda: fail("timed out: " + window.banner.text()))
window.start(EngineConfig(measure_costs=False, k=4))
application.exec()
outcome["heavy"] = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
print("OUTCOME " + json.dumps(outcome))
"""


def test_benchmarking_and_training_from_the_window_load_no_torch_or_llama_cpp_in_its_process(tmp_path):
    from tests.factories.hf_models import make_tiny_llama  # here, in the test's process: it needs torch

    tiny = make_tiny_llama(tmp_path / "tiny-llama", seed=0)
    prompts = tmp_path / "one.jsonl"
    copy = "Copy this sentence exactly: the quick brown fox jumps over the lazy dog."
    prompts.write_text(json.dumps({"id": "one", "kind": "reuse", "messages": [{"role": "user", "content": copy}]}))
    text = tmp_path / "fox.txt"
    text.write_text("The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat. " * 40)
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        HF_HUB_OFFLINE="1",
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        SPECDECK_DATA_DIR=str(tmp_path / "chats"),
    )
    paths = {"TINY": str(tiny), "PROMPTS": str(prompts), "TEXT": str(text), "OUT": str(tmp_path / "heads")}
    script = "".join(f"{name} = {value!r}\n" for name, value in {"HEAVY": HEAVY, **paths}.items()) + SCRIPT
    child = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )

    lines = [line for line in child.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert child.returncode == 0 and lines, child.stderr[-3000:]
    outcome = json.loads(lines[-1].removeprefix("OUTCOME "))
    assert "error" not in outcome, outcome["error"]
    bench, train = outcome["bench"], outcome["train"]
    assert (
        bench["prompts"] == ["one"]
        and bench["rows"] == 1 + 1 + 1
        and bench["status"].startswith("Done:")
        and "over 1 prompt," in bench["status"]
    )
    assert train["step"] == 2 and train["points"] == 2 and train["status"].startswith("Done: 2 steps")
    assert (tmp_path / "heads" / "config.json").is_file()  # the heads, saved by the engine process
    assert outcome["heavy"] == []
