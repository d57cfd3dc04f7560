"""specdeck-cli: generate (and compare), chat, check a pair, list models.

    specdeck-cli generate --target default --drafter ngram --prompt "..." --compare
    echo "..." | specdeck-cli generate -m default -n 64      (llama.cpp's short forms; the prompt from stdin)
    specdeck-cli chat -m default                             (cli/chat.py)
    specdeck-cli serve -m default [--port 8000]              (cli/serve.py: OpenAI's API over HTTP)
    specdeck-cli generate --server http://127.0.0.1:8000 -p "..."   (the server's model instead of a local one)
    specdeck-cli doctor --target M --draft M [--json]
    specdeck-cli models [--dir D] [--json]
    specdeck-cli models --drafters-for M [--measure] [--json]   (every drafter for M, ranked; what is left out, why)

Text streams to stdout as it is produced; statistics go to stderr, so stdout
holds exactly the reply. With --json, stdout holds one JSON object instead.
Errors print one line that says what to do, and exit with status 2. Ctrl+C exits
with status 130 and the line "cancelled", whatever is under way (see
cli/interrupt.py); the handler goes in before the package imports anything else,
and torch, transformers and llama.cpp are imported only inside the commands.
"""

from __future__ import annotations

from engine.cli import interrupt as cli_interrupt

cli_interrupt.exit_quietly_in_program()  # in place already (engine/__init__.py): before even argparse imports

import argparse  # noqa: E402 (after the handler)
import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

