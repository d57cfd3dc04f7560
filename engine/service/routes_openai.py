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

These routes only translate: the bounds are the core's (engine/core/draft_bounds.py,
applied where the step fits a draft to k), and which drafter a request may have is
the engine's judgement from the drafter's spec (engine/drafters/per_request.py).
Requests never change the engine: each gets its own DraftLength and, where asked,
its own drafter, so one request's options cannot leak into the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from engine.core.draft_bounds import DraftBounds
from engine.core.events import StepEvent
from engine.drafters.base import Drafter
from engine.drafters.per_request import NoDraftProbabilities, NotPerRequest, RequestDrafting, request_drafting
from engine.service import openai_api
from engine.service.batch_loop import Generation
from engine.service.errors import BadRequest, error_response
from engine.service.http import event_stream, parse_json, require_engine
from engine.service.limits import check_message_count, limits_of
from engine.service.metrics import metrics_of
from engine.service.openai_api import ChatRequest, CompletionRequest, Reply
from engine.service.routes_specdeck import drafter_stats, step_item

router = APIRouter()


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

    def start(engine, cancel: threading.Event, emit) -> Generation | None:
        from engine.backends.base import common_prefix_length  # torch: the server holds a model by now

        drafting = _drafting(engine, body, options)
        prompt = tokenize(engine)
        if cancel.is_set():  # the client left, or the time ran out, while the prompt was tokenized
            return None
        room = max(1, engine.target.n_ctx - len(prompt))  # no max_tokens: up to the context's end (each slot's)
        run_sampling = dataclasses.replace(sampling, max_tokens=room if limit is None else limit)
        name = model_name(app, engine)
        placed: dict = {}

        def on_start(slot, drafter) -> None:
            # The prompt tokens its slot's cache already holds (a follow-up in the same chat), and the drafter
            # that drafts for it: the loaded one, one of its kind from the batch's pool, or the request's own.
            placed["prompt"] = openai_api.Prompt(len(prompt), common_prefix_length(slot.tokens, prompt[:-1]))
            placed["drafter"] = drafter

        # The first emit comes after the first step, so after tokenizing, the context check and
        # the prefill: a prompt too long for the context is a 400, not a broken stream.
        def on_step(step: StepEvent) -> None:
            metrics.observe(step, len(prompt))
            item = _item(engine, step, placed["drafter"]) if options.events else None
            emit(Emitted(step, item, placed["prompt"], name))

        owned = contextlib.ExitStack()  # the request's own drafter, closed once its reply has ended
        drafter = owned.enter_context(drafting.drafter_for(engine))
        try:
            draft_length = drafting.draft_length(engine.config) if drafter is not None else None
        except BaseException:
            owned.close()
            raise
        return Generation(
            prompt,
            run_sampling,
            on_step,
            speculative=drafter is not None,
            drafter=None if drafter is engine.drafter else drafter,
            draft_length=draft_length,
            on_start=on_start,
            close=owned.close,
        )

    items = host.generate(start, request, time_limit_s=limits_of(request).generation_timeout_s)
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
    if drafter is None or drafter is engine.drafter:
        return step_item(engine, step, drafter is not None)
    return {**step_item(engine, step, False), "run": "speculative", "drafter_stats": drafter_stats(drafter)}


# -- the request's speculative options -------------------------------------------------------------


def _drafting(engine, body, options) -> RequestDrafting:
    """The request's drafter and draft bounds, as the engine judges them (engine/drafters/per_request.py);
    a 400 for a drafter it cannot have, or a p_min its drafter ignores."""
    bounds = DraftBounds(n_min=body.n_min or 0, n_max=body.n_max, p_min=body.p_min or 0.0)
    try:
        return request_drafting(engine.config, engine.drafter, options.drafter, bounds)
    except (NotPerRequest, NoDraftProbabilities) as error:
        raise BadRequest(f"Bad request: {error}") from None
