"""The remote-adapter tests. `FakeServer` is shared by the vLLM and SGLang ones: a real HTTP server on a
free loopback port that answers each path as the test's fixture says, with the framing those servers
use (JSON with a length; SSE streamed in chunked transfer encoding, as uvicorn sends it)."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Stream:
    """A streamed answer: `events` (dicts as JSON, strings as they are) then `data: [DONE]`. With
    `break_after` the connection ends after that many events, in the middle of the chunked body:
    `how` "reset" as a killed process's socket may (RST, once the client has had time to read what was
    sent), "close" as a process that closes it (FIN, no terminating chunk)."""

    events: list
    break_after: int | None = None
    how: str = "reset"


@dataclass
class Reply:
    status: int = 200
    body: object = None  # a dict or list: JSON; a str: text
    content_type: str = "application/json"


RESET_AFTER_S = 0.5
Route = Callable[[dict], "Reply | Stream"]  # the request's JSON body (or {}) -> the answer


@dataclass
class FakeServer:
    """`with FakeServer({"/v1/models": lambda body: Reply(body=...)}) as server:` ... `server.url`.
    `api_key`: paths for which `protected(path)` holds answer 401 without it; `requests` records
    (method, path, body) in order."""

    routes: dict[str, Route]
    api_key: str | None = None
    protected: Callable[[str], bool] = lambda path: True
    requests: list = field(default_factory=list)

    def __enter__(self) -> FakeServer:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="fake-server")
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def paths(self, method: str = "POST") -> list[str]:
        return [path for m, path, _ in self.requests if m == method]


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _handler(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self._answer("GET", {})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer("POST", json.loads(raw) if raw else {})

        def _answer(self, method: str, body: dict) -> None:
            path = self.path.split("?", 1)[0]
            server.requests.append((method, path, body))
            if (
                server.api_key
                and server.protected(path)
                and self.headers.get("Authorization") != f"Bearer {server.api_key}"
            ):
                return self._send(Reply(401, {"error": "Unauthorized"}))  # vLLM's and SGLang's middleware
            route = server.routes.get(path)
            if route is None:
                return self._send(Reply(404, {"detail": "Not Found"}))  # FastAPI's
            answer = route(body)
            if isinstance(answer, Stream):
                return self._stream(answer)
            self._send(answer)

        def _send(self, reply: Reply) -> None:
            data = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
            payload = data.encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _stream(self, stream: Stream) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            events = [e if isinstance(e, str) else json.dumps(e) for e in stream.events] + ["[DONE]"]
            for n, event in enumerate(events):
                if stream.break_after is not None and n == stream.break_after:
                    self.close_connection = True
                    if stream.how == "reset":
                        time.sleep(RESET_AFTER_S)  # a reset drops what the client has not read yet
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        self.connection.close()
                    else:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                piece = f"data: {event}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler
