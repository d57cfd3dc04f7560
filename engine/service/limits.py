"""What a request may be, checked before any route sees it: who it is addressed to, what it is, how big.

`Limits` holds every bound a server keeps (one frozen record, set by `specdeck-cli
serve`'s flags); `Guard` is the outermost ASGI layer that applies the per-request
ones, in this order:

1. **Host.** The Host header must name this server: a loopback name (localhost,
   127.0.0.1, [::1], *.localhost) for a server bound to loopback, else the bound
   address or a name given with `--allowed-host`. A web page that points its own
   domain at 127.0.0.1 (DNS rebinding) sends its domain as Host, and is refused.
2. **Content-Type.** Every POST must say `application/json`. A browser sends a
   cross-site "simple" request (text/plain, a form) without asking first; one with
   application/json it must ask about (a CORS preflight, which this server never
   grants), so no web page can make it generate, load or unload.
3. **Body size and time.** A body larger than `max_body_bytes` is refused (413)
   before it is read when Content-Length says so, and as soon as it passes the
   limit otherwise; a body that takes longer than `body_timeout_s` to arrive is 408.
   The body is read here in full (every route reads it whole anyway) and handed on.

Errors are OpenAI's shape, as every other error of the server (server.error_response).
The per-connection limits (how many, how long the headers may take) are
connections.py's; the message count is checked where messages are read
(`check_message_count`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
JSON_TYPES = ("application/json",)


@dataclass(frozen=True)
class Limits:
    """Every bound a server keeps; the defaults are `specdeck-cli serve`'s."""

    max_body_bytes: int = 8 * 1024 * 1024  # a long chat is ~100 KB; 8 MB leaves room for benchmark prompts
    body_timeout_s: float = 60.0  # the whole body, once the headers have come
    max_messages: int = 1024  # per chat request: more than any context holds as whole turns
    max_connections: int = 256  # open at once; the oldest idle one makes room for a new one
    header_timeout_s: float = 10.0  # from connecting (or the end of the last reply) to a request's whole headers
    generation_timeout_s: float = 1800.0  # one generation's wall time, queue wait excluded

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_messages", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("body_timeout_s", "header_timeout_s", "generation_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0 seconds, got {getattr(self, name)}")


def allowed_hosts(address: str, extra: tuple[str, ...] = ()) -> frozenset[str] | None:
    """The Host names a server bound to `address` answers to; None: any (a server bound to every
    address, 0.0.0.0 or ::, which `run.check_bind` lets run only with an API key)."""
    if "*" in extra or address in ("0.0.0.0", "::", ""):
        return None
    names = set(LOOPBACK_NAMES) | {name.lower().strip("[]") for name in extra}
    names.add(address.lower().strip("[]"))
    return frozenset(names)


def host_name(header: str) -> str:
    """The name in a Host header, without its port: "example.com:80" -> "example.com", "[::1]:8000" -> "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        return header.partition(":")[0]
    return header  # a bare name, or a bare IPv6 address


def host_allowed(name: str, allowed: frozenset[str] | None) -> bool:
    if allowed is None:
        return True
    if name in allowed or (name.endswith(".localhost") and "localhost" in allowed):
        return True
    try:  # 127.0.0.2 and the like are loopback too
        return "127.0.0.1" in allowed and ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_json(content_type: str) -> bool:
    """application/json, with or without parameters (charset=utf-8), in any case."""
    return content_type.partition(";")[0].strip().lower() in JSON_TYPES


def error_response(*args):
    from engine.service.errors import error_response  # fastapi: only once a server runs, not for the CLI's flags

    return error_response(*args)


def limits_of(request) -> Limits:
    """The limits of the server `request` came to (create_app keeps them in its state)."""
    return getattr(request.app.state, "limits", None) or Limits()


def check_message_count(messages: list, limits: Limits) -> None:
    from engine.service.errors import BadRequest

    if len(messages) > limits.max_messages:
        raise BadRequest(
            f"Bad request: {len(messages)} messages is more than this server takes in one request "
            f"({limits.max_messages}). Send fewer (the oldest turns rarely matter), or start the server "
            "with a larger --max-messages."
        )


class Guard:
    """The outermost ASGI layer: Host, Content-Type and body limits (the module docstring)."""

    def __init__(self, app, limits: Limits, allowed: frozenset[str] | None) -> None:
        self.app, self.limits, self.allowed = app, limits, allowed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is None and scope["method"] in ("POST", "PUT", "PATCH"):
            body, refusal = await self._read_body(receive, headers)
            if refusal is None:
                receive = _replay(body, receive)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await _answered(self.app, scope, receive, send)

    def _refusal(self, scope, headers: dict[str, str]):
        name = host_name(headers.get("host", ""))
        if not host_allowed(name, self.allowed):
            shown = name or "(none)"
            return error_response(
                400,
                f"The Host header names {shown!r}, which is not this server. Reach it by the address it "
                "listens on (or a loopback name), or start it with --allowed-host NAME to answer to that name.",
                "invalid_request_error",
            )
        if scope["method"] in ("POST", "PUT", "PATCH") and not is_json(headers.get("content-type", "")):
            given = headers.get("content-type") or "none"
            return error_response(
                415,
                f"Bad request: the body must be JSON, sent with 'Content-Type: application/json' (this request "
                f"said {given!r}; with curl, add -H 'Content-Type: application/json').",
                "invalid_request_error",
            )
        return None

    async def _read_body(self, receive, headers: dict[str, str]) -> tuple[bytes, object]:
        limit = self.limits.max_body_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            return b"", _too_large(f"{_mb(int(length))}", limit)
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return b"", _gone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        return b"", _too_large(f"over {_mb(limit)}", limit)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks), None
        except TimeoutError:
            return b"", error_response(
                408,
                f"The request body did not arrive within {self.limits.body_timeout_s:g} seconds.",
                "invalid_request_error",
            )


async def _answered(app, scope, receive, send) -> None:
    """`app`, with whatever it raised and nobody handled turned into a 500 in OpenAI's shape: one
    sentence for the client, the traceback for the log (Starlette's own answer is plain text)."""
    started = False

    async def watched(message) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, receive, watched)
    except Exception as error:  # noqa: BLE001 - the last place a request's error can be answered
        log.exception("%s %s failed", scope.get("method"), scope.get("path"))
        if not started:
            response = error_response(
                500,
                f"Unexpected error in the server ({type(error).__name__}); the server's "
                "log has the details. Please report it.",
                "internal_error",
            )
            await response(scope, receive, send)


def _too_large(size: str, limit: int):
    return error_response(
        413,
        f"The request body is {size}, over this server's limit of {_mb(limit)}. Send less (fewer "
        "messages or prompts), or start the server with a larger --max-body-mb.",
        "invalid_request_error",
    )


def _mb(size: int) -> str:
    return f"{size / 2**20:.1f} MB" if size >= 2**20 else f"{size} bytes"


async def _gone(scope, receive, send) -> None:
    """The client left while sending its body: nothing to answer."""


def _replay(body: bytes, receive):
    """A receive that gives the body already read, then what the connection says next (a disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
