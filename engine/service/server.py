"""The engine server: one `Host`, HTTP routes over it, and the rules every route shares.

Routes: `routes_specdeck` (load, generate and compare with every step on the
wire, cancel, the pair dialog's preflight: what the desktop app uses), `routes_jobs` (benchmark, auto-tune,
training), `routes_openai` (`/v1/...`, what any OpenAI client uses), `/health`
and `/metrics`. Shared rules:

- Every request is checked first by `limits.Guard`: a Host header that names this
  server, `Content-Type: application/json` on every POST, a body within the limit.
  Connections are bounded in number and in how long their headers may take
  (connections.py).
- With an API key, every route but `/health` wants `Authorization: Bearer KEY`.
- An engine error is the engine's own message with a 4xx status, in OpenAI's
  error shape (errors.py): `{"error": {"message", "type", "code"}}`. Unknown
  fields, bad JSON and bad values are 400, a full queue 503, a missing key 401;
  an error nobody expected is a 500 in the same shape, its traceback in the log only.
- Streams are server-sent events: one `data: {json}` per item, then `data: [DONE]`.
  An error after the stream has started is its last item, `{"error": {...}}`.
"""

from __future__ import annotations

import hmac
import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from engine.errors import SpecDeckError
from engine.service.errors import (  # noqa: F401 (the routes' names for them)
    BadRequest,
    NoEngine,
    ServerBusy,
    error_body,
    error_response,
    error_type,
    status_of,
)
from engine.service.host import Host
from engine.service.http import (  # noqa: F401 (the routes' helpers: http.py, below the routes, which import it)
    BODY_UNREADABLE,
    FASTAPI_PARSE_ERROR,
    event_stream,
    parse_json,
    require_engine,
    validation_message,
)
from engine.service.limits import Guard, Limits, allowed_hosts

OPEN_PATHS = ("/health",)  # answered without the API key: a supervisor polls it
MIN_KEY_LENGTH = 16


def create_app(
    host: Host,
    *,
    api_key: str | None = None,
    model_name: str | None = None,
    limits: Limits | None = None,
    address: str = "127.0.0.1",
    host_names: tuple[str, ...] = (),
    paths=None,
) -> FastAPI:
    """The server's ASGI app; `model_name` is the id `/v1/models` lists (default: the target's name).
    It answers to the Host names of `address` (the address it is bound to) and `host_names`
    (limits.allowed_hosts)."""
    app = FastAPI(title="SpecDeck engine", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.host = host
    app.state.model_name = model_name
    from engine.service.paths import server_paths

    app.state.paths = server_paths(paths, host, api_key)  # what a request may name on this machine (paths.py)
    app.state.limits = limits = limits or Limits()

    if api_key:
        check_key(api_key)
        app.add_middleware(RequireKey, api_key=api_key)
    # Added last, so outermost: a foreign Host or a text/plain POST is refused before the key is
    # looked at, and no route ever sees a body over the limit.
    app.add_middleware(Guard, limits=limits, allowed=allowed_hosts(address, host_names))

    @app.exception_handler(SpecDeckError)
    async def engine_error(request: Request, error: SpecDeckError):
        return error_response(status_of(error), str(error), error_type(error), error)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, error: RequestValidationError):
        return error_response(400, validation_message(error), "invalid_request_error")

    @app.exception_handler(json.JSONDecodeError)
    async def bad_json(request: Request, error: json.JSONDecodeError):
        return error_response(
            400, f"The request body is not valid JSON ({error.msg} at character {error.pos}).", "invalid_request_error"
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        # FastAPI's own: an unknown route (404), a wrong method (405), a body it could not parse.
        message = {
            FASTAPI_PARSE_ERROR: BODY_UNREADABLE,
            "Not Found": f"There is no {request.url.path} on this server.",
            "Method Not Allowed": f"{request.url.path} does not take {request.method} requests.",
        }.get(error.detail, str(error.detail))
        return error_response(
            error.status_code, message, "invalid_request_error" if error.status_code < 500 else "internal_error"
        )

    from engine.service import metrics, routes_jobs, routes_specdeck

    app.include_router(routes_specdeck.router)
    app.include_router(routes_jobs.router)
    app.include_router(metrics.router)
    from engine.service import routes_openai

    app.include_router(routes_openai.router)
    return app


def check_key(api_key: str) -> None:
    """A key short enough to guess is no key: refuse it, and say how to make a good one."""
    from engine.errors import ConfigError

    if len(api_key) < MIN_KEY_LENGTH:
        raise ConfigError(
            f"The API key is {len(api_key)} characters long; use at least {MIN_KEY_LENGTH} (a short key can be "
            'guessed). Make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )


class RequireKey:
    """Every route but OPEN_PATHS wants `Authorization: Bearer KEY`, else a 401 that says so.

    The scheme's name is case-insensitive (RFC 6750: "bearer KEY" is the same); the key is compared
    in constant time, so how long a wrong key takes to refuse says nothing about the right one.

    Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware hands every
    chunk of a streamed reply through a memory stream and a task of its own, on the event loop
    that competes with the decoding threads for the cores."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self._expected = app, api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            scheme, _, key = given.strip().partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(key.strip(), self._expected):
                what = "is missing" if not given else "is wrong"
                response = error_response(
                    401,
                    f"The API key {what}: send 'Authorization: Bearer <key>', the key the server was started with.",
                    "authentication_error",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
