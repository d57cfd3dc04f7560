"""specdeck-cli train-heads: train Medusa heads, an EAGLE or an EAGLE-3 head for a target by self-distillation.

    specdeck-cli train-heads --kind medusa --target default --data builtin --self-generate 200 \\
        --out heads/medusa-smollm2 --steps 2000
    specdeck-cli train-heads --kind eagle --target default --data builtin --out heads/eagle-smollm2
    specdeck-cli train-heads --kind eagle3 --target default --data builtin --out heads/eagle3-smollm2

--kind eagle trains one EAGLE head (engine/training/eagle.py) on the same cached
features; --kind eagle3 an EAGLE-3 head (engine/training/eagle3.py) on the inputs of
three target layers, unrolled on its own outputs (EAGLE-3's training-time test), saved
in SafeAILab's published layout. --heads and --layers are Medusa's, --draft-vocab is
EAGLE's and EAGLE-3's.

--objective features (the default) runs the target once over the data, caches its
hidden states in --out/training (at most --cache-tokens of them) and trains the
heads on the cache for as many epochs as --steps x --batch-size x --seq-len make;
--objective kl runs the target at every step and distills its full distributions
(exact, and tens of times slower per token).

Progress goes to stderr (a line every --log-every steps); the end prints a
summary, or with --json one JSON object on stdout. Ctrl+C stops after the
current step and saves a checkpoint; run the same command with --resume to
continue exactly where it stopped. A second Ctrl+C stops at once.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import sys
import threading

from engine.cli import interrupt as cli_interrupt
from engine.errors import ConfigError

KINDS = ("medusa", "eagle", "eagle3")


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    train = subparsers.add_parser(
        "train-heads", help="train Medusa, EAGLE or EAGLE-3 heads for a target (self-distillation)"
    )
    train.add_argument("--kind", choices=KINDS, default="medusa", help="medusa (default), eagle or eagle3")
    train.add_argument(
        "--target",
        default="default",
        help="'default', 'gemma3-270m' (once installed), a GGUF file, a model folder or a repo id",
    )
    train.add_argument(
        "--data",
        action="append",
        default=[],
        help="'builtin', or a .txt/.md/.jsonl file or a folder of them (repeatable)",
    )
    train.add_argument(
        "--self-generate", type=int, default=0, metavar="N", help="also train on the target's own replies to N prompts"
    )
    train.add_argument("--out", required=True, help="folder for the heads (and training/ for resuming)")
    train.add_argument("--heads", type=int, default=4, help="number of heads (default 4)")
    train.add_argument("--layers", type=int, default=1, help="residual blocks per head (default 1)")
    train.add_argument(
        "--draft-vocab",
        type=int,
        default=8192,
        metavar="N",
        help="eagle, eagle3: the N ids most frequent in the data are the ones the head proposes "
        "(0 = the whole vocabulary; default 8192)",
    )
    train.add_argument(
        "--objective",
        choices=("features", "kl"),
        default="features",
        help="features: regress the target's cached hidden states (fast, default); "
        "kl: full-vocabulary distillation, the target runs every step (slow)",
    )
    train.add_argument(
        "--cache-tokens",
        type=int,
        default=262_144,
        metavar="N",
        help="features: hidden states to cache, a random subset of the data (0 = all; default "
        "262144: ~10 min for a 135M target on 2 CPU cores)",
    )
    train.add_argument("--steps", type=int, default=2000)
    train.add_argument("--batch-size", type=int, default=8)
    train.add_argument("--seq-len", type=int, default=256)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--dtype", default="auto", help="the target's dtype: auto, float32, bfloat16, float16")
    train.add_argument("--device", default="auto", help="auto, cuda, mps or cpu")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--checkpoint-every", type=int, default=100, metavar="N")
    train.add_argument("--log-every", type=int, default=10, metavar="N", help="a progress line every N steps")
    train.add_argument("--gen-max-tokens", type=int, default=256, help="longest self-generated reply")
    train.add_argument("--gen-temperature", type=float, default=0.0, help="0 = greedy replies (default)")
    again = train.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    again.add_argument("--restart", action="store_true", help="start over, replacing the run saved in --out")
    train.add_argument("--json", action="store_true", help="print the result as one JSON object")
    train.set_defaults(func=cmd_train_heads)
    return train


def cmd_train_heads(args: argparse.Namespace) -> int:
    _check_numbers(args)  # before the heavy imports and the target's load
    from engine.training import TrainSettings, checkpoint_info, train_heads

    settings = TrainSettings.of(
        args.target,
        args.data,
        num_heads=args.heads,
        num_layers=args.layers,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        dtype=args.dtype,
        device=args.device,
        self_generate=args.self_generate,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        gen_max_tokens=args.gen_max_tokens,
        gen_temperature=args.gen_temperature,
        objective=args.objective,
        cache_tokens=args.cache_tokens,
        kind=args.kind,
        draft_vocab=args.draft_vocab,
    )
    settings.check()  # a wrong setting is said before a saved run is looked at

    saved = checkpoint_info(args.out)
    if saved is not None and not (args.resume or args.restart):
        raise ConfigError(
            f"{args.out} already holds a training run (step {saved.step} of {saved.steps}). "
            "Pass --resume to continue it, --restart to start over, or choose another --out."
        )
    cancel = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum, frame):
        if cancel.is_set():  # the second Ctrl+C: stop now (checkpoints are written atomically)
            cli_interrupt.exit_cancelled()
        cancel.set()
        print("\nstopping after this step (Ctrl+C again to stop at once)...", file=sys.stderr)

    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        signal.signal(signal.SIGINT, on_interrupt)
    try:
        result = train_heads(
            settings,
            args.out,
            resume=args.resume,
            command=command_line(args),
            progress=_printer(max(1, args.log_every)),
            cancel=cancel,
        )
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
    if args.json:
        with cli_interrupt.held():
            print(json.dumps(result.as_dict(), ensure_ascii=False), flush=True)
    else:
        print(summary(result), file=sys.stderr)
    return 130 if result.cancelled else 0


def _check_numbers(args: argparse.Namespace) -> None:
    """argparse's float() accepts inf and nan, which would train on NaN losses or sample noise."""
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ConfigError(f"--lr must be a finite positive number (1e-3 is typical), got {args.lr}.")
    if not (math.isfinite(args.gen_temperature) and args.gen_temperature >= 0):
        raise ConfigError(
            f"--gen-temperature must be 0 (greedy) or a finite positive number, got {args.gen_temperature}."
        )


