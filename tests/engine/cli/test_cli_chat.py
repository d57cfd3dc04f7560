"""llama.cpp's short options, a prompt on standard input, and `specdeck-cli chat` as a user drives it."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import shutil
import signal
import subprocess

import pytest

from engine.cli.chat import COLOURS, RESET, Chat, paint
from engine.cli.main import build_parser, main
from engine.core.events import Source

ANSI = re.compile(r"\033\[[0-9;]*m")
COPY_PROMPT = (
    "Copy this paragraph exactly, word for word: Speculative decoding lets a small draft model propose "
    "several tokens that a large target model then checks in a single forward pass."
)  # the n-gram drafter finds its continuation in the prompt: drafts are accepted


def cli() -> str:
    exe = shutil.which("specdeck-cli")
    assert exe, "specdeck-cli is not on PATH: run the install command from README.md"
    return exe


def parsed(*argv: str) -> dict:
    return vars(build_parser().parse_args(list(argv)))


# -- short options ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "short, long",
    [
        (
            [
                "generate",
                "-m",
                "t.gguf",
                "-md",
                "d.gguf",
                "-ngl",
                "99",
                "-c",
                "2048",
                "-n",
                "8",
                "--draft-max",
                "5",
                "-p",
                "hi",
                "-t",
                "2",
                "-s",
                "7",
                "--temp",
                "0.7",
            ],
            [
                "generate",
                "--target",
                "t.gguf",
                "--draft",
                "d.gguf",
                "--gpu-layers",
                "99",
                "--n-ctx",
                "2048",
                "--max-tokens",
                "8",
                "--k",
                "5",
                "--prompt",
                "hi",
                "--threads",
                "2",
                "--seed",
                "7",
                "--temperature",
                "0.7",
            ],
        ),
        (
            [
                "bench",
                "-m",
                "t.gguf",
                "-md",
                "d.gguf",
                "-ngl",
                "99",
                "-c",
                "2048",
                "-n",
                "8",
                "--draft-max",
                "5",
                "-t",
                "2",
            ],
            [
                "bench",
                "--target",
                "t.gguf",
                "--draft",
                "d.gguf",
                "--gpu-layers",
                "99",
                "--n-ctx",
                "2048",
                "--max-tokens",
                "8",
                "--k",
                "5",
                "--threads",
                "2",
            ],
        ),
        (
            [
                "chat",
                "-m",
                "t.gguf",
                "-md",
                "d.gguf",
                "-ngl",
                "99",
                "-c",
                "2048",
                "-n",
                "8",
                "--draft-max",
                "5",
                "-t",
                "2",
                "-s",
                "7",
                "--temp",
                "0.7",
                "-sys",
                "Be terse.",
            ],
            [
                "chat",
                "--target",
                "t.gguf",
                "--draft",
                "d.gguf",
                "--gpu-layers",
                "99",
                "--n-ctx",
                "2048",
                "--max-tokens",
                "8",
                "--k",
                "5",
                "--threads",
                "2",
                "--seed",
                "7",
                "--temperature",
                "0.7",
                "--system",
                "Be terse.",
            ],
        ),
    ],
    ids=["generate", "bench", "chat"],
)
def test_short_options_parse_to_the_same_settings_as_long_ones(short, long):
    assert parsed(*short) == parsed(*long)


def test_multi_letter_short_options_are_not_read_as_one_letter_ones():
    """-md is the draft (not -m with the value "d"), -ngl the GPU layers (not -n "gl")."""
    args = parsed("generate", "-md", "d.gguf", "-ngl", "3", "-p", "hi")
    assert (args["target"], args["draft"], args["gpu_layers"], args["max_tokens"]) == ("default", "d.gguf", 3, 256)
    args = parsed("generate", "-mt.gguf", "-n4", "-p", "hi")  # attached values, as llama.cpp users type them
    assert (args["target"], args["max_tokens"], args["draft"]) == ("t.gguf", 4, None)
    assert parsed("generate", "-p", "hi")["k"] == "auto"  # the draft length stays automatic unless asked


def test_help_shows_the_short_options(capsys):
    for command in ("generate", "bench", "chat"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        for option in ("-m TARGET", "-md DRAFT", "-ngl GPU_LAYERS", "-c N_CTX", "-n MAX_TOKENS", "--draft-max K"):
            assert option in out, (command, option)


# -- the prompt on standard input ----------------------------------------------------------


def test_generate_reads_the_prompt_from_standard_input(capsys):
    done = subprocess.run(
        [cli(), "generate", "-m", "default", "-n", "4", "--threads", "1", "--drafter", "ngram", "--json"],
        input="Say hello.\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    piped = json.loads(done.stdout)
    assert main(["generate", "-p", "Say hello.", "-n", "4", "--threads", "1", "--json"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert piped["tokens"] == given["tokens"]  # the same reply: stdin was the prompt, its newline dropped


def test_no_prompt_on_a_terminal_says_how_to_give_one(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    assert main(["generate", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: No prompt") and "--prompt" in err and "loading" not in err


def test_an_empty_pipe_is_refused_before_loading(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert main(["generate", "--prompt", "-", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "empty" in err and "loading" not in err


# -- chat through a pipe and on a terminal ------------------------------------------------


def test_chat_answers_then_prints_stats_and_compare_without_colours_on_a_pipe():
    lines = "Say hi\n/stats\n/compare\n/quit\n"
    done = subprocess.run(
        [cli(), "chat", "-m", "default", "-n", "8", "--threads", "1", "--drafter", "ngram"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert not ANSI.search(out) and not ANSI.search(done.stderr)
    reply = out.splitlines()[0]
    assert reply.strip() and not reply.startswith("tokens/s")
    labels = (
        "tokens/s: ",
        "draft acceptance: ",
        "mean acceptance length: ",
        "per-token acceptance a: ",
        "predicted speedup: ",
    )  # engine/figures.py's names, in its order
    for label in labels:
        assert re.search(rf"^{label}(\d|nothing drafted)", out, re.MULTILINE), label
    assert [out.index(f"\n{label}") for label in labels] == sorted(out.index(f"\n{label}") for label in labels)
    assert re.search(r"^speculative: 8 tokens at \d+\.\d tok/s$", out, re.MULTILINE), out
    assert re.search(
        r"^vanilla: 8 tokens at \d+\.\d tok/s -> decoding speedup \d+\.\d\dx; outputs identical$", out, re.MULTILINE
    ), out
    assert "/help lists the commands" in done.stderr


def test_chat_on_a_terminal_colours_tokens():
    """stdout a pseudo-terminal, as when a user runs it: ANSI colours, green for the accepted drafts."""
    leader, follower = pty.openpty()
    env = {**{k: v for k, v in os.environ.items() if k != "NO_COLOR"}, "TERM": "xterm-256color"}
    child = subprocess.Popen(
        [cli(), "chat", "-m", "default", "-n", "12", "--threads", "1", "--draft-max", "4"],  # k fixed: it drafts
        stdin=subprocess.PIPE,
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(follower)
    child.stdin.write(f"{COPY_PROMPT}\n/quit\n".encode())
    child.stdin.close()
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert child.wait(timeout=300) == 0, child.stderr.read().decode()
    child.stderr.close()
    text = out.decode()
    assert text.startswith("colours: ")  # the legend
    reply = text.splitlines()[1]
    assert COLOURS[Source.ACCEPTED] in reply and RESET in reply
    assert ANSI.sub("", reply).strip()


# -- chat in-process: colours, Ctrl+C, the context window -----------------------------------


@pytest.fixture(scope="module")
def engine():
    from engine.api import Engine, EngineConfig

    engine = Engine.load(
        EngineConfig(target="default", drafter="ngram", threads=1, n_ctx=256, k=4, measure_costs=False)
    )
    yield engine
    engine.close()


def greedy(max_tokens: int):
    from engine.core.sampling import SamplingConfig

    return SamplingConfig(max_tokens=max_tokens)


def test_each_token_is_painted_by_its_provenance(engine):
    out, err = io.StringIO(), io.StringIO()
    chat = Chat(engine, greedy(12), colour=True, out=out, err=err)
    chat.reply(COPY_PROMPT)
    infos = chat.last.token_infos
    expected = "".join(paint(info.text, info.source, True) for info in infos) + "\n"
    assert out.getvalue() == expected
    assert any(info.source is Source.ACCEPTED for info in infos)  # the test sees green, not only plain text
    assert paint("x", Source.ACCEPTED, True) == "\033[32mx\033[0m"
    assert paint("x", Source.RESAMPLED, True) == "\033[33mx\033[0m"
    assert paint("x", Source.BONUS, True) == "\033[34mx\033[0m"
    assert paint("x", Source.PLAIN, True) == "x" and paint("x", Source.BONUS, False) == "x"


def test_ctrl_c_while_a_reply_streams_stops_that_reply_only(engine):
    class Interrupted(Chat):
        def _show(self, event):
            super()._show(event)
            if event.index == 1:
                os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl+C mid-reply

    before = signal.getsignal(signal.SIGINT)
    out, err = io.StringIO(), io.StringIO()
    chat = Interrupted(engine, greedy(16), out=out, err=err)
    chat.reply("Tell me a long story.")
    assert chat.last.finish_reason == "cancelled" and chat.last.stats.tokens < 16
    assert "[stopped]" in err.getvalue()
    assert chat.messages[-1] == {"role": "assistant", "content": chat.last.text}  # kept as far as it went
    assert signal.getsignal(signal.SIGINT) is before  # the usual Ctrl+C is back for the prompt


def test_a_conversation_that_outgrows_the_context_says_reset(engine):
    err = io.StringIO()
    lines = iter(["word " * 300, "/reset", "Say hi"])

    def read_line(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    chat = Chat(engine, greedy(4), out=io.StringIO(), err=err, read_line=read_line)
    chat.run()
    said = err.getvalue()
    assert "no longer fits the context window (256 tokens): /reset" in said
    assert "new conversation" in said
    assert [m["role"] for m in chat.messages] == ["user", "assistant"]  # the long message was dropped


def test_a_reply_cut_by_the_context_window_says_reset(engine):
    room = 12  # tokens left for the reply: a copy of the paragraph needs more
    chat = Chat(engine, greedy(32), out=io.StringIO(), err=io.StringIO())
    for notes in range(1, engine.target.n_ctx):  # a long system prompt fills the window
        chat.system = "Note. " * notes
        asked = chat._conversation() + [{"role": "user", "content": COPY_PROMPT}]
        if len(engine.prompt_ids(asked)) >= engine.target.n_ctx - room:
            break
    chat.reply(COPY_PROMPT)
    assert chat.last.finish_reason == "context"
    assert "the context window (256 tokens) is full: /reset" in chat.err.getvalue()


def test_ctrl_c_at_the_prompt_exits_130():
    child = subprocess.Popen(
        [cli(), "chat", "-m", "default", "-n", "4", "--threads", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = ""
        while "/help lists the commands" not in seen:  # then it waits for a line
            line = child.stderr.readline()
            assert line, seen
            seen += line
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) == 130
        assert "cancelled" in child.stderr.read()
    finally:
        child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout, child.stderr):
            stream.close()
