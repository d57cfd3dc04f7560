"""specdeck-cli serve: the engine as an HTTP server (OpenAI's API, SpecDeck's own routes, /metrics).

    specdeck-cli serve -m default [--drafter ngram | -md M] [--host 127.0.0.1] [--port 8000]
                       [--api-key KEY] [--parallel 1] [--queue 8]

The engine options are generate's (the model, the drafter and its options, the
load options, k). The model loads first, with its line on stderr; then one line
on stdout says where the server listens, and it serves until Ctrl+C. `--port 0`
takes any free port (the line says which). Anywhere but loopback it serves only
with an API key (--api-key, or $SPECDECK_API_KEY), since anyone who reaches the
port could use the machine's models; with a key, every route but /health wants
`Authorization: Bearer KEY`. `--parallel N` generations run at once (llama-server's
-np: continuous batching, engine/service/batch_loop.py; default 1, one at a time);
`--queue` more requests may wait for a turn, and past that a request gets 503. An N
the drafter cannot batch, or whose N caches would not fit in memory, is refused
before the model loads, with the largest N that fits (engine/service/capacity.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from engine.cli.common import draft_length_options, engine_config, load_engine, model_options
from engine.cli.options import ENV_KEY  # noqa: E402 (one name for the key everywhere)
from engine.service.limits import Limits


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    serve = subparsers.add_parser("serve", help="serve the engine over HTTP (OpenAI's API, /metrics)")
    model_options(serve)
    draft_length_options(serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; anything else needs --api-key)"
    )
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    serve.add_argument(
        "--api-key",
        default=None,
        help=f"the key clients send as 'Authorization: Bearer KEY' (default: ${ENV_KEY}, else none)",
    )
    serve.add_argument(
        "-np",
        "--parallel",
        type=_parallel,
        default=1,
        metavar="N",
        help="generations decoded together, each with its own context of -c tokens (default 1: one at a time; "
        "llama-server's -np)",
    )
    serve.add_argument(
        "--queue",
        type=int,
        default=8,
        help="requests that may wait while --parallel others generate (default 8); more get 503",
    )
    limits = serve.add_argument_group("limits on clients (see README, 'What the server promises')")
    limits.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer to besides the --host address and loopback names (repeatable; "
        "'*': any, for a server behind a proxy that names it)",
    )
    limits.add_argument(
        "--max-body-mb",
        type=float,
        default=Limits.max_body_bytes / 2**20,
        help=f"the largest request body, in MB (default {Limits.max_body_bytes / 2**20:g})",
    )
    limits.add_argument(
        "--max-messages",
        type=int,
        default=Limits.max_messages,
        help=f"the most messages in one chat request (default {Limits.max_messages})",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=Limits.max_connections,
        help=f"connections open at once (default {Limits.max_connections}; lowered to fit the open-file limit)",
    )
    limits.add_argument(
        "--header-timeout",
        type=float,
        default=Limits.header_timeout_s,
        metavar="SECONDS",
        help=f"how long a connection may take to send a request's headers (default "
        f"{Limits.header_timeout_s:g} s); then it is closed",
    )
    limits.add_argument(
        "--timeout",
        type=float,
        default=Limits.generation_timeout_s,
        metavar="SECONDS",
        help=f"the longest one generation may run (default {Limits.generation_timeout_s:g} s)",
    )
    files = serve.add_argument_group("what a client may name on this machine (engine/service/paths.py)")
    files.add_argument(
        "--models-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder whose models clients may load besides the served ones, 'default' and "
        "cached models by name (repeatable; $SPECDECK_MODEL_DIRS too)",
    )
    files.add_argument(
        "--train-dir",
        default=None,
        metavar="DIR",
        help="where training runs are saved, one folder per run name (default: "
        "~/.cache/specdeck/serve/train, under $SPECDECK_CACHE)",
    )
    files.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="the folder training data is read from, by relative path (default: none, only 'builtin')",
    )
    files.add_argument(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="the llama-server binary for benchmark peers (default: $SPECDECK_LLAMA_SERVER, $PATH, or "
        "the one `specdeck-cli llama-server build` made); never a client's",
    )
    serve.set_defaults(func=cmd_serve)
    return serve


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.errors import ConfigError
    from engine.service import run
    from engine.service.capacity import check_parallel
    from engine.service.host import EngineThread, Host
    from engine.service.server import check_key

    api_key = args.api_key or os.environ.get(ENV_KEY) or None
    if args.queue < 0:
        raise ConfigError(f"--queue is the number of requests that may wait, 0 or more; got {args.queue}.")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be from 0 (any free port) to 65535, got {args.port}.")
    run.check_bind(args.host, api_key)  # before the load: a refusal should not take the load's time
    if api_key:
        check_key(api_key)
    limits = _limits(args)
    config = dataclasses.replace(engine_config(args), parallel=args.parallel)
    check_parallel(config)  # a drafter that cannot batch, or caches that cannot fit: said before the load
    paths = _server_paths(args, config)  # a missing folder or binary is said before the load too
    sock = run.bind(args.host, args.port)  # a port in use is said before the load too
    thread = EngineThread()  # loaded where it will decode: one OpenMP pool (EngineThread)
    try:
        engine = thread.call(lambda: load_engine(config))
    except BaseException:
        sock.close()
        raise
    port = sock.getsockname()[1]
    where = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{where}:{port}"
    key = " (API key required)" if api_key else ""
    print(
        f"serving {engine.target.info.name} at {url}{key}: OpenAI's API at {url}/v1, metrics at {url}/metrics; "
        "Ctrl+C stops",
        flush=True,
    )
    sys.stderr.flush()
    run.serve(
        Host(engine, queue_limit=args.queue, thread=thread),
        address=args.host,
        port=port,
        api_key=api_key,
        announce=False,
        sock=sock,
        limits=limits,
        host_names=tuple(args.allowed_host),
        paths=paths,
    )
    return 0


def _parallel(text: str) -> int | str:
    """--parallel's value: the number it spells, else the text as typed, which the check refuses in
    its own words (engine/batching.py check_batchable)."""
    word = text.strip()
    return int(word) if word.lstrip("+-").isdigit() else word


def _server_paths(args: argparse.Namespace, config):
    from engine.service.paths import ServerPaths

    return ServerPaths.served(
        config,
        train_dir=args.train_dir,
        data_dir=args.data_dir,
        models_dirs=args.models_dir,
        llama_server=args.llama_server,
    )


def _limits(args: argparse.Namespace) -> Limits:
    from engine.errors import ConfigError

    try:
        return Limits(
            max_body_bytes=int(args.max_body_mb * 2**20),
            max_messages=args.max_messages,
            max_connections=args.max_connections,
            header_timeout_s=args.header_timeout,
            generation_timeout_s=args.timeout,
        )
    except ValueError as error:
        raise ConfigError(f"Bad limit: {error}.") from None