from engine.cli.bench import add_bench_parser  # noqa: E402
from engine.cli.chat import add_chat_parser  # noqa: E402
from engine.cli.common import (  # noqa: E402
    decode_options,
    engine_config,
    load_engine,
    model_options,
    sampling_config,
    verdict_lines,
)
from engine.cli.llama_server import add_llama_server_parser  # noqa: E402
from engine.cli.options import add_gpu_layers_option, add_server_options, refuse_pair_options, server_key  # noqa: E402
from engine.cli.serve import add_serve_parser  # noqa: E402
from engine.cli.terminal import isatty  # noqa: E402
from engine.cli.train import add_train_parser  # noqa: E402
from engine.errors import ConfigError, SpecDeckError  # noqa: E402
from engine.figures import details  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """The program (argv None), or the same commands called from Python with their arguments;
    then the caller's Ctrl+C handler comes back afterwards."""
    restore = cli_interrupt.exit_on_interrupt()  # first, before anything imports torch (a no-op if in place)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        try:
            return args.func(args)
        except SpecDeckError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # only where the handler could not be installed (another thread)
            print("\ncancelled", file=sys.stderr)
            return cli_interrupt.EXIT_CANCELLED
    finally:
        if argv is not None:  # as a program, the handler stays for the interpreter's shutdown too
            restore()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeck-cli", description="Speculative decoding on local models.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate a reply, speculatively")
    model_options(gen)
    decode_options(gen, max_tokens=256)
    source = gen.add_mutually_exclusive_group()
    source.add_argument(
        "-p",
        "--prompt",
        help="a user message (rendered with the chat template); '-' or none given with "
        "a pipe on standard input: read it from standard input",
    )
    source.add_argument(
        "--messages",
        type=Path,
        help='JSON file: [{"role": "user", "content": "..."}, ...]; roles: system, user, assistant',
    )
    gen.add_argument("--raw", action="store_true", help="feed --prompt as plain text, without the chat template")
    gen.add_argument("--compare", action="store_true", help="also run vanilla decoding and report the speedup")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    add_server_options(gen, "generate on")
    gen.set_defaults(func=cmd_generate)

    doc = sub.add_parser("doctor", help="check whether a draft/target pair can work, before loading it")
    doc.add_argument("--target", required=True)
    doc.add_argument("--draft", required=True)
    doc.add_argument("--n-ctx", type=int, default=4096)
    doc.add_argument("--device", default="auto", help="where PyTorch models will run: auto, cuda, mps or cpu")
    add_gpu_layers_option(doc)
    doc.add_argument("--json", action="store_true")
    doc.set_defaults(func=cmd_doctor)

    models = sub.add_parser("models", help="list the models found on this machine")
    models.add_argument(
        "--dir",
        action="append",
        default=[],
        help="also search this folder (repeatable; with --drafters-for, for heads too)",
    )
    models.add_argument("--json", action="store_true")
    models.add_argument(
        "--drafters-for",
        metavar="M",
        help="list every drafter that could serve the target M, ranked, and every model left out with why",
    )
    models.add_argument(
        "--measure",
        action="store_true",
        help="with --drafters-for: run each candidate for a share of about 10 s and rank by measured speed",
    )
    models.add_argument("--measure-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    models.add_argument("--n-ctx", type=int, default=4096, help="with --drafters-for: the context the pair must hold")
    models.set_defaults(func=cmd_models)
    add_bench_parser(sub)
    add_chat_parser(sub)
    add_train_parser(sub)
    add_serve_parser(sub)
    add_llama_server_parser(sub)
    return parser


def cmd_generate(args: argparse.Namespace) -> int:
    # Before torch even imports: a bad messages file or an empty pipe is said at once.
    messages = _read_messages(args.messages) if args.messages else None
    prompt_text = _read_prompt(args.prompt) if messages is None else None
    if args.server:
        return _generate_on_server(args, messages or [{"role": "user", "content": prompt_text}])
    sampling = sampling_config(args, say=not args.json)
    config = engine_config(args)
    engine = load_engine(config)
    cancel = threading.Event()
    try:
        prompt = engine.prompt_ids(messages if messages is not None else prompt_text, chat=not args.raw)
        speculative = engine.drafter is not None
        stream = None if args.json else (lambda event: _write(event.text))
        if args.compare:
            comparison = engine.compare(
                prompt,
                sampling,
                cancel=cancel,
                on_event=(lambda label, event: stream(event) if label == "speculative" else None) if stream else None,
            )
            result = comparison.speculative
        else:
            result = engine.generate(prompt, sampling, speculative=speculative, cancel=cancel, on_event=stream)
            comparison = None
    except KeyboardInterrupt:
        cancel.set()
        raise
    finally:
        engine.close()
    n_ctx = engine.target.n_ctx
    if args.json:
        with cli_interrupt.held():  # never half an object on stdout
            report = {**_json_report(result, comparison, n_ctx), "sampling": _sampling_report(sampling)}
            print(json.dumps(report, ensure_ascii=False), flush=True)
    else:
        _write("\n")
        from engine.drafters.base import DraftsTrees, has

        per_depth = has(engine.drafter, DraftsTrees)
        said = None if engine.drafter is None else _drafter_sentence(engine.drafter.stats())
        _print_summary(result, comparison, n_ctx, per_depth=per_depth, drafter=said)
    return 0


def _generate_on_server(args: argparse.Namespace, messages: list[dict]) -> int:
    """generate on a server: a SpecDeck server's loaded pair (EngineClient), or llama-server, vLLM or
    SGLang (engine/remote): the same output and statistics, as far as the server reports them."""
    defaults = build_parser().parse_args(["generate", "-p", "-"])
    refuse_pair_options(args, defaults, "the server's loaded pair is used", extra=("model_sampling",), subject="model")
    if args.raw:
        raise ConfigError(
            "--raw feeds text without the chat template, which a server's generate does not offer: "
            "drop --raw, or run without --server."
        )
    sampling = sampling_config(args, say=False)
    engine, n_ctx, described, per_depth = _server_engine(args)
    if not args.json:
        print(f"generating on {described}", file=sys.stderr, flush=True)
    cancel = threading.Event()

    def on_steps(steps) -> None:
        if not args.json:  # as local generate: the reply streams; with --compare, the speculative run's
            _write("".join(step.text for step in steps if step.run == "speculative" or not args.compare))

    try:
        if args.compare:
            comparison = engine.compare(messages, sampling, cancel=cancel, on_steps=on_steps)
            result = comparison.speculative
        else:
            result, comparison = engine.generate(messages, sampling, cancel=cancel, on_steps=on_steps), None
    except KeyboardInterrupt:
        cancel.set()
        raise
    finally:
        engine.close()  # what a remote adapter started (llama-server's vanilla twin)
    if args.json:
        with cli_interrupt.held():
            report = {**_json_report(result, comparison, n_ctx), "sampling": _sampling_report(sampling)}
            print(json.dumps(report, ensure_ascii=False), flush=True)
    else:
        _write("\n")
        _print_summary(result, comparison, n_ctx, per_depth=per_depth)
    return 0


def _server_engine(args: argparse.Namespace):
    """(engine, n_ctx, a description, per_depth) for --server: an EngineClient for a SpecDeck server,
    else the remote adapter of --server-kind (detected by default)."""
    from engine.remote import detect_kind, open_remote

    key = server_key(args)
    kind = args.server_kind if args.server_kind != "auto" else detect_kind(args.server, key)
    if kind != "specdeck":
        remote = open_remote(kind, args.server, key, vanilla_url=args.vanilla_server)
        pair = remote.connect()
        return remote, pair.n_ctx or 0, pair.describe(), False
    if args.vanilla_server:
        raise ConfigError(
            "--vanilla-server is for llama-server, vLLM and SGLang: a SpecDeck server runs the "
            "vanilla side of --compare itself. Drop --vanilla-server."
        )
    from engine.service.client import EngineClient

    client = EngineClient(args.server, api_key=key)
    pair = client.loaded()
    if pair is None:
        raise ConfigError(f"The server at {client.url} has no model loaded: load one there first.")
    described = f"{client.url}: {pair.target.name} ({pair.target.backend}), drafter {pair.config.drafter}"
    from engine.drafters.registry import node_budget

    # the summary adds the acceptance per depth for trees, as a local run's does (DraftsTrees)
    return client, pair.n_ctx, described, node_budget(pair.config.drafter, pair.target.backend)


def _read_prompt(prompt: str | None) -> str:
    """--prompt's text; '-', or no --prompt with a pipe or a file on standard input, reads standard input."""
    if prompt is not None and prompt != "-":
        return prompt
    if prompt is None and isatty(sys.stdin):
        raise ConfigError(
            "No prompt: give --prompt TEXT or --messages FILE, or pipe the prompt in "
            '(echo "..." | specdeck-cli generate).'
        )
    if sys.stdin is None:
        raise ConfigError("--prompt - reads standard input, but this process has none.")
    text = sys.stdin.read().strip()
    if not text:
        raise ConfigError("The prompt read from standard input is empty.")
    return text


def _read_messages(path: Path) -> list[dict]:
    """The messages of a --messages file, checked before any model loads (that takes seconds)."""
    from engine.core.text import check_messages

    try:
        messages = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"No messages file at {path}.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path} is not a JSON messages file ({error}).") from error
    if isinstance(messages, dict) and "messages" in messages:
        messages = messages["messages"]
    return check_messages(messages, source=str(path))


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _notes(result, n_ctx: int) -> list[str]:
    """The run's notes, and why it stopped when that was the context window (either mode)."""
    notes = list(result.stats.notes)
    if result.finish_reason == "context":
        notes.append(
            f"the reply was cut: the context window ({n_ctx} tokens for the prompt and the reply) is full. "
            "Load the model with a larger --n-ctx, or shorten the prompt."
        )
    return notes


