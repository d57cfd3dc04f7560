"""Servers the window can run on instead of its own engine process: connecting, and what a pair says.

A local engine and a SpecDeck server load the dialog's pair and answer with a
`LoadedPair`: its config, its target, its cost model. llama-server, vLLM and
SGLang serve a model of their own and say less (the engine's `RemotePair`): the
model's name, whether and how the server speculates, its context, and notes
that say in words what its numbers cannot show (no p and q, no cost model).
`ServerPair` is that pair with what the window reads of any loaded pair
(`speculative`, `n_ctx`, `notes`), and no config or cost model to read.

`check_connection` is the pair dialog's "Test connection", and `connect` the
controller's load for such a server: both block, and run on a worker thread.
No Qt here.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.shell.settings import EngineChoice
from engine import (
    EngineClient,
    EngineUnavailable,
    RemoteEngine,
    RemotePair,
    ServerRefused,
    ServerUnavailable,
    SpecDeckError,
    open_remote,
)

UNREACHABLE = (EngineUnavailable, ServerUnavailable)  # nothing answers, or the stream broke off
NEEDS_ENGINE = (
    "{what} runs on a local engine or a SpecDeck server, and the window uses {server}, which serves "
    "its own model: choose Local or SpecDeck server in Models ▸ Model pair… to run it."
)


@dataclass(frozen=True)
class ServerPair:
    """What the window keeps of a llama-server, vLLM or SGLang pair (the controller's `loaded`)."""

    pair: RemotePair
    config = None  # no EngineConfig: the server chose the model and how it drafts
    costs = None  # no cost model: the theory panel draws the formula alone

    @property
    def speculative(self) -> bool:
        return self.pair.speculative

    @property
    def n_ctx(self) -> int | None:
        return self.pair.n_ctx

    @property
    def notes(self) -> tuple[str, ...]:
        return self.pair.notes

    def describe(self) -> str:
        return self.pair.describe()


def connect(choice: EngineChoice) -> tuple[RemoteEngine, ServerPair]:
    """The adapter for a llama-server, vLLM or SGLang `choice`, connected; raises SpecDeckError."""
    remote = open_remote(choice.kind, choice.url, choice.api_key or None, vanilla_url=choice.vanilla_url or None)
    return remote, ServerPair(remote.connect())


def server_client(choice: EngineChoice) -> EngineClient:
    """A SpecDeck server's client (ConfigError for a URL that is no server address)."""
    return EngineClient(choice.url, choice.api_key or None)


def check_connection(choice: EngineChoice) -> tuple[str, tuple[str, ...]]:
    """(what answers at the choice's URL, notes about it); raises SpecDeckError with the reason it
    cannot be used. Blocks: run it on a worker thread."""
    if not choice.url.strip():
        raise SpecDeckError("Give the server's URL, like http://127.0.0.1:8000.")
    if choice.adapter:
        return _describe_server(connect(choice)[1].pair)
    client = server_client(choice)
    loaded = client.loaded()
    if loaded is None:
        return f"SpecDeck server at {client.url}, no pair loaded yet: Load loads the pair below there.", ()
    text = (
        f"SpecDeck server at {client.url}, holding {loaded.target.name} with drafter {loaded.config.drafter}; "
        "Load loads the pair below there (its paths are the server's)."
    )
    return text, loaded.notes


def _describe_server(pair: RemotePair) -> tuple[str, tuple[str, ...]]:
    text = pair.describe()
    if pair.vanilla_url:
        text += f"; vanilla runs on {pair.vanilla_url}"
    elif pair.speculative:
        text += "; no vanilla URL: the side by side asks the server itself not to draft, where it can"
    return text, pair.notes


def retried(error: BaseException) -> bool:
    """Whether trying again later may work: nothing answered, or the server was busy (503)."""
    return isinstance(error, UNREACHABLE) or (isinstance(error, ServerRefused) and error.status == 503)
