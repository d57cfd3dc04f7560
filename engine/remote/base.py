"""A remote inference server behind the engine's own calls: connect, generate, compare.

    remote = open_remote("llama-server", "http://127.0.0.1:8080")   # engine/remote/__init__.py
    pair = remote.connect()            # RemotePair: the server's model and how it speculates
    result = remote.generate([{"role": "user", "content": "Hi"}], SamplingConfig(max_tokens=64),
                             on_steps=lambda steps: print("".join(step.text for step in steps), end=""))

Every adapter speaks OpenAI's streamed `/v1/chat/completions`; what differs is
what each server says about its drafts, which the adapter hands to `StepBuilder`
(`_counters`, per chunk) or reads around the request (`_before`, `_after`: vLLM's
and SGLang's /metrics). The steps, results and comparisons are the engine's own
records, so the chat, the charts and the side-by-side draw them as they draw a
local run; `RemotePair.notes` say in words what a server's numbers cannot show.
A server streams a chunk at a time: the steps go to `on_steps` in batches, at most
every BATCH_S, as a SpecDeck server sends its own (engine/service/batches.py), so
that a window hands them to its GUI thread at the same pace whichever server runs.

The side by side needs a run without speculation from the same model: a second
server (`vanilla_url`), or the same one told per request not to draft where it
can be (`_vanilla_body`); an adapter that cannot says how to give it one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.core.events import Comparison, GenerationResult, StepEvent
from engine.core.sampling_config import SamplingConfig
from engine.errors import SpecDeckError
from engine.remote.http import JsonServer
from engine.remote.steps import StepBuilder
from engine.service.batches import BATCH_S, Batches

StepsCallback = Callable[[list[StepEvent]], None]  # a batch of steps, in order
FINISH_REASONS = {"stop": "stop", "length": "length", "eos": "stop", "limit": "length"}


@dataclass(frozen=True)
class RemotePair:
    """What a remote server serves, as far as it says."""

    kind: str  # "llama-server", "vllm", "sglang"
    url: str
    model: str  # the model's name as the server gives it
    speculative: bool  # the server drafts
    speculation: str  # how, in words ("ngram-map-k, up to 16 draft tokens"); "" when it does not
    n_ctx: int | None  # the context the server gives a request, where it says
    notes: tuple[str, ...] = ()  # what this server's numbers cannot show, for the UI to show as is
    vanilla_url: str | None = None  # the second server the side by side's vanilla run uses
    details: dict = field(default_factory=dict, compare=False)  # the server's own description, for reports

    def describe(self) -> str:
        how = self.speculation if self.speculative else "no speculative decoding"
        return f"{self.model} on {self.kind} at {self.url} ({how})"


class RemoteEngine:
    """One remote server (and, for the side by side, its vanilla twin). Subclasses: an adapter each."""

    kind = "openai"
    name = "OpenAI-compatible server"

    def __init__(
        self, url: str, api_key: str | None = None, *, vanilla_url: str | None = None, model: str | None = None
    ) -> None:
        self.server = JsonServer(url, api_key, self.name)
        self.vanilla = JsonServer(vanilla_url, api_key, f"vanilla {self.name}") if vanilla_url else None
        self.url = self.server.url
        self.model = model
        self.pair: RemotePair | None = None
        # True while `compare` runs: each run reads the prompt itself (its own prefill and time to the
        # first token), where a server lets a request skip its prompt cache (llama-server).
        self.cold_prompts = False

    # -- the engine's calls -----------------------------------------------------------------

    def connect(self) -> RemotePair:
        """Ask the server what it serves (and check the vanilla twin answers); remembered as `pair`."""
        self.pair = self._describe()
        if self.vanilla is not None:
            self._models(self.vanilla)  # reachable, and the key works there too
        return self.pair

    def generate(
        self,
        messages: list[dict],
        sampling: SamplingConfig,
        *,
        speculative: bool | None = None,
        cancel: threading.Event | None = None,
        on_steps: StepsCallback | None = None,
    ) -> GenerationResult:
        """One reply. `speculative` False: the vanilla run (on `vanilla_url`, or the server told not
        to draft); None or True: as the server decodes."""
        pair = self.pair or self.connect()
        vanilla = speculative is False and pair.speculative
        label = "vanilla" if vanilla else "speculative"
        server = self._server(vanilla)
        body = self._body(messages, sampling, vanilla)
        builder = StepBuilder(notes=pair.notes, run=label, **self._builder_options(vanilla))
        before = self._before(server)
        reason, timings, held = "length", {}, []
        # Whatever is held when the block ends, by an error too, is handed on then: nothing is lost.
        with Batches(on_steps or _ignore, BATCH_S) as send:

            def add(text: str, chunk: dict) -> None:
                for step in builder.add(text, **self._counters(chunk, builder)):
                    # Each step goes out once the next one has come: the last goes out below, with the
                    # run's final numbers and its finish reason, and no step is told twice.
                    if held:
                        send(held.pop())
                    held[:] = [step]

            try:
                for chunk in server.events("/v1/chat/completions", body, cancel=cancel):
                    self._observe(chunk)
                    timings = chunk.get("timings") or timings
                    for choice in chunk.get("choices") or ():
                        add((choice.get("delta") or {}).get("content") or "", chunk)
                        if choice.get("finish_reason"):
                            reason = FINISH_REASONS.get(choice["finish_reason"], choice["finish_reason"])
                    if not chunk.get("choices") and chunk.get("usage"):  # vLLM's and SGLang's last chunk
                        add("", chunk)
            except SpecDeckError:
                for step in [*held, *builder.flush()]:  # what arrived before the server went away is kept
                    send(step)
                raise
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
            result = builder.finish(reason, **self._after(server, before, timings))
            send(result.events[-1], last=True)
        if vanilla:
            self._check_vanilla(result)
        return result

    def compare(
        self,
        messages: list[dict],
        sampling: SamplingConfig,
        *,
        cancel: threading.Event | None = None,
        on_steps: StepsCallback | None = None,
    ) -> Comparison:
        """Vanilla, then speculative decoding of the same input, as `Engine.compare`."""
        pair = self.pair or self.connect()
        if not pair.speculative:
            raise SpecDeckError(
                f"The {self.server.name} does not decode speculatively: there is nothing to compare "
                "(start it with a draft model or a speculative type)."
            )
        self.ensure_vanilla()
        self.cold_prompts = True
        try:
            vanilla = self.generate(messages, sampling, speculative=False, cancel=cancel, on_steps=on_steps)
            if cancel is not None and cancel.is_set():
                return Comparison(vanilla, vanilla, None)
            speculative = self.generate(messages, sampling, speculative=True, cancel=cancel, on_steps=on_steps)
        finally:
            self.cold_prompts = False
        return Comparison(vanilla, speculative, None)

    def ensure_vanilla(self) -> None:
        """Before vanilla runs: start what they need where an adapter can (llama-server's twin)."""

    def close(self) -> None:
        """Stop what this engine started (llama-server's vanilla twin); the servers themselves stay."""

    # -- what an adapter changes ---------------------------------------------------------------

    def _describe(self) -> RemotePair:
        models = self._models(self.server)
        return RemotePair(self.kind, self.url, self.model or models[0], speculative=False, speculation="", n_ctx=None)

    def _body(self, messages: list[dict], sampling: SamplingConfig, vanilla: bool) -> dict:
        body = {
            "model": self.pair.model if self.pair else self.model,
            "messages": messages,
            "stream": True,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
        }
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.min_p:
            body["min_p"] = sampling.min_p
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        return body

    def _builder_options(self, vanilla: bool) -> dict:
        return {}

    def _counters(self, chunk: dict, builder: StepBuilder) -> dict:
        """What `chunk` says of the run so far: StepBuilder.add's `tokens`, `drafted`, `accepted`."""
        return {}

    def _observe(self, chunk: dict) -> None:
        """Every streamed chunk, as it comes (one that carries neither text nor usage too)."""

    def _before(self, server: JsonServer) -> Any:
        return None

    def _after(self, server: JsonServer, before: Any, timings: dict) -> dict:
        """StepBuilder.finish's `wall_s`, `prefill_s`, `drafted`, `accepted` from what the server said."""
        return {}

    def _check_vanilla(self, result: GenerationResult) -> None:
        """Raise where the vanilla run drafted after all (the server ignored being told not to)."""
        if result.stats.drafted > 0:
            raise SpecDeckError(
                f"The vanilla run on the {self._server(True).name} drafted {result.stats.drafted} "
                "tokens: give a vanilla URL, a server started without speculative decoding."
            )

    # -- helpers ----------------------------------------------------------------------------

    def _server(self, vanilla: bool) -> JsonServer:
        if vanilla and self.vanilla is not None:
            return self.vanilla
        return self.server

    def _models(self, server: JsonServer) -> list[str]:
        return [card["id"] for card in model_cards(server)]


def model_cards(server: JsonServer) -> list[dict]:
    """The model cards of /v1/models (vLLM's and SGLang's carry `max_model_len`)."""
    data = server.get("/v1/models")
    cards = [m for m in (data.get("data") or []) if isinstance(m, dict) and m.get("id")]
    if not cards:
        raise SpecDeckError(f"The {server.name} lists no model at /v1/models: has it finished loading?")
    return cards


def usage_counters(chunk: dict, builder: StepBuilder, plain: bool) -> dict:
    """StepBuilder.add's counters from a chunk's running `usage.completion_tokens` (vLLM's and SGLang's
    continuous usage stats), for a builder made with `step_per_chunk`; `plain`: nothing drafts."""
    usage = chunk.get("usage") or {}
    if usage.get("completion_tokens") is None:
        if any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices") or ()):
            # A server that ignores continuous_usage_stats: a chunk's tokens are not known, so neither is
            # what its step accepted. One token a chunk, of unreported source, to the end (the last
            # chunk's total would make up a step).
            builder.step_per_chunk = False
        return {}
    if not builder.step_per_chunk:
        return {}
    tokens = int(usage["completion_tokens"])
    if plain or (not builder.steps and tokens == 1):
        # Nothing drafts on a vanilla server; the first token comes from the prefill, which verifies no
        # draft. Running totals that do not move make plain tokens.
        return {"tokens": tokens, "drafted": 0, "accepted": 0}
    return {"tokens": tokens}


class StepPerChunkEngine(RemoteEngine):
    """A server that streams each decoding step as one chunk with its running usage (vLLM, SGLang:
    `continuous_usage_stats`), and reads no per-request option that stops drafting, so that its side
    by side needs `vanilla_url` (`no_vanilla` says so). `draft_length` is the server's k, once
    `_describe` has read it."""

    no_vanilla = "The side by side needs a vanilla URL: a second server of the same model without speculation."

    def __init__(
        self, url: str, api_key: str | None = None, *, vanilla_url: str | None = None, model: str | None = None
    ) -> None:
        super().__init__(url, api_key, vanilla_url=vanilla_url, model=model)
        self.draft_length = 0
        self._plain_run = False  # one generate call's: nothing drafts in it (vanilla, or no speculation)

    def _body(self, messages: list[dict], sampling: SamplingConfig, vanilla: bool) -> dict:
        body = super()._body(messages, sampling, vanilla)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body

    def _builder_options(self, vanilla: bool) -> dict:
        self._plain_run = vanilla or not (self.pair and self.pair.speculative)
        return {"step_per_chunk": True, "draft_length": 0 if self._plain_run else self.draft_length}

    def _counters(self, chunk: dict, builder: StepBuilder) -> dict:
        return usage_counters(chunk, builder, self._plain_run)

    def _server(self, vanilla: bool) -> JsonServer:
        if vanilla and self.vanilla is None:
            raise SpecDeckError(self.no_vanilla)
        return super()._server(vanilla)


def _ignore(steps: list[StepEvent]) -> None:
    """The batches of a run nobody watches."""
