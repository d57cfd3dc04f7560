"""OpenAI's routes over the engine: what any OpenAI client (and llama-server's) uses.

    GET  /v1/models             the one model this server holds
    GET  /v1/models/{id}        that model, or a 404
    POST /v1/chat/completions   messages -> a reply, streamed (SSE, `data: {chunk}` ... `data: [DONE]`) or not
    POST /v1/completions        a prompt string -> its continuation, likewise

The request's fields, defaults and replies are described in openai_api.py. Per
request, as llama-server takes them (top-level keys with a dot):

    "speculative.n_max": N   the longest draft (0: plain decoding); caps the engine's k (or automatic k's k_max)
    "speculative.n_min": N   the shortest draft: a drafting step asks for at least N tokens, and a chain draft
                             the drafter found shorter is dropped (the step decodes plainly), as llama-server
                             does; clamped to n_max, as there
    "speculative.p_min": P   drafting stops at the first draft token whose draft probability q is below P;
                             only the draft-model drafter has draft probabilities (P > 0 with another: a 400)

and SpecDeck's own `"specdeck": {"events": true, "drafter": NAME}`: `events` adds
each step (routes_specdeck.step_item: its tokens with source, p and q, its
timings, the drafter's statistics and the cost model) to the streamed chunk that
carries its text (a `specdeck` field), or as a list to the whole reply; `drafter`
"none" decodes plainly, the loaded drafter's name (the default) speculatively, and
another drafter only when it loads nothing (no draft model, no heads): it is made
for this request and closed after it.

Requests never change the engine: each gets its own DraftLength and, where asked,
its own drafter, so one request's options cannot leak into the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from engine.core.draft_length import K_LIMIT, DraftLength
from engine.core.events import StepEvent
from engine.drafters.base import EMPTY_DRAFT, Draft, Drafter
from engine.service import openai_api
from engine.service.limits import check_message_count, limits_of
from engine.service.metrics import metrics_of
from engine.service.openai_api import ChatRequest, CompletionRequest, Reply
from engine.service.routes_specdeck import drafter_stats, step_item
from engine.service.server import BadRequest, error_response, event_stream, parse_json, require_engine

router = APIRouter()
P_MIN_DRAFTERS = ("model",)  # drafters whose drafts carry the draft's probabilities q


@router.get("/v1/models")
async def models(request: Request) -> dict:
    host = request.app.state.host
    data = []
    if host.engine is not None:
        data.append(
            {"id": model_name(request.app, host.engine), "object": "model", "created": 0, "owned_by": "specdeck"}
        )
    return {"object": "list", "data": data}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request) -> dict:
    """One model, as `openai`'s `models.retrieve` asks for it; a 404 in OpenAI's shape for any other."""
    host = request.app.state.host
    if host.engine is not None and model_id == model_name(request.app, host.engine):
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "specdeck"}
    served = f"'{model_name(request.app, host.engine)}'" if host.engine is not None else "no model (none is loaded)"
    return error_response(
        404, f"The model '{model_id}' does not exist on this server: it serves {served}.", "invalid_request_error"
    )


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    body = await _parsed(request, ChatRequest)
    openai_api.refuse_unsupported(body)
    check_message_count(body.messages, limits_of(request))
    messages = openai_api.chat_messages(body.messages)
    return await _serve(body, request, lambda engine: engine.prompt_ids(messages), chat=True)


@router.post("/v1/completions")
async def completions(request: Request):
    body = await _parsed(request, CompletionRequest)
    openai_api.refuse_unsupported(body)
    text = openai_api.completion_prompt(body.prompt)
    return await _serve(body, request, lambda engine: engine.prompt_ids(text, chat=False), chat=False)


def model_name(app, engine) -> str:
    return app.state.model_name or engine.target.info.name


async def _parsed(request: Request, model: type[BaseModel]):
    """The body as `model` (limits.Guard made sure it is labelled JSON). Bad JSON and bad fields
    are the server's 400s."""
    data = parse_json(await request.body())
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise RequestValidationError(error.errors()) from None


# -- one generation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Emitted:
    """What the job hands the route per step: the step, its record when events are asked for, and
    what the reply's first chunk needs (made on the engine's thread)."""

    step: StepEvent
    item: dict | None
    prompt: openai_api.Prompt
    model: str


