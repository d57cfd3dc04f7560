"""specdeck-cli bench: vanilla against speculative decoding over a prompt set.

    specdeck-cli bench --prompts FILE.jsonl --target M [--draft M | --drafter ngram] [--backend ...]
                       [--dtype ...] [--k N|auto] [--max-tokens N] [--repeat R] [--warmup N]
                       [--kinds reuse,open,multi-turn] [--threads N] [--peers] [--json OUT] [--autotune]
    specdeck-cli bench --server URL [--api-key KEY] [--prompts ...] [--max-tokens N] [--repeat R] ...
    specdeck-cli bench --concurrency 1,2,4,8,16 [--context 512,4096] [--k 4] [--memory-budget GIB] ...

Progress goes to stderr, the report (tables, the bandwidth floor, memory,
peers) to stdout, and with --json OUT everything measured to the file OUT.
`--peers` runs the systems matching the target's backend in this process on the
same model file: llama-cpp-python's chat completion and its prompt lookup for
llama.cpp; transformers' generate, with prompt lookup and with the draft model
as assistant for torch. `--autotune` measures instead every drafter the target
allows with a few k (engine/bench/autotune.py) and prints them ranked.
`--server URL` measures instead the pair a SpecDeck server (specdeck-cli serve)
has loaded, on that machine, with the same prompts, settings and output; the
pair's options (--target, --drafter, --k...) are then the server's, not flags.
`--concurrency` runs the load test instead (engine/cli/bench_load.py): the same prompts with
B requests in flight at once, per batch size B.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from engine.cli import interrupt as cli_interrupt
from engine.cli.bench_load import add_load_options as add_concurrency_options
from engine.cli.common import engine_config
from engine.cli.options import (
    add_drafter_options,
    add_load_options,
    add_server_options,
    refuse_pair_options,
    server_key,
)


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    bench = subparsers.add_parser("bench", help="benchmark vanilla against speculative decoding on a prompt set")
    bench.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help='JSONL file, one {"id", "kind", "messages"[, "follow_ups"]} per line (default: the shipped set)',
    )
    bench.add_argument(
        "--kinds",
        default=None,
        help="only these kinds of prompt, comma-separated: the shipped set has reuse, open and "
        "multi-turn (conversations, run turn by turn)",
    )
    bench.add_argument(
        "-m",
        "--target",
        default="default",
        help="'default', 'gemma3-270m' (once installed), a GGUF file, a model folder or a repo id",
    )
    add_drafter_options(bench)
    add_load_options(bench, threads="CPU threads (llama.cpp and its peers)")
    bench.add_argument(
        "--k", "--draft-max", dest="k", default="auto", help="draft length: a number from 1 to 32, or auto (default)"
    )
    bench.add_argument("--k-max", type=int, default=16, help="longest draft automatic k may choose")
    bench.add_argument("-n", "--max-tokens", type=int, default=128, help="tokens per reply (default 128)")
    bench.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="measured runs of each prompt and mode (default 3; 1 with --concurrency)",
    )
    bench.add_argument("--warmup", type=int, default=1, help="warm-up runs per mode before measuring (default 1)")
    bench.add_argument(
        "--peers",
        action="store_true",
        help="also run, on the same model file, what the target's backend offers: llama-cpp-python's "
        "chat completion and prompt lookup (llama.cpp); transformers' generate, prompt lookup "
        "and assistant model (torch); and llama-server plain, with each n-gram type and with "
        "the draft model, where a llama-server binary is found (llama.cpp)",
    )
    bench.add_argument(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="the llama-server binary for --peers (default: $SPECDECK_LLAMA_SERVER, $PATH, or the "
        "one `specdeck-cli llama-server build` made)",
    )
    bench.add_argument("--json", type=Path, default=None, metavar="OUT", help="write everything measured to OUT")
    bench.add_argument(
        "--autotune",
        action="store_true",
        help="instead: try every drafter the target allows with a few k, once each (--max-tokens 48 for "
        "a quick run), and print them ranked by speedup over plain decoding",
    )
    add_concurrency_options(bench)
    add_server_options(bench, "benchmark on")
    bench.set_defaults(func=cmd_bench)
    return bench


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.bench import run_benchmark
    from engine.errors import ConfigError

    if args.concurrency is not None:
        from engine.cli.bench_load import cmd_load

        if args.server:
            _refuse_pair_flags(args, "the load test runs on the server's loaded pair", keep=("k",))
        return cmd_load(args, _prompts, _progress)
    for name in ("context", "memory_budget", "requests"):
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} is an option of the load test: add --concurrency B,B,... or drop {flag}.")
    if args.server:
        return _bench_on_server(args)
    if not args.autotune and (str(args.k) == "0" or (args.drafter == "none" and not args.draft)):
        raise ConfigError(
            "The benchmark compares plain and speculative decoding: choose a drafter "
            "(--drafter ngram or --draft MODEL) and a draft length from 1 up, or --k auto."
        )
    path, prompts, settings = _prompts_and_settings(args)
    config = engine_config(args)
    if args.autotune:
        return _autotune(config, prompts, args.max_tokens)
    cancel = threading.Event()
    try:
        report = run_benchmark(config, prompts, settings, progress=_progress(), cancel=cancel, prompts_source=str(path))
    except KeyboardInterrupt:
        cancel.set()
        raise
    finally:
        if sys.stderr.isatty():
            print(file=sys.stderr)  # end the progress line
    return _print_report(report, args.json)


def _prompts(args: argparse.Namespace):
    """(the prompts file, its prompts of --kinds)."""
    from engine.bench import default_prompts_path, load_prompts

    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip()) if args.kinds else None
    path = args.prompts or default_prompts_path()
    return path, load_prompts(path, kinds)


def _prompts_and_settings(args: argparse.Namespace):
    from engine.bench import BenchSettings

    if args.server and args.llama_server:
        from engine.errors import ConfigError

        raise ConfigError(
            "--llama-server names a program on this machine; a server runs its own (its operator's "
            "`serve --llama-server`), never a client's: drop --llama-server, or run without --server."
        )
    if args.peers and not args.server:
        _say_llama_server(args.llama_server)
    path, prompts = _prompts(args)
    settings = BenchSettings(
        max_tokens=args.max_tokens,
        repeat=3 if args.repeat is None else args.repeat,
        warmup=args.warmup,
        peers=args.peers,
        llama_server=args.llama_server,
    )
    return path, prompts, settings


def _say_llama_server(explicit: str | None) -> None:
    """Before anything loads: a --llama-server that is not there is an error; none found, a note."""
    from engine.remote.llama_server_binary import find_llama_server

    binary = find_llama_server(explicit)
    if binary is None:
        print(
            "note: no llama-server binary found ($SPECDECK_LLAMA_SERVER, $PATH, the cache): its peers are left "
            "out. `specdeck-cli llama-server build` builds one (10-30 minutes), or give --llama-server PATH.",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(f"llama-server peers: {binary}", file=sys.stderr, flush=True)


def _print_report(report, json_path: Path | None) -> int:
    """The tables on stdout, and with --json everything measured in that file."""
    from engine.bench import format_text, write_json
    from engine.errors import ConfigError

    print(format_text(report))
    if json_path is not None:
        try:
            with cli_interrupt.held():  # Ctrl+C waits for the file to be whole
                write_json(report, json_path)
        except OSError as error:
            raise ConfigError(f"Could not write {json_path}: {error.strerror or error}.") from error
        print(f"\nwrote {json_path}", file=sys.stderr)
    return 0


def _autotune(config, prompts, max_tokens: int, client=None) -> int:
    """Auto-tune here, or with `client` (an EngineClient) on its server."""
    from engine.bench import AutotuneSettings, format_autotune, run_autotune

    tune = run_autotune if client is None else client.autotune
    try:
        result = tune(config, prompts, AutotuneSettings(max_tokens=max_tokens), progress=_progress())
    finally:
        if sys.stderr.isatty():
            print(file=sys.stderr)
    print(format_autotune(result))
    return 0


def _bench_on_server(args: argparse.Namespace) -> int:
    """The benchmark (or auto-tune) of the pair the server has loaded, through EngineClient: the server
    keeps its pair, and the output is local bench's."""
    from engine.errors import ConfigError
    from engine.remote import detect_kind
    from engine.service.client import EngineClient

    _refuse_pair_flags(args, "the server's loaded pair is benchmarked")
    path, prompts, settings = _prompts_and_settings(args)
    key = server_key(args)
    kind = args.server_kind if args.server_kind != "auto" else detect_kind(args.server, key)
    if kind != "specdeck":
        return _bench_remote(args, kind, key, path, prompts, settings)
    client = EngineClient(args.server, api_key=key)
    pair = client.loaded()
    if pair is None:
        raise ConfigError(f"The server at {client.url} has no model loaded: load one there first.")
    print(
        f"benchmarking on {client.url}: {pair.target.name} ({pair.target.backend}), drafter {pair.config.drafter}",
        file=sys.stderr,
        flush=True,
    )
    if args.autotune:
        return _autotune(pair.config, prompts, args.max_tokens, client)
    cancel = threading.Event()
    try:
        report = client.bench(
            pair.config, prompts, settings, prompts_source=str(path), progress=_progress(), cancel=cancel
        )
    except KeyboardInterrupt:
        cancel.set()  # the server stops at its next step (and when the connection closes)
        raise
    finally:
        if sys.stderr.isatty():
            print(file=sys.stderr)
    return _print_report(report, args.json)


