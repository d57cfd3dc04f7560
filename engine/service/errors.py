"""The server's errors in OpenAI's shape: `{"error": {"message", "type", "code"}}`, and their statuses.

An engine error is the engine's own message with a 4xx status. Unknown fields, bad
JSON and bad values are 400, a full queue 503, a missing key 401, no model loaded
409; anything the server did not expect is a 500 with one sentence, never a traceback
(the log has the details).
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from engine.errors import ConfigError, ContextOverflowError, SpecDeckError


class BadRequest(SpecDeckError):
    """A request the server understood but cannot serve as asked (a 400)."""


class NoEngine(SpecDeckError):
    """No model is loaded yet (a 409: load one first)."""


class ServerBusy(SpecDeckError):
    """The queue of waiting requests is full."""


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
