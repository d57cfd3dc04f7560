"""HTTP to an inference server, on the standard library: JSON requests and server-sent events.

Shared by every remote adapter (llama-server, vLLM, SGLang) and by the SpecDeck
server's own client (`engine/service/client.py`). Blocking: it runs on a worker
thread (the app) or the main one (the CLI). A stream is cancelled by closing its
connection, which is how llama-server, vLLM and SGLang are told to stop a request.

Every failure is a `ServerUnavailable` (nothing answers, the stream broke off, no
answer in time) or a `ServerRefused` (the server answered with an error) whose
message says what to do.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from engine.errors import ConfigError, SpecDeckError

CONNECT_TIMEOUT_S = 10.0


class ServerUnavailable(SpecDeckError):
    """The server cannot be reached, or stopped answering."""


class ServerRefused(SpecDeckError):
    """The server answered a request with an error status."""

    def __init__(self, message: str, status: int = 0, body: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, body or {}


@dataclass(frozen=True)
class Address:
    url: str  # scheme://host:port, without a path
    https: bool
    host: str
    port: int
    base: str  # a path prefix the server lives under ("" for none)


def parse_address(url: str) -> Address:
    """`url` ("http://127.0.0.1:8080", "localhost:8000", "https://host/prefix") as an Address;
    ConfigError for anything that is not a server address."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    try:
        port = parts.port  # ValueError for a port that is not a number ("...:8000:")
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise ConfigError(f"{url!r} is not a server address: give one like http://127.0.0.1:8000.")
    https = parts.scheme == "https"
    return Address(
        f"{parts.scheme}://{parts.netloc}",
        https,
        parts.hostname,
        port or (443 if https else 80),
        parts.path.rstrip("/"),
    )


