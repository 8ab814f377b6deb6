"""Loopback ports for the server processes that ``kvstores demo`` and ``kvstores bench`` start.

Choosing a free port and letting the server bind it later leaves a window in which another process
takes the port (an outgoing connection's ephemeral port, another server started at the same time),
and the server exits with "address already in use". Here the port is bound from the moment it is
chosen: the socket is handed to the server process (``pass_fds``), which listens on it (uvicorn:
``Server.serve(sockets=[socket.socket(fileno=FD)])``; HAProxy: ``bind fd@FD``), and the parent
closes its copy once the process has started. Until the server listens, a connection to the port is
refused, so waiting for a connection still means waiting until it serves.
"""

from __future__ import annotations

import socket

__all__ = ["bound_socket", "tcp_socket"]


def tcp_socket(family: socket.AddressFamily = socket.AF_INET) -> socket.socket:
    """A TCP socket to listen on, for a server in this process (uvicorn's ``serve(sockets=[...])``).

    Its protocol is named, not left 0: asyncio sets TCP_NODELAY only on connections whose socket says
    IPPROTO_TCP, and an accepted connection inherits the listener's. Without it every response written
    in two parts (headers, then body) waits for the client's delayed ACK: 40 ms per keep-alive request.
    (A socket rebuilt from an inherited fd reads its protocol from the kernel, so it is right either way.)
    """
    return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)


def bound_socket() -> socket.socket:
    """A TCP socket bound to a free port of 127.0.0.1, not yet listening: hand its fd to a server process."""
    sock = tcp_socket()
    try:
        sock.bind(("127.0.0.1", 0))
    except OSError:
        sock.close()
        raise
    return sock
