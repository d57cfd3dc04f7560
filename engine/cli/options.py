"""The drafter and load options of `generate`, `chat` and `bench`; the drafter's come from the registry.

`--drafter` offers every registered drafter, and every drafter option becomes a flag
(its `setting`'s `cli` flags, else --<name-with-dashes>) with its default and help, so
a new drafter module adds its flags here without an edit. A flag several drafters share
(--heads: Medusa's heads, EAGLE's head) is one argument. Two rules stay as users know them:
--draft (-md) implies --drafter model, and --heads implies --drafter medusa when no drafter is
named. With neither, the drafter is the one measured fastest on the backend the target runs on
(engine/config.py default_drafter_for: suffix decoding on PyTorch, n-gram lookup on llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import typing

from engine.config import COMPILES, default_drafter_for
from engine.drafters.chain_spec import member_names
from engine.drafters.registry import AUTO, Setting, all_drafters, option_settings
from engine.errors import ConfigError


def add_drafter_options(parser: argparse.ArgumentParser) -> None:
    names = [spec.name for spec in all_drafters()]
    defaults = " and ".join(f"{spec.name} on {backend}" for spec in all_drafters() for backend in spec.default_on)
    parser.add_argument(
        "--drafter",
        type=_drafter_arg,
        default=None,
        metavar="NAME",
        help=f"the drafter: {', '.join(names)}, or a chain of them asked in order, such as suffix+model "
        f"(default: the one measured fastest on the backend that runs, {defaults}; --draft implies model, "
        "--heads medusa)",
    )
    seen: set[str] = set()
    for spec in all_drafters():
        hints = typing.get_type_hints(spec.options)
        for s in option_settings(spec):
            if s.dest in seen:
                continue  # a flag another drafter declared first (--heads)
            seen.add(s.dest)
            parser.add_argument(
                *s.flags, dest=s.dest, default=s.default, type=_parser(s, hints[s.name]), choices=s.choices, help=s.help
            )


def add_load_options(parser: argparse.ArgumentParser, threads: str = "CPU threads (llama.cpp)") -> None:
    """The target's backend and load options (llama.cpp's short forms -c, -t, -ngl)."""
    parser.add_argument("--backend", default="auto", help="auto (default), torch or llama.cpp")
    parser.add_argument("--device", default="auto", help="auto, cuda, mps or cpu (torch backend)")
    parser.add_argument(
        "--dtype", default="auto", help="auto, float32, bfloat16, float16 or int8 (int8 weights; torch backend)"
    )
    parser.add_argument(
        "--compile",
        choices=COMPILES,
        default="auto",
        help="the PyTorch forward: auto (default: eager on every device), on (static shapes on any device, "
        "with CUDA graphs on CUDA: opt-in, not yet verified on a GPU) or off (eager)",
    )
    parser.add_argument("-c", "--n-ctx", type=int, default=None, help="context window in tokens")
    parser.add_argument("-t", "--threads", type=int, default=None, help=threads)
    add_gpu_layers_option(parser)


def add_gpu_layers_option(parser: argparse.ArgumentParser) -> None:
    """-ngl / --gpu-layers: "auto" (the default), or a count; a bad one is refused with the load options."""
    parser.add_argument(
        "-ngl",
        "--gpu-layers",
        type=_value,
        default=AUTO,
        help="layers offloaded to the GPU (llama.cpp): auto (default: none; offload is opt-in, "
        "not yet verified on a GPU), -1 or all (every layer), 0 (none) or a count",
    )


def drafter_choice(args: argparse.Namespace):
    """(drafter name, its options) from the flags above; a ConfigError for a flag the chosen
    drafter has no use for."""
    from engine.drafters.registry import drafter_spec

    name = _drafter_name(args)
    spec = drafter_spec(name)
    own = {s.dest for s in option_settings(spec)}
    for other in all_drafters():
        for s in option_settings(other):
            if s.dest not in own and getattr(args, s.dest, s.default) != s.default:
                raise ConfigError(_foreign(s, other, name))
    values = {s.name: _value(getattr(args, s.dest)) if s.auto else getattr(args, s.dest) for s in option_settings(spec)}
    return name, spec.options(**values)


def _drafter_name(args: argparse.Namespace) -> str:
    """--draft means a draft model; --heads means Medusa (over the default n-gram drafter)."""
    asked = args.drafter
    if getattr(args, "draft", None) and asked in (None, "model", "assistant") and _is_assistant(args.draft):
        # A Gemma 4 assistant is not a model that drafts alone: it reads the target's hidden states
        # and keys, so the folder given as the draft means the assistant drafter with that folder.
        args.assistant, args.draft = args.draft, None
        return "assistant"
    if getattr(args, "draft", None):
        if asked is not None and "model" in member_names(asked):
            return asked  # a chain with a draft model in it
        if asked not in (None, "model"):
            raise ConfigError(
                f"--draft gives a draft model, but --drafter {asked} drafts without one: drop one of them."
            )
        return "model"
    if getattr(args, "heads", None) and asked is None:
        return "medusa"
    # Nothing chosen: the drafter measured fastest on the backend the target will run on.
    return asked or default_drafter_for(getattr(args, "target", "default"), getattr(args, "backend", "auto"))


def _is_assistant(path: str) -> bool:
    """Whether `path` is a folder holding a Gemma 4 assistant's config.json (anything unreadable: no)."""
    from engine.heads.assistant import is_assistant_config

    try:
        with open(os.path.join(os.path.expanduser(path), "config.json"), encoding="utf-8") as f:
            return is_assistant_config(json.load(f))
    except (OSError, ValueError):
        return False


