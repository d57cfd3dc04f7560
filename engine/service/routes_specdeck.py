"""SpecDeck's own routes: what the desktop app needs beyond OpenAI's API.

    GET  /health              {"status": "ok" | "loading" | "no model", "job": ..., "running": N, "waiting": M}
    GET  /specdeck/info       the loaded pair (`loaded_info`), or {"loaded": null}
    POST /specdeck/load       {"config": EngineConfig.to_dict(), "reload"?} -> stream of {"progress": {...}},
                              then {"loaded": ...}; at once when that config is already loaded
    POST /specdeck/unload     frees the models
    POST /specdeck/generate   {"messages", "sampling", "speculative"?} -> stream of {"steps": [step, ...]}
                              batches (batches.py: ten a second, four on a CPU), each step `wire.step_to_dict`
    POST /specdeck/compare    {"messages", "sampling"} -> the same batches for both runs, then {"divergence": ...}
    POST /specdeck/preflight  {"config": EngineConfig.to_dict()} -> `preflight(config).to_dict()`: can this config
                              load and draft, from metadata only (the pair dialog's check)
    POST /specdeck/cancel     {"job"?}: that job (the X-SpecDeck-Job its request was sent with; default the
                              running ones) stops at its next step, or at once if still waiting; its stream
                              ends as usual. A reply decoding beside others (--parallel N) stops alone

A reply and a comparison are one path (`_run`, by its kind). Each step is the
engine's record (`Engine.stream(snapshots=True)`): its run, and copies made on the
engine's thread between two steps of what keeps changing as decoding goes on, the
drafter's statistics and the cost model. It is encoded there too, before the next
step begins, so the event loop only joins a batch's bytes and writes them. The
client rebuilds the same records and the reply from them (`wire.result_from_steps`).

A preflight is not a job: it reads headers and tokenizer files, never the loaded
models, so it runs on a thread of its own beside whatever job holds the engine
and answers in well under a second even while a long reply decodes. It is here,
in the engine's process, so that the window's process never imports what it
needs (torch and llama.cpp, for the device memory and llama.cpp's GPU layers).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from engine.config import EngineConfig
from engine.drafters.registry import DrafterStats
from engine.errors import SpecDeckError
from engine.service import wire
from engine.service.batch_loop import Generation
from engine.service.batches import Batches, batch_interval
from engine.service.capacity import check_parallel
from engine.service.errors import BadRequest, error_response
from engine.service.host import Host
from engine.service.http import event_stream, require_engine
from engine.service.limits import check_message_count, limits_of
from engine.service.metrics import metrics_of

router = APIRouter()
log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoadRequest(_Strict):
    config: dict[str, Any]
    reload: bool = False  # load again even when this config is the loaded one


GENERATE, COMPARE = "generate", "compare"  # the runs a client asks for: a reply, or both runs side by side


class CompareRequest(_Strict):
    messages: list[dict[str, Any]]
    sampling: dict[str, Any] = {}


class GenerateRequest(CompareRequest):
    speculative: bool | None = None  # None: speculative when a drafter is loaded


class PreflightRequest(_Strict):
    config: dict[str, Any]


class CancelRequest(_Strict):
    job: str | None = None  # the X-SpecDeck-Job a request was sent with; None: the running job(s)


def _host(request: Request) -> Host:
    return request.app.state.host


@router.get("/health")
async def health(request: Request) -> dict:
    host = _host(request)
    status = "loading" if host.status == "loading" else ("ok" if host.engine is not None else "no model")
    return {"status": status, "job": host.job_name, "running": host.running, "waiting": host.waiting}


@router.get("/specdeck/info")
async def info(request: Request) -> dict:
    host = _host(request)
    return {
        "wire_version": wire.WIRE_VERSION,
        "status": host.status,
        "loaded": None if host.engine is None else loaded_info(host.engine),
    }


@router.post("/specdeck/load")
async def load(body: LoadRequest, request: Request):
    config = _config(body.config, request)
    # A 400 before the request queues: parallel 0, or caches that cannot fit. Off the event loop: the
    # memory check reads the models' headers.
    await asyncio.to_thread(check_parallel, config)
    host = _host(request)

    def job(cancel, emit) -> None:
        if host.engine is not None and host.engine.config == config and not body.reload:
            emit({"loaded": loaded_info(host.engine)})  # already loaded: a client that reconnects
            return
        progress = lambda message, fraction: emit({"progress": {"message": message, "fraction": fraction}})  # noqa: E731
        host.replace(config, progress)
        emit({"loaded": loaded_info(host.engine)})

    return await event_stream(host.run("load", job, request))


@router.post("/specdeck/unload")
async def unload(request: Request) -> dict:
    host = _host(request)

    def job(cancel, emit) -> None:
        host.free()
        emit({"loaded": None})

    async for item in host.run("unload", job, request):
        return item
    return {"loaded": None}


@router.post("/specdeck/generate")
async def generate(body: GenerateRequest, request: Request):
    return await _run(GENERATE, body, request)


@router.post("/specdeck/compare")
async def compare(body: CompareRequest, request: Request):
    return await _run(COMPARE, body, request)


async def _run(kind: str, body: CompareRequest, request: Request):
    """A reply (GENERATE) or both runs of a comparison (COMPARE, then its divergence), their steps
    sent in batches as the engine records them. A reply may decode beside other requests' (a server
    loaded with --parallel N); a comparison has the engine to itself, since it times both runs."""
    host = _host(request)
    sampling = _sampling(body.sampling)
    check_message_count(body.messages, limits_of(request))
    metrics = metrics_of(request.app)
    timeout = limits_of(request).generation_timeout_s

    def steps_sent(engine, prompt, emit) -> tuple[Batches, Callable]:
        send = Batches(lambda steps: emit(wire.batch(steps)), batch_interval(engine.target.info.device))

        def on_step(step) -> None:
            metrics.observe(step, len(prompt))
            send.send(wire.dumps(wire.step_to_dict(step)), last=step.finish_reason is not None)

        return send, on_step

    if kind == GENERATE:

        def start(engine, cancel, emit) -> Generation:
            prompt = engine.prompt_ids(body.messages)
            sent, on_step = steps_sent(engine, prompt, emit)
            speculative = engine.drafter is not None if body.speculative is None else body.speculative
            # Batches.flush at the end: whatever is held when the run ends, normally or by an error, goes out
            return Generation(prompt, sampling, on_step, speculative=speculative, snapshots=True, close=sent.flush)

        return await event_stream(host.generate(start, request, time_limit_s=timeout))

    def job(cancel, emit) -> None:
        engine = require_engine(host)
        prompt = engine.prompt_ids(body.messages)
        sent, on_step = steps_sent(engine, prompt, emit)
        with sent:
            on_event = lambda run, step: on_step(step)  # noqa: E731 - the step says its run
            comparison = engine.compare(prompt, sampling, cancel=cancel, on_event=on_event, snapshots=True)
        emit({"divergence": wire.divergence_to_dict(comparison.divergence)})

    return await event_stream(host.run(kind, job, request, time_limit_s=timeout))


@router.post("/specdeck/preflight")
async def check(body: PreflightRequest, request: Request):
    """Beside the jobs, not through the host's queue (see the module docstring)."""
    from engine.preflight import preflight

    config = _config(body.config, request)  # a bad config is a 400 with the engine's message
    try:
        result = await asyncio.to_thread(preflight, config)
    except Exception as error:  # noqa: BLE001 - preflight reports bad models as findings: this is a bug
        log.exception("the preflight of %r failed", config)
        return error_response(
            500, f"The check failed in the engine ({type(error).__name__}: {error}).", "internal_error"
        )
    return result.to_dict()


