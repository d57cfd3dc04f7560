"""Speed in the app against speed in the CLI, on one prompt and the same settings (issue 14, part 3).

Drives the real window as a user does: types the prompt into the composer, clicks
Send, waits for the reply to end and reads the reply's statistics (the engine's
own decode speed, which the window shows under the reply). The CLI runs the same
prompt with the same settings (`specdeck-cli generate --json`). Each round runs both,
the CLI first in even rounds and the app first in odd ones, so both see the same
machine and a machine that speeds up or slows down favours neither; each figure is a
median over rounds.
With `--busy`, every run has one other process keeping a core busy (a Python
spin loop), as a second program on the user's machine would.

    QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1 python docs/bench/app_speed.py [--rounds 3]
        [--configs llama-ngram,torch-bf16] [--busy] [--max-tokens 256] [--threads N] [--k K]
        [--fresh-engine] [--charts-closed] [--smoke]

`--k K` fixes the draft length for both. With the automatic one, k follows measured
timings, so a bfloat16 reply is verified in batches of other sizes from run to run,
rounds differently, and becomes another text, with another acceptance: PyTorch bf16
replies here ran anywhere from 23 to 53 tok/s for that alone. A fixed k gives the same
reply every round, so the ratio measures the app and not the text. Each round keeps both
replies' step counts; where they differ in some rounds (another text), the script also
gives the ratio over the rounds where they agree.

`--fresh-engine` gives the app a new engine process every round. A process decodes at a
speed of its own: three replies in one process run within 3% of each other, while one
process and the next differ by up to 20% (the same code, on this machine; where its
memory happens to lie). The CLI is a new process every round, so it samples that
spread, while the app's one engine process is a single draw for the whole run: its
ratio to the CLI then moves from one run to the next by as much as the app costs.

The last column is the live charts' redraws per second of the app's replies (from Send to
the reply's end): the app is measured with its charts drawing, not only shown.

`--smoke` (the test suite's): two short rounds of the first config, checking only that every
number was read. Prints a markdown table; the numbers in docs/benchmarks.md came from it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

PROMPT = "Write a story of about 200 words about a lighthouse keeper who finds a message in a bottle."
CONFIGS = {
    "llama-ngram": ({"target": "default", "drafter": "ngram"}, []),
    "torch-bf16": (
        {"target": "default", "backend": "torch", "dtype": "bfloat16", "drafter": "ngram"},
        ["--backend", "torch", "--dtype", "bfloat16"],
    ),
}
REPLY_TIMEOUT_S = 300


class Reply(NamedTuple):
    """What a round reads of one reply, from the CLI or from the window."""

    tokens_per_s: float
    steps: int  # the same count on both sides means the same text, as a rule
    drafted: int  # draft tokens tried; over the steps, the draft length automatic k chose on average


def cli_reply(flags: list[str], max_tokens: int) -> Reply:
    command = [
        sys.executable,
        "-m",
        "engine.cli.main",
        "generate",
        "--json",
        "-n",
        str(max_tokens),
        "-p",
        PROMPT,
        *flags,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=REPLY_TIMEOUT_S, check=True)
    stats = json.loads(done.stdout)["stats"]
    return Reply(float(stats["tokens_per_s"]), int(stats["steps"]), int(stats["drafted"]))


class App:
    """One main window, loaded once per config; `reply()` sends the prompt and reads the reply."""

    def __init__(self, config: dict, max_tokens: int, charts: bool = True, fresh_engine: bool = False) -> None:
        from PySide6.QtCore import QCoreApplication, Qt
        from PySide6.QtTest import QTest

        from app.shell.application import create_application
        from app.shell.main_window import MainWindow
        from engine import EngineConfig, SamplingConfig

        self._qt, self._test = Qt, QTest
        self._config, self._fresh_engine = EngineConfig(**config), fresh_engine
        self.application = create_application(sys.argv)  # as `specdeck` makes it: Qt's settings, the GC timer
        QCoreApplication.setApplicationName("specdeck-app-speed")  # settings of its own, never the user's
        self.window = MainWindow()
        self.window.sampling = SamplingConfig(max_tokens=max_tokens)
        self.window.resize(1400, 900)
        self.window.show()
        self.redraw_rates: list[float] = []  # the charts' redraws per second of each reply (0 with the dock closed)
        if not charts:
            self.window.charts_dock.close()  # as the dock's close button does
        self._load()

    def _load(self) -> None:
        loaded = []
        connection = self.window.controller.sig_loaded.connect(lambda config: loaded.append(config))
        self.window.start(self._config)
        self._wait(lambda: loaded, "the model to load")
        self.window.controller.sig_loaded.disconnect(connection)

    def reply(self) -> tuple[Reply, float]:
        """The reply, and the share of a core the window's process used meanwhile."""
        results = []
        connection = self.window.controller.sig_run_finished.connect(lambda kind, result: results.append(result))
        view = self.window.chat_view
        view.composer.setFocus()
        self._test.keyClicks(view.composer, PROMPT)
        cpu_before, wall_before = time.process_time(), time.monotonic()
        redraws_before = self.window.charts.redraws
        self._test.mouseClick(view.send_button, self._qt.MouseButton.LeftButton)
        self._wait(lambda: results, "the reply")
        wall = time.monotonic() - wall_before
        gui_share = (time.process_time() - cpu_before) / wall
        self.redraw_rates.append((self.window.charts.redraws - redraws_before) / wall)
        self.window.controller.sig_run_finished.disconnect(connection)
        self._wait(lambda: not self.window.controller.busy, "the engine to be free")
        if results[0] is None:
            raise RuntimeError(f"the reply failed: {self.window.banner.text()}")
        if self._fresh_engine:  # the next round on a new engine process, as the CLI is a new process
            self.window.controller.process.stop()
            self._load()
        self.window.chats.open(None)  # the next round starts from the same prompt, not a longer chat
        stats = results[0].stats
        return Reply(stats.tokens_per_s, stats.steps, stats.drafted), gui_share

    def close(self) -> None:
        self.window.close()
        self.application.processEvents()

    def _wait(self, done, what: str) -> None:
        """Run the event loop, as the app's own exec() does, until `done()`: the process sleeps
        until an event comes. (Polling with processEvents and 5 ms sleeps woke it 200 times a
        second, each wake-up taking a core from the engine for a moment: 10% of the reply's speed.
        `done()` is checked once a second: a window on its own has no such timer, and at 10 Hz it
        was a tenth of the window's timer wake-ups.)"""
        from PySide6.QtCore import QEventLoop, QTimer

        loop, deadline = QEventLoop(), time.monotonic() + REPLY_TIMEOUT_S
        check = QTimer(interval=1000)

        def poll() -> None:
            if done() or time.monotonic() > deadline:
                loop.quit()

        check.timeout.connect(poll)
        check.start()
        if not done():
            loop.exec()
        check.stop()
        if not done():
            raise TimeoutError(f"waited {REPLY_TIMEOUT_S} s for {what}")


