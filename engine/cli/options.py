"""Command-line options shared by `generate` and `bench`: the settings of particular drafters,
and the draft model's own load options (engine/models/load_options.py)."""

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


def add_draft_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft-device", default=None,
                        help="the draft model's device (PyTorch draft; default: the target's --device)")
    parser.add_argument("--draft-dtype", default=None,
                        help="the draft model's dtype (PyTorch draft; default: the target's --dtype; "
                             "a llama.cpp draft runs in its GGUF file's precision)")
    parser.add_argument("--draft-threads", type=int, default=None,
                        help="CPU threads of a llama.cpp draft model (default: --threads)")
    parser.add_argument("--draft-gpu-layers", type=int, default=None,
                        help="layers of a llama.cpp draft model offloaded to the GPU (default: --gpu-layers)")  # fmt: skip


def draft_model_settings(args: argparse.Namespace) -> dict:
    """EngineConfig fields from the options above."""
    return dict(draft_device=args.draft_device, draft_dtype=args.draft_dtype, draft_threads=args.draft_threads,
                draft_gpu_layers=args.draft_gpu_layers)  # fmt: skip