def _run_stats(result, n_ctx: int) -> dict:
    s = result.stats
    keys = (
        "steps",
        "drafted",
        "accepted",
        "acceptance_rate",
        "draft_acceptance_rate",
        "mean_acceptance_length",
        "tokens_per_step",
        "tokens_per_s",
        "wall_s",
    )
    stats = {key: s.as_dict()[key] for key in keys}
    stats.update(finish_reason=result.finish_reason, predicted_speedup=round(s.predicted_speedup, 4))
    # Per depth d (a chain's position d, Medusa's head d): how often it was reached and accepted.
    stats.update(
        depth_tested=list(s.depth_tested),
        depth_accepted=list(s.depth_accepted),
        head_acceptance=[round(a, 4) for a in s.depth_acceptance],
        notes=_notes(result, n_ctx),
    )
    return stats


def _sampling_report(sampling) -> dict:
    """What the run sampled with (after --model-sampling filled in what was not given)."""
    return {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "seed": sampling.seed,
    }


def _json_report(result, comparison, n_ctx: int) -> dict:
    report = {"text": result.text, "tokens": list(result.tokens), "stats": _run_stats(result, n_ctx)}
    if comparison is not None:
        vanilla = comparison.vanilla
        report["vanilla"] = {"text": vanilla.text, "tokens": list(vanilla.tokens), "stats": _run_stats(vanilla, n_ctx)}
        report["speedup"] = round(comparison.speedup, 4)
        report["identical"] = comparison.identical
        if comparison.divergence is not None:
            report["first_divergence"] = comparison.divergence.as_dict()
    return report