def _drafter_arg(text: str) -> str:
    """--drafter's value: a registered drafter, or a chain of them ("suffix+model")."""
    from engine.drafters.registry import drafter_spec

    name = text.strip()
    try:
        drafter_spec(name)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return name


def _foreign(s: Setting, owner, drafter: str) -> str:
    flag = s.flags[-1]
    if owner.name == "model":
        return f"{flag} sets up a draft model, but none is loaded: give one with --draft, or drop {flag}."
    users = [spec.name for spec in all_drafters() if s.dest in {o.dest for o in option_settings(spec)}]
    return (
        f"{flag} is an option of --drafter {' or '.join(users)}, but --drafter {drafter} has no use for it: "
        "drop one of them."
    )


def _parser(s: Setting, hint):
    """argparse's type for a setting: text for "auto"-or-number ones (what was typed reaches the
    drafter's own message), int or float for numbers, text otherwise."""
    if s.auto:
        return str
    kinds = typing.get_args(hint) or (hint,)
    if int in kinds:
        return int
    if float in kinds:
        return float
    return str


def _value(text):
    """An "auto"-or-number flag: "auto", the int it spells, or the text as typed (refused later)."""
    if not isinstance(text, str):
        return text
    word = text.strip().lower()
    if word == AUTO:
        return AUTO
    return int(word) if word.lstrip("+-").isdigit() else text


# The loaded pair's options (and every drafter's): with --server the server's loaded pair decides them.
PAIR_OPTIONS = (
    "target",
    "drafter",
    "backend",
    "device",
    "dtype",
    "compile",
    "n_ctx",
    "threads",
    "gpu_layers",
    "k",
    "k_max",
)


def refuse_pair_options(
    args: argparse.Namespace,
    defaults: argparse.Namespace,
    what: str,
    extra: tuple[str, ...] = (),
    subject: str = "pair",
) -> None:
    """With --server: a pair option the user set is a ConfigError (`what`: what the server then uses;
    `subject`: what the option is about, "the {subject} loaded here")."""
    names = [*PAIR_OPTIONS, *extra, *(s.dest for spec in all_drafters() for s in option_settings(spec))]
    given = [name for name in names if getattr(args, name) != getattr(defaults, name)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise ConfigError(
            f"{flag} is about the {subject} loaded here, but with --server {what}: drop {flag}, or run "
            "without --server."
        )


# -- a server instead of a local pair (generate, bench) ---------------------------------------

SERVER_KINDS = ("auto", "specdeck", "llama-server", "vllm", "sglang")
ENV_KEY = "SPECDECK_API_KEY"


def add_server_options(parser: argparse.ArgumentParser, verb: str) -> None:
    """--server URL, --server-kind, --vanilla-server URL, --api-key."""
    parser.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help=f"{verb} a server instead of loading a model here: a SpecDeck server (specdeck-cli "
        "serve) with the pair it has loaded, llama-server, vLLM or SGLang",
    )
    parser.add_argument(
        "--server-kind",
        choices=SERVER_KINDS,
        default="auto",
        help="what runs at --server (default: found out by asking it)",
    )
    parser.add_argument(
        "--vanilla-server",
        default=None,
        metavar="URL",
        help="llama-server, vLLM, SGLang: a second server of the same model without speculative "
        "decoding, for the vanilla side of a comparison",
    )
    parser.add_argument("--api-key", default=None, help=f"the server's API key (default: ${ENV_KEY})")


def server_key(args: argparse.Namespace) -> str | None:
    return args.api_key or os.environ.get(ENV_KEY) or None
