"""The engine server: one `Host`, HTTP routes over it, and the rules every route shares.

Routes: `routes_specdeck` (load, generate and compare with every step on the
wire, cancel, the pair dialog's preflight: what the desktop app uses), `routes_jobs` (benchmark, auto-tune,
training), `routes_openai` (`/v1/...`, what any OpenAI client uses), `/health`
and `/metrics`. Shared rules:

- With an API key, every route but `/health` wants `Authorization: Bearer KEY`.
- An engine error is the engine's own message with a 4xx status, in OpenAI's
  error shape: `{"error": {"message", "type", "code"}}`. Unknown fields, bad
  JSON and bad values are 400, a full queue 503, a missing key 401.
- Streams are server-sent events: one `data: {json}` per item, then `data: [DONE]`.
  An error after the stream has started is its last item, `{"error": {...}}`.
"""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from engine.errors import ConfigError, ContextOverflowError, SpecDeckError
from engine.service import wire
from engine.service.host import Host, ServerBusy

log = logging.getLogger(__name__)
OPEN_PATHS = ("/health",)  # answered without the API key: a supervisor polls it


def create_app(host: Host, *, api_key: str | None = None, model_name: str | None = None, paths=None) -> FastAPI:
    """The server's ASGI app; `model_name` is the id `/v1/models` lists (default: the target's name)."""
    app = FastAPI(title="SpecDeck engine", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.host = host
    app.state.model_name = model_name
    from engine.service.paths import server_paths

    app.state.paths = server_paths(paths, host, api_key)  # what a request may name on this machine (paths.py)

    if api_key:
        app.add_middleware(RequireKey, api_key=api_key)

    @app.exception_handler(SpecDeckError)
    async def engine_error(request: Request, error: SpecDeckError):
        return error_response(status_of(error), str(error), error_type(error), error)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, error: RequestValidationError):
        return error_response(400, validation_message(error), "invalid_request_error")

    @app.exception_handler(json.JSONDecodeError)
    async def bad_json(request: Request, error: json.JSONDecodeError):
        return error_response(400, f"The request body is not valid JSON ({error.msg} at character {error.pos}).",
                              "invalid_request_error")  # fmt: skip

    from engine.service import metrics, routes_jobs, routes_specdeck

    app.include_router(routes_specdeck.router)
    app.include_router(routes_jobs.router)
    app.include_router(metrics.router)
    from engine.service import routes_openai

    app.include_router(routes_openai.router)
    return app


class RequireKey:
    """Every route but OPEN_PATHS wants `Authorization: Bearer KEY`, else a 401 that says so.

    Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware hands every
    chunk of a streamed reply through a memory stream and a task of its own, on the event loop
    that competes with the decoding threads for the cores."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self._expected = app, f"Bearer {api_key}"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"), "")
            if given != self._expected:
                what = "is missing" if not given else "is wrong"
                response = error_response(401, f"The API key {what}: send 'Authorization: Bearer <key>', the key "
                                               "the server was started with.", "authentication_error")  # fmt: skip
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# -- errors -------------------------------------------------------------------------------------


def status_of(error: SpecDeckError) -> int:
    if isinstance(error, ServerBusy):
        return 503
    if isinstance(error, (ConfigError, ContextOverflowError)):
        return 400
    if isinstance(error, NoEngine):
        return 409
    return 400 if isinstance(error, BadRequest) else 422


def error_type(error: BaseException) -> str:
    if isinstance(error, ServerBusy):
        return "server_busy"
    if isinstance(error, (ConfigError, ContextOverflowError, BadRequest)):
        return "invalid_request_error"
    return type(error).__name__


def error_body(message: str, kind: str, code: int | str | None = None, error: BaseException | None = None) -> dict:
    """OpenAI's error shape; `specdeck_type` names the engine's exception class, which SpecDeck's
    client raises again (engine/service/client.py)."""
    body = {"message": message, "type": kind, "code": code}
    if isinstance(error, SpecDeckError):
        body["specdeck_type"] = type(error).__name__
    return {"error": body}


def error_response(status: int, message: str, kind: str, error: BaseException | None = None) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(error_body(message, kind, status, error), status_code=status, headers=headers)


def validation_message(error: RequestValidationError) -> str:
    """Pydantic's findings in a sentence: which field, and what is wrong with it."""
    parts = []
    for finding in error.errors():
        where = ".".join(str(p) for p in finding.get("loc", ()) if p != "body") or "the body"
        if finding.get("type") == "extra_forbidden":
            parts.append(f"unknown field '{where}'")
        elif finding.get("type") == "json_invalid":
            parts.append("the body is not valid JSON")
        else:
            parts.append(f"'{where}': {finding.get('msg', 'invalid')}")
    return "Bad request: " + "; ".join(parts) + "."


class BadRequest(SpecDeckError):
    """A request the server understood but cannot serve as asked (a 400)."""


class NoEngine(SpecDeckError):
    """No model is loaded yet (a 409: load one first)."""


def require_engine(host: Host):
    if host.engine is None:
        raise NoEngine("No model is loaded on this server. Load one first (POST /specdeck/load).")
    return host.engine


# -- server-sent events ---------------------------------------------------------------------------


async def event_stream(items: AsyncIterator[Any], *, done: str | None = "[DONE]") -> StreamingResponse:
    """A stream of `items` (dicts) as server-sent events, ending with `data: {done}` (OpenAI's
    `[DONE]`): a client that reads to the end of a stream without it knows the server went away.

    The first item is awaited before the response starts, so that an error the job raises at
    once (a prompt longer than the context, a bad option) is a plain 4xx, not a stream."""
    try:
        first = await items.__anext__()
    except StopAsyncIteration:
        first = None
    return StreamingResponse(_sse(first, items, done), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip


async def _sse(first, items: AsyncIterator[Any], done: str | None):
    try:
        if first is not None:
            yield _data(first)
            async for item in items:
                yield _data(item)
    except SpecDeckError as error:
        yield _data(error_body(str(error), error_type(error), status_of(error), error))
    except Exception as error:  # noqa: BLE001 - the client gets a last word, the log the details
        log.exception("a streamed job failed")
        yield _data(error_body(f"Unexpected error in the engine ({type(error).__name__}: {error}).", "internal_error",
                               500))  # fmt: skip
    finally:
        await items.aclose()
    if done is not None:
        yield f"data: {done}\n\n".encode()


def _data(item: Any) -> bytes:
    """One event; an item already encoded (bytes, as the steps of /specdeck/generate are, on the
    engine's thread) is sent as it is."""
    return b"data: " + (item if isinstance(item, bytes) else wire.dumps(item)) + b"\n\n"