@contextlib.contextmanager
def busy_core(on: bool):
    """One other process spinning on a core while the block runs."""
    if not on:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def measure(
    name: str,
    rounds: int,
    max_tokens: int,
    busy: bool,
    threads: int | None = None,
    charts: bool = True,
    k: int | None = None,
    fresh_engine: bool = False,
) -> dict:
    config, flags = CONFIGS[name]
    if threads is not None:  # the same count for both, where the automatic choice would follow the load
        config, flags = {**config, "threads": threads}, [*flags, "--threads", str(threads)]
    if k is not None:  # the same reply every round (see the module's docstring)
        config, flags = {**config, "k": k}, [*flags, "--k", str(k)]
    app = App(config, max_tokens, charts, fresh_engine)
    rounds_read = []  # (CLI's reply, app's reply, the window's share of a core)
    try:
        for round_ in range(rounds):
            with busy_core(busy):
                read = {}
                # CLI, app; app, CLI; ...: a machine that drifts favours neither.
                for side in ("app", "cli") if round_ % 2 else ("cli", "app"):
                    read[side] = app.reply() if side == "app" else cli_reply(flags, max_tokens)
                rounds_read.append((read["cli"], *read["app"]))
    finally:
        app.close()
    cli = [c.tokens_per_s for c, _, _ in rounds_read]
    gui = [a.tokens_per_s for _, a, _ in rounds_read]
    # Each round's app against the CLI run beside it, on the same minute of the machine.
    ratios = [a / c for a, c in zip(gui, cli)]
    return {
        "config": name,
        "busy": busy,
        "charts": charts,
        "k": k,
        "fresh_engine": fresh_engine,
        "cli": cli,
        "app": gui,
        "gui_cpu": [share for _, _, share in rounds_read],
        "redraws_per_s": app.redraw_rates,  # the live charts' redraws per second of each app reply
        "steps": [(c.steps, a.steps) for c, a, _ in rounds_read],  # (CLI, app) per round
        "drafted": [(c.drafted, a.drafted) for c, a, _ in rounds_read],
        "ratio": statistics.median(gui) / statistics.median(cli),
        "pair_ratio": statistics.median(ratios),
        "pair_quartiles": statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3,  # one round: itself
        # Only the rounds where both replies took as many steps (the same text, as a rule).
        "same_steps_ratios": [r for r, (c, a, _) in zip(ratios, rounds_read) if c.steps == a.steps],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default="llama-ngram,torch-bf16")
    parser.add_argument("--busy", action="store_true", help="also measure with one other process keeping a core busy")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="decode threads for both the CLI and the app (default: automatic, the free cores)",
    )
    parser.add_argument(
        "--k",
        type=int,
        default=None,
        help="a fixed draft length for both (default: automatic, which may change a bf16 reply)",
    )
    parser.add_argument(
        "--fresh-engine",
        action="store_true",
        help="a new engine process for every round of the app, as the CLI's is new every round",
    )
    parser.add_argument(
        "--charts-closed", action="store_true", help="close the live charts' dock first, as a user who only chats would"
    )
    parser.add_argument("--smoke", action="store_true", help="two short rounds of the first config")
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # The window's settings and conversations go to a scratch place, never the user's.
    scratch = tempfile.mkdtemp(prefix="specdeck-app-speed-")
    os.environ["XDG_CONFIG_HOME"] = os.environ["XDG_DATA_HOME"] = scratch
    os.environ["SPECDECK_DATA_DIR"] = os.path.join(scratch, "conversations")
    names = args.configs.split(",")
    if args.smoke:
        names, args.rounds, args.max_tokens = names[:1], 2, 16
    rows = []
    for name in names:
        for busy in (False, True) if args.busy else (False,):
            rows.append(
                measure(
                    name,
                    args.rounds,
                    args.max_tokens,
                    busy,
                    args.threads,
                    not args.charts_closed,
                    args.k,
                    args.fresh_engine,
                )
            )
    print(
        "| config | charts | other process busy | CLI tok/s (median) | app tok/s (median) | app / CLI "
        "| app / CLI, median of rounds (middle half) | window's CPU | chart redraws / s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['config']} | {'shown' if row['charts'] else 'closed'} | {'yes' if row['busy'] else 'no'} "
            f"| {statistics.median(row['cli']):.1f} | {statistics.median(row['app']):.1f} | {row['ratio']:.2f} "
            f"| {row['pair_ratio']:.2f} ({row['pair_quartiles'][0]:.2f}-{row['pair_quartiles'][2]:.2f}) "
            f"| {statistics.median(row['gui_cpu']):.0%} of a core "
            f"| {statistics.median(row['redraws_per_s']):.1f} |"
        )
    for row in rows:
        same = row["same_steps_ratios"]
        if len(same) < len(row["steps"]):  # another text in some rounds: say how the like-for-like ones compare
            summary = f"median ratio {statistics.median(same):.2f}" if same else "none"
            print(
                f"{row['config']}: {len(same)} of {len(row['steps'])} rounds gave both replies as many steps "
                f"(the same text); {summary}"
            )
    quiet = {row["config"]: statistics.median(row["app"]) for row in rows if not row["busy"]}
    for row in rows:
        if row["busy"] and row["config"] in quiet:
            print(f"{row['config']}: app busy / app quiet = {statistics.median(row['app']) / quiet[row['config']]:.2f}")
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
