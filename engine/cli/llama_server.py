"""specdeck-cli llama-server: find or build the llama-server binary the benchmark's peers use.

specdeck-cli llama-server path      the binary that would be used, or exit 1 with what to do
specdeck-cli llama-server build     build llama.cpp's server once into the cache (10-30 minutes)
"""

from __future__ import annotations

import argparse
import sys


def add_llama_server_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "llama-server", help="find, or build once, the llama-server binary for bench --peers"
    )
    parser.add_argument("action", choices=("path", "build"))
    parser.add_argument("-j", "--jobs", type=int, default=None, help="compile jobs (default: every core)")
    parser.set_defaults(func=cmd_llama_server)
    return parser


def cmd_llama_server(args: argparse.Namespace) -> int:
    from engine.remote.llama_server_binary import build_llama_server, cache_dir, find_llama_server

    if args.action == "path":
        binary = find_llama_server()
        if binary is None:
            print(
                f"no llama-server found ($SPECDECK_LLAMA_SERVER, $PATH, {cache_dir()}): "
                "`specdeck-cli llama-server build` builds one.",
                file=sys.stderr,
            )
            return 1
        print(binary)
        return 0
    print(build_llama_server(jobs=args.jobs, progress=lambda line: print(line, file=sys.stderr, flush=True)))
    return 0