async def _serve(body, request: Request, tokenize, chat: bool):
    sampling = openai_api.sampling_of(body)  # a bad value is a 400 before the request queues
    options = body.specdeck or openai_api.SpecDeckOptions()
    limit = body.requested_max_tokens()
    host, app = request.app.state.host, request.app
    require_engine(host)
    metrics = metrics_of(app)

    def job(cancel: threading.Event, emit) -> None:
        from engine.backends.base import common_prefix_length  # torch: the server holds a model by now

        engine = require_engine(host)
        plan = _plan(engine, body, options)
        prompt = tokenize(engine)
        if cancel.is_set():  # the client left, or the time ran out, while the prompt was tokenized
            return
        counted = openai_api.Prompt(len(prompt), common_prefix_length(engine.target.tokens, prompt[:-1]))
        room = max(1, engine.target.n_ctx - len(prompt))  # no max_tokens: up to the context's end
        run_sampling = dataclasses.replace(sampling, max_tokens=room if limit is None else limit)
        name = model_name(app, engine)
        with plan.drafter_for(engine) as drafter:
            # The first emit comes after the first step, so after tokenizing, the context check and
            # the prefill: a prompt too long for the context is a 400, not a broken stream.
            for step in _steps(engine, prompt, run_sampling, drafter, plan, cancel):
                metrics.observe(step, len(prompt))
                item = _item(engine, step, drafter) if options.events else None
                emit(Emitted(step, item, counted, name))

    items = host.run("generate", job, request, time_limit_s=limits_of(request).generation_timeout_s)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        return await event_stream(_chunks(items, chat, include_usage, options.events), done="[DONE]")
    steps, events, prompt, name = [], [], openai_api.Prompt(0), ""
    async with contextlib.aclosing(items):
        async for emitted in items:
            steps.append(emitted.step)
            if emitted.item is not None:
                events.append(emitted.item)
            prompt, name = emitted.prompt, emitted.model
    reply = Reply.start(chat, name)
    return JSONResponse(reply.response(steps, prompt, events if options.events else None))


async def _chunks(items: AsyncIterator[Emitted], chat: bool, include_usage: bool, events: bool) -> AsyncIterator[dict]:
    """The stream's chunks: the role, then one per step with text (every step with `events`),
    the finish with the timings, and the usage when asked for."""
    reply, steps, prompt = None, [], openai_api.Prompt(0)
    async with contextlib.aclosing(items):
        async for emitted in items:
            step = emitted.step
            if reply is None:
                reply, prompt = Reply.start(chat, emitted.model, include_usage), emitted.prompt
                if chat:
                    yield reply.chunk(role=True)
            steps.append(step)
            if events:
                yield reply.chunk(step.text, specdeck=emitted.item)
            elif step.text:
                yield reply.chunk(step.text)
    if reply is None:
        return
    yield reply.chunk(None if chat else "", openai_api.finish_reason(steps), timings=openai_api.timings(steps, prompt))
    if include_usage:
        yield reply.usage_chunk(steps, prompt)


def _item(engine, step: StepEvent, drafter: Drafter | None) -> dict:
    """routes_specdeck.step_item, with the statistics of this request's drafter."""
    if drafter is engine.drafter:
        return step_item(engine, step, drafter is not None)
    return {**step_item(engine, step, False), "run": "speculative", "drafter_stats": drafter_stats(drafter)}


def _steps(engine, prompt: list[int], sampling, drafter: Drafter | None, plan: Plan, cancel) -> Iterator[StepEvent]:
    """Engine.stream with this request's drafter and draft length."""
    if drafter is None:
        return engine.stream(prompt, sampling, speculative=False, cancel=cancel)
    return engine.stream(
        prompt, sampling, cancel=cancel, drafter=drafter, draft_length=plan.draft_length(engine.config)
    )


# -- the request's speculative options -------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How this request drafts: with which drafter (None: plainly), and its draft-length bounds."""

    drafter: str | None  # a registry name; None: plain decoding
    own: bool  # the loaded drafter (else one made for this request)
    n_max: int | None
    n_min: int
    p_min: float

    def draft_length(self, config) -> DraftLength:
        return RequestDraftLength(config.k, config.k_max, n_min=self.n_min, n_max=self.n_max)

    @contextlib.contextmanager
    def drafter_for(self, engine):
        if self.drafter is None:
            yield None
            return
        if self.own:
            drafter, made = engine.drafter, False
        else:
            from engine.drafters.registry import make_drafter

            drafter, made = make_drafter(engine.target, engine.config.with_drafter(self.drafter)), True
            if drafter is not None:
                drafter.costs = engine.costs
        try:
            if drafter is not None and (self.p_min > 0 or self.n_min > 0):
                yield BoundedDrafter(drafter, n_min=self.n_min, p_min=self.p_min)
            else:
                yield drafter
        finally:
            if made and drafter is not None:
                drafter.close()


