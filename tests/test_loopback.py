"""kvstores._loopback: the sockets kvstores' own servers (the dashboard, demo and bench servers) listen on."""

from __future__ import annotations

import asyncio
import socket

import pytest

from kvstores._loopback import bound_socket, tcp_socket

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves on asyncio, whose transports decide TCP_NODELAY


@pytest.mark.parametrize("make", [tcp_socket, bound_socket], ids=["tcp_socket", "bound_socket"])
async def test_a_connection_accepted_on_a_listening_socket_sends_without_delay(make: object) -> None:
    """Every connection a server accepts on these sockets has TCP_NODELAY: asyncio sets it only where the
    socket names IPPROTO_TCP (``socket.socket()`` leaves 0), and without it each response written in two
    parts waited 40 ms for the client's delayed ACK (the dashboard's keep-alive requests took 44 ms, not 1)."""
    assert callable(make)
    sock = make()
    with sock:
        if sock.getsockname()[1] == 0:
            sock.bind(("127.0.0.1", 0))
        nodelay: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nodelay.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname())
            try:
                assert await nodelay != 0
            finally:
                writer.close()
                await writer.wait_closed()