def _refuse_pair_flags(args: argparse.Namespace, what: str, keep: tuple[str, ...] = ()) -> None:
    """With --server: a ConfigError for a flag about the pair loaded here (`keep`: flags that mean
    something else in this run, such as the load test's --k, its fixed-k mode)."""
    defaults = add_bench_parser(argparse.ArgumentParser().add_subparsers()).parse_args([])
    asked = argparse.Namespace(**{**vars(args), **{name: getattr(defaults, name) for name in keep}})
    refuse_pair_options(asked, defaults, what)


def _bench_remote(args, kind: str, key: str | None, path, prompts, settings) -> int:
    """The benchmark on llama-server, vLLM or SGLang, through its remote adapter."""
    from engine.bench.remote import run_remote_benchmark
    from engine.errors import ConfigError
    from engine.remote import open_remote

    if args.autotune or args.peers:
        raise ConfigError(
            f"--{'autotune' if args.autotune else 'peers'} needs a SpecDeck engine (here or at --server); "
            f"a {kind} server benchmarks only as it was started."
        )
    remote = open_remote(kind, args.server, key, vanilla_url=args.vanilla_server)
    pair = remote.connect()
    print(f"benchmarking on {pair.describe()}", file=sys.stderr, flush=True)
    cancel = threading.Event()
    try:
        report = run_remote_benchmark(
            remote, prompts, settings, prompts_source=str(path), progress=_progress(), cancel=cancel
        )
    except KeyboardInterrupt:
        cancel.set()
        raise
    finally:
        remote.close()
        if sys.stderr.isatty():
            print(file=sys.stderr)
    return _print_report(report, args.json)


def _progress():
    """One status line on stderr, rewritten in place on a terminal, one line per step otherwise."""
    tty = sys.stderr.isatty()
    last = [""]

    def report(message: str, fraction: float) -> None:
        if message == last[0]:
            return
        last[0] = message
        line = f"[{fraction:4.0%}] {message}"
        if tty:
            sys.stderr.write("\r\033[K" + line[:120])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return report