def _plan(engine, body, options) -> Plan:
    """The request's drafter and bounds; a 400 for a drafter it cannot have, or a p_min its drafter ignores."""
    from engine.drafters.registry import drafter_names, drafter_spec, option_settings

    name = options.drafter or engine.config.drafter
    n_max = body.n_max
    n_min = min(body.n_min or 0, n_max if n_max is not None else K_LIMIT)  # llama-server clamps n_min to n_max
    p_min = body.p_min or 0.0
    if name == "none" or n_max == 0:
        return Plan(None, False, n_max, n_min, p_min)
    own = name == engine.config.drafter
    if own and engine.drafter is None:
        return Plan(None, False, n_max, n_min, p_min)
    if not own:
        spec = drafter_spec(name)  # an unknown name: the registry's ConfigError (a 400) lists the drafters
        if not _loads_nothing(spec, option_settings):
            free = [
                n
                for n in drafter_names()
                if n not in ("none", engine.config.drafter) and _loads_nothing(drafter_spec(n), option_settings)
            ]
            raise BadRequest(
                f"Bad request: the {name} drafter loads a model of its own, so it cannot be chosen per request: "
                f"load it on the server (specdeck-cli serve --drafter {name} ..., or POST /specdeck/load). "
                f"This server has {engine.config.drafter} loaded; per request it can also use "
                f"{', '.join(free)} or none."
            )
    if p_min > 0 and name not in P_MIN_DRAFTERS:
        raise BadRequest(
            f"Bad request: 'speculative.p_min' is a minimum draft probability, and only the draft-model drafter "
            f"(model) has draft probabilities; the {name} drafter does not. Send 0, or leave it out."
        )
    return Plan(name, own, n_max, n_min, p_min)


def _loads_nothing(spec, option_settings) -> bool:
    """No draft model and no trained heads: cheap enough to make for one request."""
    return not spec.loads_model and "heads" not in {s.name for s in option_settings(spec)}


class RequestDraftLength(DraftLength):
    """The engine's k (fixed or automatic), capped at n_max, and at least n_min when it drafts at all:
    automatic k's plain steps stay plain (drafting that does not pay is not forced)."""

    def __init__(self, k, k_max: int, *, n_min: int = 0, n_max: int | None = None) -> None:
        cap = K_LIMIT if n_max is None else n_max
        DraftLength(k, k_max)  # the engine's own message for a bad k, before it is capped
        if k != "auto":
            k = min(int(k), cap)
        super().__init__(k, max(1, min(k_max, cap)))
        self.n_min, self.cap = min(n_min, cap), cap

    def choose(self, costs) -> int:
        k = super().choose(costs)
        return min(max(k, self.n_min), self.cap) if k > 0 else 0


class BoundedDrafter(Drafter):
    """A drafter whose chain drafts are cut at the first token with q < p_min, and dropped when shorter
    than n_min (llama-server's speculative.p_min and n_min). Everything else is the wrapped drafter's.

    The draft model keeps in its cache what it drafted past the cut; it rolls back to the committed
    text before its next draft (ModelDrafter.propose), so the cut costs nothing but the tokens drafted."""

    def __init__(self, inner: Drafter, *, n_min: int = 0, p_min: float = 0.0) -> None:
        self.inner, self.n_min, self.p_min = inner, n_min, p_min
        self.name, self.uses_features, self.drafts_trees = inner.name, inner.uses_features, inner.drafts_trees

    @property
    def costs(self):
        return self.inner.costs

    @costs.setter
    def costs(self, value) -> None:
        self.inner.costs = value

    def propose(self, context, k, sampling, generator) -> Draft:
        draft = self.inner.propose(context, k, sampling, generator)
        if draft.parents is not None or draft.extra_tokens or draft.exit_hidden is not None:
            return draft  # trees, lookahead's window and early exit's rows are not cut
        n = len(draft)
        if self.p_min > 0 and draft.q_token is not None:
            n = next((i for i, q in enumerate(draft.q_token) if q < self.p_min), n)
        if n < max(self.n_min, 1):
            return EMPTY_DRAFT
        if n == len(draft):
            return draft
        q = draft.q[:n] if draft.q is not None else None
        return dataclasses.replace(draft, tokens=draft.tokens[:n], q=q, q_token=draft.q_token[:n])

    def observe(self, drafted: int, accepted: int) -> None:
        self.inner.observe(drafted, accepted)

    def observe_features(self, features) -> None:
        self.inner.observe_features(features)

    def observe_extra(self, logits) -> None:
        self.inner.observe_extra(logits)

    def tree_expected_tokens(self, nodes: int) -> float | None:
        return self.inner.tree_expected_tokens(nodes)

    def measure_token_cost(self) -> float | None:
        return self.inner.measure_token_cost()

    def reset(self) -> None:
        self.inner.reset()

    def begin(self, prompt) -> None:
        self.inner.begin(prompt)

    def forget(self) -> None:
        self.inner.forget()

    def stats(self) -> Any:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()
