"""Take chat-eagle.png: the chat and its live charts with the EAGLE drafter on the embedded model.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_eagle_screenshot.py

Loads the embedded SmolLM2-135M-Instruct through transformers (bfloat16) with
the EAGLE head shipped for it, measures the verify costs as the app does, sends
two chat messages and grabs the window: the draft panel shows each step's tree
size and accepted length, the depth bars say "depth k", and the summary line
gives the last tree. Uses a temporary settings and conversation folder, so it
never touches yours. The speeds are whatever this machine measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

from shots import application as make_application  # first: platform, data folder, workaround
from shots import settle, wait

from engine import EngineConfig, SamplingConfig

HERE = Path(__file__).resolve().parent
SIZE = (1440, 900)
# A fixed node budget: automatic k on a small CPU model often decodes plainly, and this picture is about trees.
CONFIG = EngineConfig(target="default", drafter="eagle", dtype="bfloat16", k=10)
PROMPTS = (
    "Write a Python function that adds two numbers, then repeat the function.",
    "Can you write a function that subtracts two numbers?",
)


def main() -> int:
    application = make_application()
    from app.shell.main_window import MainWindow

    window = MainWindow()
    window.resize(*SIZE)
    window.sampling = SamplingConfig(max_tokens=160)
    window.show()
    try:
        finished = []
        window.controller.sig_run_finished.connect(lambda kind, result: finished.append(result))
        window.start(CONFIG)
        wait(application, lambda: window.controller.loaded is not None and not window.controller.busy)
        for prompt in PROMPTS:
            runs = len(finished)
            window.send_message(prompt)
            wait(application, lambda: len(finished) > runs)
            if finished[-1] is None:
                raise RuntimeError(f"the reply failed: {window.banner.text()}")
        settle(application)
        window.grab().save(str(HERE / "chat-eagle.png"))
    finally:
        window.close()  # cancels whatever still runs and joins the worker thread
    print("wrote", HERE / "chat-eagle.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
