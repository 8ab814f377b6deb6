"""``kvstores dashboard [TARGET]``: serve the dashboard of a store with uvicorn, on 127.0.0.1 by default.

The operator token comes from ``$KVSTORES_DASHBOARD_TOKEN`` or ``--token-file`` (never the command
line, which other users of the machine can read). A non-loopback bind needs the token; a wildcard
bind (0.0.0.0, ::) also needs ``--allow-host`` naming how people reach it. This module imports
neither Starlette nor uvicorn until it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstores._loopback import tcp_socket
from kvstores.dashboard._guard import LOOPBACK_HOSTS

__all__ = ["DEFAULT_PORT", "TOKEN_VARIABLE", "Refused", "Settings", "add_arguments", "serve", "settings"]

DEFAULT_PORT = 8765
"""The port ``kvstores dashboard`` listens on unless told otherwise."""

TOKEN_VARIABLE = "KVSTORES_DASHBOARD_TOKEN"
"""The environment variable holding the operator token (cancelling a task needs it)."""


class Refused(ValueError):
    """The command line asks for something unsafe or impossible; the message says what (exit 2)."""


@dataclass(frozen=True)
class Settings:
    """Where and how the dashboard serves."""

    host: str
    port: int
    token: str | None
    hosts: tuple[str, ...]
    interval: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kvstores dashboard``."""
    parser.add_argument("target", nargs="?", metavar="TARGET", help="TARGET defaults to $KVSTORES_URL")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    parser.add_argument(
        "--token-file", type=Path, metavar="FILE", help=f"read the operator token from FILE (else ${TOKEN_VARIABLE})"
    )
    parser.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME", help="a host name it is reached by (repeatable)"
    )
    parser.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between samples (default 2)")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def settings(options: argparse.Namespace) -> Settings:
    """The settings ``options`` ask for; Refused when they are unsafe (a non-loopback bind without a token)."""
    token = os.environ.get(TOKEN_VARIABLE) or None
    if options.token_file is not None:
        try:
            token = options.token_file.read_text().strip() or None
        except OSError as exc:
            raise Refused(f"cannot read the token file: {exc.strerror}") from exc
    if token is not None and len(token) < 16:
        raise Refused("the operator token must be at least 16 characters long")
    host = options.host
    if not _loopback(host) and token is None:
        raise Refused(f"binding {host} (not loopback) needs an operator token: set {TOKEN_VARIABLE} or --token-file")
    wildcard = host in ("0.0.0.0", "::", "")
    if wildcard and not options.allow_host:
        raise Refused(f"binding {host or 'every address'} needs --allow-host NAME: the host names people reach it by")
    if not 0 <= options.port < 65_536:
        raise Refused(f"--port must be 0-65535, not {options.port}")
    if not options.interval > 0:
        raise Refused("--interval must be positive")
    hosts = (*LOOPBACK_HOSTS, *([] if wildcard else [host]), *options.allow_host)
    return Settings(host, options.port, token, tuple(dict.fromkeys(hosts)), options.interval)


async def serve(store: Any, spec: str, chosen: Settings) -> int:
    """Serve the dashboard of ``store`` (opened from ``spec``) until SIGTERM or Ctrl-C; the exit code."""
    import uvicorn

    from kvstores.dashboard import app

    family = socket.AF_INET6 if ":" in chosen.host else socket.AF_INET
    sock = tcp_socket(family)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((chosen.host.strip("[]"), chosen.port))
    except OSError as exc:
        sock.close()
        print(f"kvstores dashboard: cannot listen on {chosen.host}:{chosen.port}: {exc.strerror}", file=sys.stderr)
        return 1
    application = app(
        store,
        token=chosen.token,
        allowed_hosts=chosen.hosts,
        url=spec if "://" in spec else None,
        interval=chosen.interval,
    )
    config = uvicorn.Config(application, log_config=None, log_level="warning", access_log=False, lifespan="on")
    server = _server_class(uvicorn.Server)(config)
    port = sock.getsockname()[1]
    shown = f"[{chosen.host}]" if family == socket.AF_INET6 else chosen.host
    announce = asyncio.get_running_loop().create_task(_announce(server, f"http://{shown}:{port}/", chosen.token))
    try:
        with sock:
            await server.serve(sockets=[sock])
    finally:
        announce.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await announce
    return 0 if server.started else 1


def _server_class(base: type[Any]) -> type[Any]:
    """uvicorn's Server, stopping on SIGTERM and SIGINT without re-raising the signal afterwards (uvicorn's own
    does, so the process would die of it instead of closing its store and exiting 0)."""

    class Server(base):  # type: ignore[misc]
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """Ask the server to exit on SIGINT or SIGTERM (a second one forces it), for as long as it serves."""
            loop = asyncio.get_running_loop()
            for number in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(number, self.handle_exit, number, None)
            try:
                yield
            finally:
                for number in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(number)

    return Server


async def _announce(server: Any, url: str, token: str | None) -> None:
    while not server.started:  # noqa: ASYNC110 - uvicorn's Server has a flag, no event
        await asyncio.sleep(0.02)
    mode = "cancelling tasks needs the operator token" if token else "read-only"
    print(f"kvstores dashboard: serving {url} ({mode}); Ctrl-C stops it", flush=True)