def command_line(args: argparse.Namespace) -> str:
    """The command that trains these heads, as recorded with them (every setting spelled out)."""
    words = ["specdeck-cli", "train-heads", "--kind", args.kind, "--target", args.target]
    for source in args.data:
        words += ["--data", source]
    if args.self_generate:
        words += [
            "--self-generate",
            str(args.self_generate),
            "--gen-max-tokens",
            str(args.gen_max_tokens),
            "--gen-temperature",
            f"{args.gen_temperature:g}",
        ]
    words += ["--objective", args.objective]
    if args.objective == "features":
        words += ["--cache-tokens", str(args.cache_tokens)]
    words += ["--out", args.out]
    if args.kind in ("eagle", "eagle3"):
        words += ["--draft-vocab", str(args.draft_vocab)]
    else:
        words += ["--heads", str(args.heads), "--layers", str(args.layers)]
    words += [
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--seq-len",
        str(args.seq_len),
        "--lr",
        f"{args.lr:g}",
        "--dtype",
        args.dtype,
        "--device",
        args.device,
        "--seed",
        str(args.seed),
    ]
    return " ".join(shlex.quote(w) for w in words)


def _printer(every: int):
    def show(event) -> None:
        if event.phase == "train":
            if event.step % every and event.step != event.steps:
                return
            print(progress_line(event), file=sys.stderr, flush=True)
        elif event.phase == "cache" and event.tokens_per_s:
            if event.step % 160 == 0 or event.step == event.steps:  # every 10 chunks of 16 windows
                eta = _duration(event.eta_s) if event.eta_s is not None else "?"
                print(
                    f"[cache] {event.message}  {event.tokens_per_s:.0f} tokens/s  ETA {eta}",
                    file=sys.stderr,
                    flush=True,
                )
        elif event.phase == "generate":
            if event.step % every == 0 or event.step == event.steps:
                print(f"[generate] {event.message}", file=sys.stderr, flush=True)
        elif event.message:
            print(f"[{event.phase}] {event.message}", file=sys.stderr, flush=True)

    return show


def progress_line(event) -> str:
    heads = " ".join(f"{a:.2f}" for a in event.head_accuracy)
    eta = _duration(event.eta_s) if event.eta_s is not None else "?"
    return (
        f"step {event.step}/{event.steps}  loss {event.loss:.4f}  top-1 per head [{heads}]  "
        f"{event.tokens_per_s:.0f} tokens/s  {event.step_s:.2f} s/step  ETA {eta}"
    )


def summary(result) -> str:
    if result.cancelled and result.step == 0 and not result.training:
        return (
            f"cancelled before training started; the replies written so far are kept in {result.out_dir}"
            "/training (run the same command again to continue)"
        )
    if result.cancelled:
        return (
            f"cancelled at step {result.step} of {result.steps}; checkpoint in {result.out_dir} "
            "(run the same command with --resume to continue)"
        )
    lines = [f"trained {result.step} steps; heads in {result.out_dir}"]
    if result.final_loss is not None:
        lines[0] += f"; final loss {result.final_loss:.4f}"
    if result.head_accuracy:
        unit = "depth" if result.training.get("kind") in ("eagle", "eagle3") else "head"
        accuracy = ", ".join(f"{unit} {k} {a:.1%}" for k, a in enumerate(result.head_accuracy, 1))
        lines.append(f"held-out top-1 agreement with the target: {accuracy}")
    if result.tokens_per_s:
        lines.append(f"{result.tokens_per_s:.0f} tokens/s")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
