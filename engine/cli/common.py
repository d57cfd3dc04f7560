"""What several commands share: the model, draft-length and sampling options, the config and the
loading line they make of them, and the verdict of a comparison.

`generate` (main.py), `chat` (chat.py) and `serve` (serve.py) take the same options and load the
same way; they used to borrow main.py's private helpers, imported inside functions since main.py
imports the others. Here they are below all three, and main.py, the top of the command line,
imports every command.
"""

from __future__ import annotations

import argparse
import sys
import time

from engine.cli.options import add_drafter_options, add_load_options, drafter_choice
from engine.cli.terminal import isatty
from engine.figures import DECODE_SPEEDUP


def model_options(parser: argparse.ArgumentParser) -> None:
    """The model and load options of generate, chat and serve; the short forms are llama.cpp's (-m, -md,
    -ngl, ...). The drafter and its options come from the drafter registry (cli/options.py)."""
    parser.add_argument(
        "-m",
        "--target",
        default="default",
        help="'default', 'gemma3-270m' (once installed), a GGUF file, a model folder or a repo id",
    )
    add_drafter_options(parser)
    add_load_options(parser)


def decode_options(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    """Draft length and sampling, for generate and chat."""
    draft_length_options(parser)
    parser.add_argument("--temperature", "--temp", type=float, default=None, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=None, help="0 = off (default)")
    parser.add_argument("--top-p", type=float, default=None, help="1 = off (default)")
    parser.add_argument(
        "--min-p",
        type=float,
        default=None,
        help="0 = off (default); keep tokens at least this fraction as likely as the best one",
    )
    parser.add_argument(
        "--model-sampling",
        action="store_true",
        help="for the sampling options not given, use what the model's files recommend "
        "(GGUF general.sampling.*, generation_config.json)",
    )
    parser.add_argument("-s", "--seed", type=int, default=0)
    parser.add_argument("-n", "--max-tokens", type=int, default=max_tokens, help=f"default {max_tokens}")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def draft_length_options(parser: argparse.ArgumentParser) -> None:
    """Draft length, for generate, chat and serve."""
    parser.add_argument(
        "--k", "--draft-max", dest="k", default="auto", help="draft length: a number from 0 to 32, or auto (default)"
    )
    parser.add_argument("--k-max", type=int, default=16, help="longest draft automatic k may choose")


def sampling_config(args: argparse.Namespace, say: bool = True):
    """SamplingConfig from the options above; with --model-sampling, says on stderr what the model recommends."""
    from engine.core.sampling import SamplingConfig

    given = {name: getattr(args, name) for name in ("temperature", "top_k", "top_p", "min_p")}
    chosen = {name: value for name, value in given.items() if value is not None}
    if args.model_sampling:
        from engine.models.recommended import describe, recommended_sampling

        recommended = recommended_sampling(args.target)
        chosen = {**recommended, **chosen}
        if say:
            said = describe(recommended) if recommended else "nothing, so the defaults apply (greedy)"
            print(f"the model recommends {said}", file=sys.stderr)
    # Temperature, top-k, top-p, then min-p, on p and on q alike (engine/core/sampling.py).
    return SamplingConfig(**chosen, seed=args.seed, max_tokens=args.max_tokens, stop=tuple(args.stop))


def engine_config(args: argparse.Namespace):
    from engine.config import EngineConfig

    drafter, options = drafter_choice(args)
    return EngineConfig(
        target=args.target,
        drafter=drafter,
        options=options,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        n_ctx=args.n_ctx,
        threads=args.threads,
        gpu_layers=args.gpu_layers,
        k=args.k,
        k_max=args.k_max,
        compile=args.compile,
    )


def load_engine(config):
    """Engine.load with one line on stderr, "loading NAME (BACKEND)… 0.8 s" (and the forward, where the
    backend has several: ", native forward, eager"): stdout stays the reply's."""
    from engine.api import Engine, load_summary

    summary = load_summary(config)  # a missing model is said alone, before any loading line
    started = time.perf_counter()
    # On a terminal the line shows while loading, and an error or Ctrl+C replaces it; in a pipe or
    # a log it is written once loaded, so an error (or "cancelled") stays the only line.
    live = isatty(sys.stderr)
    if live:
        print(f"loading {summary}…", end="", file=sys.stderr, flush=True)
    try:
        engine = Engine.load(config)
    except BaseException:
        if live:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
        raise
    took = f"{time.perf_counter() - started:.1f} s"
    if engine.target.info.forward:  # which forward runs (PyTorch: eager, or static shapes; on CUDA, graphs opt-in)
        took += f", {engine.target.info.forward}"
    print(f" {took}" if live else f"loading {summary}… {took}", file=sys.stderr, flush=True)
    for line in engine.placement:  # where the layers went (llama.cpp's GPU layers, PyTorch on MPS)
        print(line, file=sys.stderr, flush=True)
    return engine


def verdict_lines(comparison) -> list[str]:
    """Vanilla's speed, the speedup, whether the outputs are identical, and where they first differ."""
    v = comparison.vanilla.stats
    lines = [
        f"vanilla: {v.tokens} tokens at {v.tokens_per_s:.1f} tok/s -> {DECODE_SPEEDUP.name} {comparison.speedup:.2f}x; "
        + ("outputs identical" if comparison.identical else "outputs differ")
    ]
    d = comparison.divergence
    if d is not None:
        verdict = "explained" if d.explained else "NOT explained (a bug: please report it)"
        lines.append(
            f"first difference at token {d.index}: speculative {d.speculative_token}, "
            f"vanilla {d.vanilla_token}; {verdict}: {d.reason}"
        )
    return lines
