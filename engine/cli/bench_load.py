"""specdeck-cli bench --concurrency: the load test (engine/bench/load_sweep.py) from the command line.

    specdeck-cli bench --concurrency 1,2,4,8,16 [--context 512,4096] [--k 4] [--memory-budget GIB]
                       [--requests N] [--max-tokens N] [--repeat R] [--json OUT] [the pair's options]

Loads the pair with parallel = the largest B (each of B sequences holds its own context
window), runs every (context, B, mode) with B requests in flight, and prints one table
per context (aggregate and per-request tokens per second, time to first token, speedup
over plain decoding and the one predicted), the break-evens and a sentence naming which
of the article's failure modes shows. --json OUT writes the LoadSweep (LoadSweep.to_dict).
With --server URL the sweep runs on a SpecDeck server's loaded pair (it reloads the pair
for the sweep and loads it back after). Every value is checked before anything loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
from pathlib import Path

from engine.cli import interrupt as cli_interrupt
from engine.errors import ConfigError

GIB = 2**30
DEFAULT_WINDOW = 4096  # the backends' own default context window


def add_load_options(bench: argparse.ArgumentParser) -> None:
    """The load test's flags on `bench`."""
    bench.add_argument(
        "--concurrency",
        default=None,
        metavar="B,B,...",
        help="instead: the load test, with this many requests in flight at once (such as 1,2,4,8,16): "
        "aggregate and per-request speed of plain, fixed-k (--k, 4 when auto) and automatic-k "
        "decoding per batch size, the predicted speedup and the break-even batch size",
    )
    bench.add_argument(
        "--context",
        default=None,
        metavar="N,N,...",
        help="with --concurrency: pad every prompt to these context lengths in tokens, one sweep "
        "each (default: the prompts as they are); lengths the context window cannot hold are left out",
    )
    bench.add_argument(
        "--memory-budget",
        type=float,
        default=None,
        metavar="GIB",
        help="with --concurrency and a draft model: the memory in GiB to count sequences in, with and "
        "without the draft's cache (default: the memory available before loading)",
    )
    bench.add_argument(
        "--requests",
        type=int,
        default=None,
        metavar="N",
        help="with --concurrency: requests per run (default: the prompts, at least twice B)",
    )


def load_settings(args: argparse.Namespace):
    """LoadSettings from the flags; a ConfigError for any bad value, before anything loads."""
    from engine.bench.load_settings import DEFAULT_FIXED_K, LoadSettings, parse_numbers

    for flag in ("--autotune", "--peers"):
        if getattr(args, flag[2:]):
            raise ConfigError(f"{flag} and --concurrency are two different runs: drop one of them.")
    batches = parse_numbers(args.concurrency, "--concurrency", "batch sizes")
    contexts = parse_numbers(args.context, "--context", "context lengths") if args.context else ()
    k = str(args.k).strip().lower()
    if k != "auto" and not k.isdigit():
        raise ConfigError(f"--k takes a draft length from 0 up, or auto, not {args.k!r}.")
    budget = args.memory_budget
    if budget is not None and not budget > 0:
        raise ConfigError(f"--memory-budget takes the GiB to count in, more than 0, not {budget}.")
    if args.requests is not None and args.requests < 1:
        raise ConfigError(f"--requests takes 1 or more requests per run, not {args.requests}.")
    settings = LoadSettings(
        batches=batches,
        contexts=contexts,
        k=DEFAULT_FIXED_K if k == "auto" else int(k),
        max_tokens=args.max_tokens,
        repeat=1 if args.repeat is None else args.repeat,
        warmup=args.warmup,
        requests=args.requests or 0,
        memory_budget_bytes=int(budget * GIB) if budget else 0,
    )
    settings.check()
    return settings


def cmd_load(args: argparse.Namespace, prompts_and_source, progress) -> int:
    """The load test here, or on --server; `prompts_and_source(args)` -> (path, prompts), `progress()`
    the bench's status line."""
    settings = load_settings(args)
    path, prompts = prompts_and_source(args)
    if args.server:
        return _on_server(args, settings, prompts, progress)
    from engine.api import Engine, load_summary
    from engine.bench.load_predict import check_fits
    from engine.bench.load_sweep import run_load_sweep
    from engine.cli.common import engine_config

    config = dataclasses.replace(engine_config(args), parallel=max(settings.batches))
    load_summary(config)  # a missing model is said before the memory check reads it
    if settings.contexts and config.n_ctx is None:
        config = dataclasses.replace(config, n_ctx=window_for(config, settings))
    if not settings.memory_budget_bytes:
        settings = dataclasses.replace(settings, memory_budget_bytes=_available())
    check_fits(config, settings)
    report = progress()

    def run(cancel: threading.Event):
        engine = Engine.load(config, progress=lambda message, fraction: report(message, 0.0))
        try:
            return run_load_sweep(engine, prompts, settings, progress=report, cancel=cancel)
        finally:
            engine.close()

    return _printed(run, args.json)


def _on_server(args, settings, prompts, progress) -> int:
    """The load test on the pair a SpecDeck server has loaded (bench.py refused the pair's flags)."""
    from engine.cli.options import server_key
    from engine.service.client import EngineClient

    client = EngineClient(args.server, api_key=server_key(args))
    pair = client.loaded()
    if pair is None:
        raise ConfigError(f"The server at {client.url} has no model loaded: load one there first.")
    print(f"load test on {client.url}: {pair.target.name} ({pair.target.backend})", file=sys.stderr, flush=True)
    report = progress()
    return _printed(lambda cancel: client.load_sweep(prompts, settings, progress=report, cancel=cancel), args.json)


def _printed(run, json_path: Path | None) -> int:
    """Print the sweep `run(cancel)` makes: Ctrl+C cancels it, and the progress line ends either way."""
    cancel = threading.Event()
    try:
        sweep = run(cancel)
    except KeyboardInterrupt:
        cancel.set()
        raise
    finally:
        if sys.stderr.isatty():
            print(file=sys.stderr)
    return print_sweep(sweep, json_path)


def print_sweep(sweep, json_path: Path | None) -> int:
    from engine.bench.load_report import format_load

    print(format_load(sweep))
    if json_path is not None:
        try:
            with cli_interrupt.held():  # Ctrl+C waits for the file to be whole
                Path(json_path).write_text(json.dumps(sweep.to_dict(), indent=2) + "\n", encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"Could not write {json_path}: {error.strerror or error}.") from error
        print(f"\nwrote {json_path}", file=sys.stderr)
    return 0


def window_for(config, settings) -> int:
    """The context window each sequence gets when -c is not given: the default (4096), or room for
    the longest --context, its reply and a last draft, as far as the model was trained for."""
    from engine.bench.load_contexts import room_needed
    from engine.errors import SpecDeckError
    from engine.models.locate import resolve
    from engine.models.metadata import read_metadata

    need = max(DEFAULT_WINDOW, room_needed(max(settings.contexts), settings.max_tokens, config.k_max))
    try:
        trained = read_metadata(resolve(config.target)).context_length
    except (SpecDeckError, OSError, ValueError, KeyError):
        trained = 0
    return min(need, trained) if trained else need


def _available() -> int:
    from engine.models.doctor import available_memory_bytes

    return available_memory_bytes() or 0
