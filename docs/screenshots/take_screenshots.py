"""Take the README's screenshots of the desktop app with the real embedded model.

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_screenshots.py [chat] [side-by-side] [pair-dialog]

Writes chat.png (replies drawn as Markdown with their token colours),
side-by-side.png and pair-dialog.png beside this file (or only
the ones named). The pair dialog is shown with the EAGLE drafter chosen (its
shipped head for the embedded model), checked. Uses a temporary settings and
conversation folder, so it never touches yours. Runs under Xvfb as well (unset
QT_QPA_PLATFORM and run it with xvfb-run).
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication
from shots import application as make_application  # first: platform, data folder, workaround
from shots import settle, wait

from engine import EngineConfig, SamplingConfig

HERE = Path(__file__).resolve().parent
SIZE = (1440, 900)
# k = 4: on a small CPU model automatic k mostly decodes plainly, and these pictures are about drafting.
# The verify costs are measured (as in the app) so that the theory panel shows this machine's numbers.
# One thread: on a busy machine llama.cpp's threads spin waiting for each other.
CONFIG = EngineConfig(k=4, threads=1)
SHOTS = ("chat", "side-by-side", "pair-dialog")


def main() -> int:
    wanted = sys.argv[1:] or list(SHOTS)
    unknown = sorted(set(wanted) - set(SHOTS))
    if unknown:
        print(f"unknown screenshot {', '.join(unknown)}: choose from {', '.join(SHOTS)}", file=sys.stderr)
        return 2
    application = make_application()
    from app.shell.main_window import MainWindow

    window = MainWindow()
    window.resize(*SIZE)
    window.sampling = SamplingConfig(max_tokens=160)
    window.show()
    try:
        if {"chat", "side-by-side"} & set(wanted):
            shoot(application, window)
        if "pair-dialog" in wanted:
            shoot_pair_dialog(application, window)
    finally:
        window.close()  # cancels whatever still runs and joins the worker thread
    print("wrote", ", ".join(f"{name}.png" for name in SHOTS if name in wanted))
    return 0


def shoot(application: QApplication, window) -> None:
    """chat.png and side-by-side.png (both: the second continues from the first)."""
    finished = []  # one entry per run that ended
    window.controller.sig_run_finished.connect(lambda kind, result: finished.append(kind))
    window.start(CONFIG)
    wait(application, lambda: window.controller.loaded is not None and not window.controller.busy)

    for prompt in (
        "Write a Python function that adds two numbers, then repeat the function.",
        "Can you write a function that subtracts two numbers?",
    ):
        runs = len(finished)
        window.send_message(prompt)
        wait(application, lambda: len(finished) > runs)
    settle(application)  # the default view: finished replies as Markdown, with the provenance colours kept
    window.grab().save(str(HERE / "chat.png"))

    window.tabs.setCurrentWidget(window.compare_view)
    window.compare_view.prompt.setPlainText(
        "Copy this paragraph exactly, word for word: Speculative decoding lets a small draft model propose "
        "several tokens that a large target model then checks in a single forward pass. Every accepted token "
        "saves one full pass of the large model, and the output is exactly what the target alone would have written."
    )
    window.sampling = SamplingConfig(max_tokens=80)
    runs = len(finished)
    window.compare_view.run_button.click()
    wait(application, lambda: len(finished) > runs)
    settle(application)
    window.grab().save(str(HERE / "side-by-side.png"))


def shoot_pair_dialog(application: QApplication, window) -> None:
    """pair-dialog.png: the EAGLE drafter on the embedded model, checked."""
    from dataclasses import replace

    window.choose_models()
    dialog = window.pair_dialog
    config = replace(dialog.engine_config(), target="default", backend="auto")
    dialog.set_config(config.with_drafter("eagle", heads=None))
    checked = []
    dialog.sig_check_finished.connect(checked.append)
    dialog.check()
    wait(application, lambda: checked)
    settle(application)
    dialog.grab().save(str(HERE / "pair-dialog.png"))
    dialog.reject()


if __name__ == "__main__":
    sys.exit(main())