def _print_summary(result, comparison, n_ctx: int, per_depth: bool = False, drafter: str | None = None) -> None:
    print("\n".join(_summary_lines(result, comparison, n_ctx, per_depth, drafter)), file=sys.stderr)


def _drafter_sentence(stats) -> str | None:
    """What the drafter's statistics say in words, where its type says anything (a chain: who drafted)."""
    describe = getattr(type(stats), "describe", None)
    return describe(stats.as_dict()) if describe is not None else None


def _summary_lines(result, comparison, n_ctx: int, per_depth: bool = False, drafter: str | None = None) -> list[str]:
    """The run's statistics in sentences, and with a comparison the speedup and the verdict."""
    s = result.stats
    lines = [  # the figures by engine/figures.py's names, in its order
        f"{s.tokens} tokens in {s.wall_s:.2f} s ({s.tokens_per_s:.1f} tok/s), {s.steps} steps (target forwards)",
        details(s),
    ]
    if per_depth and s.depth_tested:
        lines.append(
            "acceptance per head: "
            + ", ".join(
                f"{d}: {a:.0%} of {t}" for d, (a, t) in enumerate(zip(s.depth_acceptance, s.depth_tested), start=1)
            )
        )
    if drafter:
        lines.append(f"drafters: {drafter}")
    notes = _notes(result, n_ctx)
    lines.extend(f"note: {note}" for note in notes)
    if comparison is not None:
        lines.extend(f"note (vanilla): {note}" for note in _notes(comparison.vanilla, n_ctx) if note not in notes)
        lines.extend(verdict_lines(comparison))
    return lines


def cmd_doctor(args: argparse.Namespace) -> int:
    from engine.backends.gpu_layers import parse_gpu_layers
    from engine.models.doctor import check_pair
    from engine.models.locate import resolve
    from engine.models.placement import model_placement

    parse_gpu_layers(args.gpu_layers)  # a bad value is said, not checked as if it were 0
    target, draft = resolve(args.target), resolve(args.draft)
    target_on, draft_on = (model_placement(ref, "auto", args.device, args.gpu_layers) for ref in (target, draft))
    report = check_pair(target, draft, n_ctx=args.n_ctx, target_on=target_on, draft_on=draft_on)
    print(json.dumps(report.as_dict(), indent=2) if args.json else str(report))
    return 0 if report.compatible else 1


def cmd_models(args: argparse.Namespace) -> int:
    from engine.models.locate import list_models

    if args.drafters_for:
        return _drafters_for(args)
    if args.measure:
        raise ConfigError("--measure ranks the drafters of --drafters-for M: add --drafters-for and a target.")
    refs = list_models(extra_dirs=tuple(args.dir))
    if args.json:
        print(json.dumps([ref.__dict__ for ref in refs], indent=2, default=str))
    else:
        for ref in refs:
            kind = f"{ref.kind} {ref.quant}".strip()  # "gguf Q4_K_M"; a HF folder has no quantization type
            print(f"{ref.name:40s} {kind:12s} {ref.source:15s} {ref.size_bytes / 2**20:9.1f} MiB  {ref.path}")
    return 0


def _drafters_for(args: argparse.Namespace) -> int:
    """`models --drafters-for M`: engine/models/discovery.py's list, measured with --measure."""
    from engine.models.discovery import discover
    from engine.models.placement import model_placement

    dirs = tuple(args.dir)  # where each model will sit, as `doctor` judges memory: a GPU's for what goes there
    found = discover(args.drafters_for, extra_dirs=dirs, heads_dirs=dirs, n_ctx=args.n_ctx, place=model_placement)
    if args.measure:
        from engine.bench.discovery_measure import measure

        say = None if args.json else (lambda message, fraction: print(message, file=sys.stderr, flush=True))
        found = measure(found, args.measure_seconds, progress=say)
    print(json.dumps(found.to_dict(), indent=2) if args.json else str(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
