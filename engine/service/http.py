"""What the routes share with the server: reading a body, the engine a route needs, findings in a
sentence, and streams as server-sent events.

Below the server and every route module: server.py includes the routes' routers, and the routes
used to import these helpers from it, an import cycle through every route (issue 37, part 5).
The errors themselves, in OpenAI's shape, are errors.py's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse

from engine.errors import SpecDeckError
from engine.service import wire
from engine.service.errors import BadRequest, NoEngine, error_body, error_type, status_of

if TYPE_CHECKING:
    from engine.service.host import Host

log = logging.getLogger("engine.service.server")  # the server's log, where these lines always went

FASTAPI_PARSE_ERROR = "There was an error parsing the body"
BODY_UNREADABLE = (
    "The request body could not be read as JSON: it is nested too deeply (over ~900 levels), or "
    "holds a number too long to read (over 4,300 digits). Send plain JSON objects of ordinary size."
)


def parse_json(body: bytes) -> Any:
    """A request body as JSON; what the standard library cannot read is the server's 400, with a reason."""
    try:
        return json.loads(body or b"null")  # json.JSONDecodeError: the server's 400
    except UnicodeDecodeError:
        raise BadRequest("Bad request: the body is not UTF-8 text (JSON must be).") from None
    except (RecursionError, ValueError) as error:  # too deep; an integer past Python's 4,300 digits
        if isinstance(error, json.JSONDecodeError):
            raise
        raise BadRequest(BODY_UNREADABLE) from None


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
    return StreamingResponse(
        _sse(first, items, done),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


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
        yield _data(
            error_body(f"Unexpected error in the engine ({type(error).__name__}: {error}).", "internal_error", 500)
        )
    finally:
        await items.aclose()
    if done is not None:
        yield f"data: {done}\n\n".encode()


def _data(item: Any) -> bytes:
    """One event; an item already encoded (bytes, as the steps of /specdeck/generate are, on the
    engine's thread) is sent as it is."""
    return b"data: " + (item if isinstance(item, bytes) else wire.dumps(item)) + b"\n\n"