@router.post("/specdeck/cancel")
async def cancel(request: Request, body: CancelRequest | None = None) -> dict:
    return {"cancelled": _host(request).cancel(body.job if body is not None else None)}


# -- what travels ------------------------------------------------------------------------------


def loaded_info(engine) -> dict:
    """What a client shows about the loaded pair; call it on the thread that loaded it."""
    return {
        "config": engine.config.to_dict(),
        "target": wire.model_info_to_dict(engine.target.info),
        "n_ctx": engine.target.n_ctx,
        "speculative": engine.drafter is not None,
        "notes": [str(note) for note in engine.notes if note],
        "costs": wire.costs_to_dict(engine.costs.snapshot()),
    }


def step_item(engine, step, speculative: bool) -> dict:
    """The OpenAI routes' `specdeck` event of a step (routes_openai.py): the step, its run, the
    drafter's statistics as plain data and the cost model, copied on the engine's thread between two
    steps. The SpecDeck routes send the engine's record itself (`_run`)."""
    drafter = engine.drafter if speculative else None
    return {
        "run": "speculative" if speculative else "vanilla",
        "step": wire.step_to_dict(step),
        "drafter_stats": drafter_stats(drafter),
        "costs": wire.costs_to_dict(engine.costs.snapshot()),
    }


def drafter_stats(drafter) -> dict | None:
    """`drafter.stats()` as plain data (the OpenAI routes' events), None without a drafter or when
    stats() fails (logged once, by `engine.api.drafter_stats`)."""
    from engine.api import drafter_stats as stats_of  # loaded already: an engine runs

    stats = stats_of(drafter)
    if stats is None:
        return None
    # as_dict() is a fresh copy; a plain dict (a drafter of before the typed statistics) may share its values.
    return stats.as_dict() if isinstance(stats, DrafterStats) else copy.deepcopy(dict(stats))


def _config(data: dict, request: Request) -> EngineConfig:
    """ConfigError (a 400) names the field and what to do; a model the server may not read is a 400 too."""
    from engine.service.paths import paths_of

    return paths_of(request).check_config(EngineConfig.from_dict(data))


def _sampling(data: dict):
    try:
        return wire.sampling_from_dict(data)
    except TypeError as error:  # an unknown field
        raise BadRequest(f"Bad sampling settings: {error}.") from error
    except SpecDeckError:
        raise
