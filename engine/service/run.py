"""Running the server: bind, say where, serve until stopped.

The socket is bound here, before uvicorn starts, so that port 0 (any free port)
works and the chosen port can be announced on standard output in one line that
a parent process reads (`LISTENING_PREFIX`): how the desktop app learns where
its private engine listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import sys
import threading
import time

from engine.backends import threads
from engine.errors import ConfigError
from engine.service.host import Host
from engine.service.limits import Limits

LISTENING_PREFIX = "SPECDECK_LISTENING"
ACCEPT_QUEUE = 2048  # connections the kernel holds before they are accepted (capped by net.core.somaxconn)
LOOPBACK = "127.0.0.1"


def check_bind(address: str, api_key: str | None) -> None:
    """Anything but loopback only with an API key: a server on a network without one lets anyone
    on that network use the machine's models."""
    if is_loopback(address) or api_key:
        return
    raise ConfigError(
        f"Binding to {address} makes the engine reachable from other machines: give it an API key "
        "(--api-key KEY, or $SPECDECK_API_KEY), or keep the default --host 127.0.0.1."
    )


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def bind(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as error:
        sock.close()
        raise ConfigError(
            f"Cannot listen on {address}:{port} ({error.strerror}). Choose another --port, or "
            "stop the program that uses it."
        ) from error
    sock.listen(128)  # connections.BACKLOG, which uvicorn sets again
    return sock


def serve(
    host: Host,
    *,
    address: str = LOOPBACK,
    port: int = 0,
    api_key: str | None = None,
    model_name: str | None = None,
    announce: bool = True,
    log_level: str = "warning",
    sock: socket.socket | None = None,
    limits: Limits | None = None,
    host_names: tuple[str, ...] = (),
    paths=None,
) -> None:
    """Serve `host` until interrupted (Ctrl+C, SIGTERM); closes its engine at the end. `sock`: a socket
    `bind` made already (specdeck-cli serve binds before loading, so a busy port is said at once).
    `limits`: the bounds on requests and connections; `host_names`: Host names to answer to besides
    `address`'s own (limits.allowed_hosts)."""
    import uvicorn

    from engine.service.connections import BACKLOG, connection_limit, guarded_protocol, quiet_floods
    from engine.service.server import create_app

    check_bind(address, api_key)
    limits = limits or Limits()
    sock = sock or bind(address, port)
    app = create_app(
        host, api_key=api_key, model_name=model_name, limits=limits, address=address, host_names=host_names, paths=paths
    )
    protocol = guarded_protocol(connection_limit(limits.max_connections), limits.header_timeout_s)
    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, timeout_graceful_shutdown=3, http=protocol, backlog=BACKLOG
    )
    quiet_floods()
    server = _server_class(uvicorn)(config)
    if announce:
        chosen = sock.getsockname()[1]
        print(f"{LISTENING_PREFIX} {address}:{chosen}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        if host.engine is not None:
            host.engine.close()
            host.engine = None


def exit_with_parent(parent_pid: int, poll_s: float = 1.0) -> None:
    """End this process when `parent_pid` is gone: the app's engine must not outlive a crashed window."""

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                os._exit(0)  # the models' memory is freed by the kernel; nothing else is held

    threading.Thread(target=watch, name="specdeck-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.service`: the app's private engine, no model until asked for one."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m engine.service", description=main.__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument(
        "--client-paths",
        action="store_true",
        help="take file paths from the one client holding the key (the app's own engine: paths.py)",
    )
    args = parser.parse_args(argv)
    if args.parent_pid:
        exit_with_parent(args.parent_pid)
        # The window's CPU is the engine's own when choosing threads: it is busy for a moment at
        # each Send, just when the engine measures the free cores.
        threads.add_companion(args.parent_pid)
    # The key comes by environment, not the command line, where every user of the machine can read it.
    api_key = os.environ.get("SPECDECK_API_KEY") or None
    from engine.service.paths import ServerPaths

    try:
        paths = ServerPaths.trusting_client() if args.client_paths else None  # None: specdeck-cli serve's rules
        # The app's engine (--client-paths) has one client, the window, which loads its pair again itself
        # once a benchmark or training dialog is done with the memory: no reload between its jobs.
        serve(Host(reload_after_jobs=not args.client_paths), port=args.port, api_key=api_key, paths=paths)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


TICK_S = 1.0  # how often the server's loop does its housekeeping when nothing else wakes it


def _server_class(uvicorn):
    """uvicorn's Server, with its housekeeping (the Date header, the exit check) once a second
    instead of ten times: while a reply streamed the ticks were half of what the loop took, on the
    cores the engine decodes on (docs/benchmarks.md, "Measurements behind the code"). A signal to stop (Ctrl+C, SIGTERM) still stops it at once: it wakes the loop."""

    class Server(uvicorn.Server):
        _wake: tuple | None = None  # (the loop, the event that ends a tick's wait early)

        async def main_loop(self) -> None:
            wake = asyncio.Event()
            self._wake = (asyncio.get_running_loop(), wake)
            counter = 0  # in tenths of a second, as on_tick counts (its Date header: every 10)
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + round(TICK_S * 10)) % 864000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), TICK_S)
                should_exit = await self.on_tick(counter)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            for sock in sockets or []:
                # asyncio listened with uvicorn's backlog, which is also how many connections it accepts
                # in one go (file descriptors at once); the kernel's queue may be deeper, for free: a
                # burst of connections then waits there instead of each one's SYN being dropped and
                # retried a second later.
                sock.listen(ACCEPT_QUEUE)

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            if self._wake is not None:
                loop, wake = self._wake
                with contextlib.suppress(RuntimeError):  # the loop has closed
                    loop.call_soon_threadsafe(wake.set)

    return Server
