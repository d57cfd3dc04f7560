"""specdeck-cli chat: a conversation in the terminal, with the engine `generate` loads.

    specdeck-cli chat -m default [-md M | --drafter ngram] [-sys "You are terse."] [--color auto|always|never]

Each line typed is a user message; the reply streams as it is decoded, on a
terminal with each token coloured by where it came from, as in the app
(app/chat/provenance.py): green an accepted draft token, yellow (the app's orange) a
token the target resampled after a rejection, blue the bonus token after a fully
accepted draft, no colour a plain target token. Lines starting with "/" are
commands: /stats, /compare, /reset, /help, /quit.

The reply goes to stdout, the loading line and the chat's remarks to stderr.
End of input (Ctrl+D) and /quit leave with status 0. Ctrl+C while a reply
streams stops that reply, which stays in the conversation as far as it went;
Ctrl+C at the prompt exits with status 130 and "cancelled", as everywhere in the
command line (cli_interrupt.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from engine.cli import interrupt as cli_interrupt
from engine.cli.common import decode_options, engine_config, load_engine, model_options, sampling_config, verdict_lines
from engine.cli.terminal import isatty
from engine.core.events import GenerationResult, Source, StepEvent
from engine.errors import ContextOverflowError, SpecDeckError
from engine.figures import (
    ACCEPTANCE_LENGTH,
    DRAFT_ACCEPTANCE,
    PER_TOKEN_ACCEPTANCE,
    PREDICTED_SPEEDUP,
    draft_acceptance_text,
)

COLOURS = {  # ANSI foreground colours, the app's tints where a terminal has them
    Source.ACCEPTED: "\033[32m",  # green: the draft guessed right
    Source.RESAMPLED: "\033[33m",  # yellow (the app's orange): the target overruled the draft
    Source.BONUS: "\033[34m",  # blue: the free token after a fully accepted draft
    Source.PLAIN: "",  # an ordinary target token: plain text
    Source.UNREPORTED: "",  # a remote server that does not say
}
RESET = "\033[0m"
SOURCE_NAMES = {
    Source.ACCEPTED: "accepted draft",
    Source.RESAMPLED: "resampled",
    Source.BONUS: "bonus",
    Source.PLAIN: "plain target",
    Source.UNREPORTED: "unreported",
}

HELP = """commands:
  /stats    the last reply's statistics: speed, acceptance, the speedup the formula predicts
  /compare  decode the last message again, vanilla and speculatively: both speeds, the speedup, identical or not
  /reset    start a new conversation (the system prompt stays)
  /help     this list
  /quit     leave (so does Ctrl+D); Ctrl+C stops a reply as it streams"""


def add_chat_parser(subparsers) -> argparse.ArgumentParser:
    chat = subparsers.add_parser("chat", help="chat in the terminal, each token coloured by where it came from")
    model_options(chat)
    decode_options(chat, max_tokens=512)
    chat.add_argument("-sys", "--system", default="", help="the system prompt (default: none)")
    chat.add_argument(
        "--color",
        "--colour",
        dest="color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour tokens by provenance: auto (default: when stdout is a terminal and "
        "NO_COLOR is unset), always or never",
    )
    chat.set_defaults(func=cmd_chat)
    return chat


def cmd_chat(args: argparse.Namespace) -> int:
    sampling = sampling_config(args)
    engine = load_engine(engine_config(args))
    try:
        Chat(engine, sampling, system=args.system, colour=use_colour(args.color, sys.stdout)).run()
    finally:
        engine.close()
    return 0


def use_colour(choice: str, stream: TextIO) -> bool:
    if choice != "auto":
        return choice == "always"
    return isatty(stream) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def paint(text: str, source: Source, colour: bool) -> str:
    code = COLOURS[source] if colour else ""
    return f"{code}{text}{RESET}" if code and text else text


class Chat:
    """The conversation and the commands; `read_line` is input() unless a test drives it."""

    def __init__(
        self,
        engine,
        sampling,
        *,
        system: str = "",
        colour: bool = False,
        out: TextIO | None = None,
        err: TextIO | None = None,
        read_line: Callable[[str], str] = input,
    ) -> None:
        self.engine = engine
        self.sampling = sampling
        self.system = system
        self.colour = colour
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.read_line = read_line
        self.messages: list[dict] = []  # the user and assistant turns so far
        self.last: GenerationResult | None = None  # the last reply
        self.last_prompt: list[int] | None = None  # the token ids it answered, for /compare

    @property
    def speculative(self) -> bool:
        return self.engine.drafter is not None

    def run(self) -> None:
        interactive = isatty(sys.stdin)
        if interactive:
            try:
                import readline  # noqa: F401 (input() then edits the line and keeps a history)
            except ImportError:  # Windows
                pass
        config = self.engine.config
        drafter = f"draft {config.draft}" if config.draft else f"{config.drafter} drafter"
        drafter = drafter if self.speculative else "no drafter"
        self._say(
            f"chat with {self.engine.target.info.name} ({drafter}): /help lists the commands, Ctrl+D or /quit leaves"
        )
        if self.colour:
            legend = ", ".join(paint(SOURCE_NAMES[s], s, True) for s in Source if s is not Source.UNREPORTED)
            print(f"colours: {legend}", file=self.out, flush=True)
        while True:
            try:
                line = self.read_line("> " if interactive else "").strip()
            except EOFError:
                if interactive:
                    print(file=self.out)
                return
            if not line:
                continue
            if line.startswith("/"):
                if not self.command(line):
                    return
                continue
            self.reply(line)

    def command(self, line: str) -> bool:
        """Run a /command; False when the chat ends."""
        name = line.split()[0].lower()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            print(HELP, file=self.out, flush=True)
        elif name == "/reset":
            self.messages.clear()
            self.last = self.last_prompt = None
            self._say("new conversation")
        elif name == "/stats":
            self.stats()
        elif name == "/compare":
            self.compare()
        else:
            self._say(f"unknown command {name}: /help lists them")
        return True

    def reply(self, text: str) -> None:
        """Send a user message and stream the reply, kept in the conversation even if stopped early."""
        self.messages.append({"role": "user", "content": text})
        try:
            prompt = self.engine.prompt_ids(self._conversation())
            cancel = threading.Event()
            with cli_interrupt.interrupt_sets(cancel):
                result = self.engine.generate(
                    prompt, self.sampling, speculative=self.speculative, cancel=cancel, on_event=self._show
                )
        except ContextOverflowError:
            self.messages.pop()
            self._say(
                f"the conversation no longer fits the context window ({self.engine.target.n_ctx} tokens): "
                "/reset starts a new one (or load the model with a larger -c/--n-ctx)"
            )
            return
        except SpecDeckError as error:
            self.messages.pop()
            self._say(f"error: {error}")
            return
        print(file=self.out, flush=True)
        self.last, self.last_prompt = result, prompt
        if result.text:
            self.messages.append({"role": "assistant", "content": result.text})
        else:  # nothing came back (stopped at once): the message was never answered
            self.messages.pop()
        if result.finish_reason == "cancelled":
            self._say("[stopped]")
        elif result.finish_reason == "context":
            self._say(
                f"the context window ({self.engine.target.n_ctx} tokens) is full: /reset starts a new "
                "conversation (or load the model with a larger -c/--n-ctx)"
            )

    def stats(self) -> None:
        if self.last is None:
            self._say("no reply yet: /stats shows the last reply's statistics")
            return
        s = self.last.stats
        lines = [  # the figures by engine/figures.py's names, in its order
            f"tokens/s: {s.tokens_per_s:.1f} ({s.tokens} tokens in {s.wall_s:.2f} s, {s.steps} steps)",
            f"{DRAFT_ACCEPTANCE.name}: {draft_acceptance_text(s) or 'nothing drafted'}",
            f"{ACCEPTANCE_LENGTH.name}: {s.mean_acceptance_length:.2f} (tokens per step: the accepted drafts + 1)",
            f"{PER_TOKEN_ACCEPTANCE.name}: {s.acceptance_rate:.2f} ({s.accepted} accepted of {s.tested} tested: "
            "the formula's a)",
            f"{PREDICTED_SPEEDUP.name}: {s.predicted_speedup:.2f}x (the formula, from a and the measured costs)",
        ]
        counts = {source: 0 for source in Source}
        for info in self.last.token_infos:
            counts[info.source] += 1
        lines.append("tokens: " + ", ".join(f"{paint(SOURCE_NAMES[s], s, self.colour)} {n}" for s, n in counts.items()))
        lines.extend(f"note: {note}" for note in s.notes)
        print("\n".join(lines), file=self.out, flush=True)

    def compare(self) -> None:
        if self.last_prompt is None:
            self._say("nothing to compare yet: send a message first")
            return
        self._say("decoding the last message again: vanilla, then speculatively…")
        cancel = threading.Event()
        try:
            with cli_interrupt.interrupt_sets(cancel):
                comparison = self.engine.compare(self.last_prompt, self.sampling, cancel=cancel)
        except SpecDeckError as error:
            self._say(f"error: {error}")
            return
        if cancel.is_set():
            self._say("[stopped]")
            return
        s = comparison.speculative.stats
        lines = [f"speculative: {s.tokens} tokens at {s.tokens_per_s:.1f} tok/s", *verdict_lines(comparison)]
        print("\n".join(lines), file=self.out, flush=True)

    def _conversation(self) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.messages

    def _show(self, event: StepEvent) -> None:
        if self.colour:
            text = "".join(paint(info.text, info.source, True) for info in event.tokens)
        else:
            text = event.text
        self.out.write(text)
        self.out.flush()

    def _say(self, message: str) -> None:
        print(message, file=self.err, flush=True)
