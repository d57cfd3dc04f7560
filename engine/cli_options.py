"""Command-line options shared by `generate` and `bench`: the settings of particular drafters."""

from __future__ import annotations

import argparse


def add_drafter_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree-depth", type=int, default=None, help="eagle: deepest level of the draft tree")
    parser.add_argument("--window", default="auto", help="lookahead: Jacobi window W (default auto)")
    parser.add_argument("--ngram", default="auto", help="lookahead: n-gram size N (default auto)")
    parser.add_argument("--candidates", default="auto", help="lookahead: n-grams verified per step G (default auto)")
    parser.add_argument("--exit-layer", default="auto", help="early-exit: draft with the first L layers (default auto)")


def drafter_settings(args: argparse.Namespace) -> dict:
    """EngineConfig fields from the options above."""
    return dict(tree_depth=args.tree_depth, lookahead=(args.window, args.ngram, args.candidates),
                exit_layer=args.exit_layer)  # fmt: skip