class JsonServer:
    """One server: `get`/`post` JSON, `events` for a streamed POST. `name` says what the server is
    in messages ("llama-server at http://...")."""

    def __init__(self, url: str, api_key: str | None = None, name: str = "server") -> None:
        self.address = parse_address(url)
        self.url = self.address.url
        self.name = f"{name} at {self.url}"
        self.headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def get(self, path: str, timeout: float = 30.0) -> Any:
        return _json(self.get_text(path, timeout), self.name)

    def get_text(self, path: str, timeout: float = 30.0) -> str:
        connection = self.open(timeout)
        try:
            return self.send(connection, "GET", path).read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as error:
            raise self.unavailable(error) from error
        finally:
            connection.close()

    def post(self, path: str, body: Any, timeout: float | None = 300.0) -> Any:
        connection = self.open(timeout)
        try:
            return _json(self.send(connection, "POST", path, body).read(), self.name)
        except (OSError, http.client.HTTPException) as error:
            raise self.unavailable(error) from error
        finally:
            connection.close()

    def events(
        self, path: str, body: Any, cancel: threading.Event | None = None, timeout: float | None = 300.0
    ) -> Iterator[dict]:
        """The JSON `data:` items of POST `path`'s event stream, until `[DONE]` or the stream's end.
        Setting `cancel` closes the connection (the server stops the request) and ends the items."""
        connection = self.open(timeout)
        done = threading.Event()
        if cancel is not None:
            threading.Thread(
                target=_close_when_set, args=(cancel, done, connection), daemon=True, name="specdeck-remote-cancel"
            ).start()
        try:
            response = self.send(connection, "POST", path, body)
            for data in sse_payloads(response):
                if data == "[DONE]":
                    return
                yield _json(data, self.name)
            if cancel is None or not cancel.is_set():
                # Every one of these servers ends a stream with [DONE]: without it the server went
                # away, and the reply is cut short, not finished.
                raise ServerUnavailable(
                    f"The connection to the {self.name} broke off in the middle of the answer "
                    "(the stream ended without its end mark): the server stopped or was "
                    "stopped. What arrived is kept."
                )
        except (OSError, http.client.HTTPException, ValueError) as error:
            if cancel is not None and cancel.is_set():
                return  # we closed it
            raise self.unavailable(error, mid_stream=True) from error
        finally:
            done.set()
            connection.close()

    # -- plumbing ------------------------------------------------------------------------

    def open(self, timeout: float | None) -> http.client.HTTPConnection:
        try:
            return open_connection(self.address, timeout)
        except OSError as error:
            raise self.unavailable(error) from error

    def send(
        self, connection, method: str, path: str, body: Any = None, headers: dict | None = None
    ) -> http.client.HTTPResponse:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, self.address.base + path, body=payload, headers={**self.headers, **(headers or {})})
        response = connection.getresponse()
        if response.status >= 400:
            raise self.refused(response.status, response.reason, response.read())
        return response

    def refused(self, status: int, reason: str, data: bytes) -> ServerRefused:
        try:
            body = json.loads(data)
        except ValueError:
            body = {}
        error = body.get("error") if isinstance(body, dict) else None
        detail = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
        detail = detail or (body.get("message") or body.get("detail") if isinstance(body, dict) else None)
        if status == 401 or status == 403:
            text = (
                f"The {self.name} refused the API key ({status}{': ' + str(detail) if detail else ''}): "
                "give the key the server was started with."
            )
        elif status == 404:
            text = f"The {self.name} has no such endpoint (404): is the address right, and is it the kind of server chosen?"
        elif status == 503:
            text = f"The {self.name} is busy or still loading (503{': ' + str(detail) if detail else ''}): try again shortly."
        else:
            text = f"The {self.name} answered {status} {reason}" + (f": {detail}" if detail else ".")
        return ServerRefused(text, status, body if isinstance(body, dict) else {})

    def unavailable(self, error: BaseException, mid_stream: bool = False) -> ServerUnavailable:
        if isinstance(error, ConnectionRefusedError):
            return ServerUnavailable(
                f"Nothing answers at {self.url} (connection refused): start the server, or check the address and port."
            )
        if isinstance(error, socket.gaierror):
            return ServerUnavailable(f"No such host: {self.address.host} ({error.strerror}). Check the address.")
        if isinstance(error, (socket.timeout, TimeoutError)):
            return ServerUnavailable(f"The {self.name} did not answer in time: it may be overloaded; try again.")
        if mid_stream:
            return ServerUnavailable(
                f"The connection to the {self.name} broke off in the middle of the answer "
                f"({_reason(error)}): the server stopped or was stopped. What arrived is kept."
            )
        return ServerUnavailable(f"Cannot reach the {self.name} ({_reason(error)}).")


def open_connection(address: Address, timeout: float | None) -> http.client.HTTPConnection:
    """A connected socket to `address` (OSError where it cannot connect in CONNECT_TIMEOUT_S), then
    reading with `timeout` (None: a load or a long reply may take minutes between two items)."""
    kind = http.client.HTTPSConnection if address.https else http.client.HTTPConnection
    connection = kind(address.host, address.port, timeout=CONNECT_TIMEOUT_S)
    try:
        connection.connect()
    except OSError:
        connection.close()
        raise
    connection.sock.settimeout(timeout)
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # an event goes out at once
    return connection


def sse_payloads(response) -> Iterator[str]:
    """The `data:` payloads of a server-sent event stream, one per event."""
    lines: list[str] = []
    while True:
        raw = response.readline()
        if not raw:
            if lines:
                yield "\n".join(lines)
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
        elif line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))


def _close_when_set(cancel: threading.Event, done: threading.Event, connection) -> None:
    while not done.is_set():
        if cancel.wait(0.05):
            if not done.is_set():
                try:
                    connection.sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread at once
                except (OSError, AttributeError):
                    pass
            return


def _json(data: bytes | str, name: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as error:
        raise ServerUnavailable(
            f"The {name} did not answer with JSON: is that the right address and kind of server?"
        ) from error


def _reason(error: BaseException) -> str:
    return str(error) or type(error).__name__
