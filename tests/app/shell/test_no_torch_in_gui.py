"""The window's process never loads torch, transformers or llama.cpp: they live in the engine
process. Checked on a fresh interpreter that opens the real window, loads the embedded model,
chats, opens the pair dialog and waits for its check of the embedded model (a llama.cpp GGUF:
the check reads llama.cpp's GPU offload and the device memory, in the engine process), and
then lists what it imported and the threads it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "transformers", "llama_cpp", "safetensors", "accelerate")

SCRIPT = r"""
import json, os, sys
from PySide6.QtCore import QTimer

from app.shell.application import create_application
from app.shell.main_window import MainWindow
from engine import EngineConfig, SamplingConfig

application = create_application([])
window = MainWindow()
window.show()
window.sampling = SamplingConfig(max_tokens=8)
outcome = {}

def timeout():
    outcome["error"] = "timed out: " + window.banner.text()
    window.close()

def loaded(config):
    window.send_message("Say hello.")

def finished(kind, result):
    outcome["text"] = result.text if result is not None else None
    outcome["tokens"] = [token.source.value for event in result.events for token in event.tokens] if result else []
    window.choose_models()  # the pair dialog checks what it shows as soon as it is shown
    dialog = window.pair_dialog
    dialog.sig_check_finished.connect(lambda ok: checked(dialog, ok))

def checked(dialog, ok):
    outcome["check"] = {"ok": ok, "target": dialog.engine_config().target,
                        "findings": {f.title: f.severity for f in dialog.findings_list()}}
    dialog.reject()
    window.close()

def failed(message):
    outcome["error"] = message
    window.close()

window.controller.sig_loaded.connect(loaded)
window.controller.sig_run_finished.connect(finished)
window.controller.sig_load_failed.connect(failed)
window.controller.sig_error.connect(failed)
QTimer.singleShot(300_000, timeout)
window.start(EngineConfig(measure_costs=False, k=4))
application.exec()
outcome["engine_pid"] = window.controller.process.pid
outcome["heavy"] = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
outcome["threads"] = sorted({open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")})
print("OUTCOME " + json.dumps(outcome))
"""


def test_chatting_in_the_window_loads_no_torch_or_llama_cpp_in_its_process(tmp_path):
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        HF_HUB_OFFLINE="1",
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        SPECDECK_DATA_DIR=str(tmp_path / "chats"),
    )
    script = f"HEAVY = {HEAVY!r}\n{SCRIPT}"
    child = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )

    lines = [line for line in child.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert child.returncode == 0 and lines, child.stderr[-3000:]
    outcome = json.loads(lines[-1].removeprefix("OUTCOME "))
    assert "error" not in outcome, outcome["error"]
    assert outcome["text"] and outcome["tokens"], "the reply came back"
    assert outcome["engine_pid"] is not None  # it decoded in the engine process
    check = outcome["check"]  # the pair dialog's check: asked of the engine process
    assert check["ok"] and check["target"] == "default", check
    assert check["findings"].get("Layers on the GPU (llama.cpp)") == "info" and "Fits in memory" in check["findings"]
    assert outcome["heavy"] == []
    # Qt painted the charts and the reply on the GUI thread itself, with no pool of helper threads
    # to wake (each wake-up takes a core from the engine: app/shell/application.py).
    assert "Thread (pooled)" not in outcome["threads"], outcome["threads"]
