"""Several load-balancer processes on one port (SO_REUSEPORT): the port is shared only when each asks, and the
kernel spreads new connections over the servers sharing it."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from skyserve_lite.clock import FakeClock
from skyserve_lite.lb.listener import bind_listening_sockets
from skyserve_lite.lb.proxy import LoadBalancer
from skyserve_lite.lb.server import HttpServer
from skyserve_lite.state.models import LbView

from .serving import StaticSource, serve_app

pytestmark = pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="the platform has no SO_REUSEPORT")


def _close(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def test_a_port_is_shared_only_when_every_socket_asks() -> None:
    first = bind_listening_sockets("127.0.0.1", 0, reuse_port=True)
    port = first[0].getsockname()[1]
    try:
        second = bind_listening_sockets("127.0.0.1", port, reuse_port=True)
        try:
            assert second[0].getsockname()[1] == port
        finally:
            _close(second)
        with pytest.raises(OSError):
            _close(bind_listening_sockets("127.0.0.1", port))
    finally:
        _close(first)
    plain = bind_listening_sockets("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            _close(bind_listening_sockets("127.0.0.1", plain[0].getsockname()[1], reuse_port=True))
    finally:
        _close(plain)


def _answering(text: str) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/", handle)
    return app


@pytest.mark.timeout(60)
def test_two_load_balancers_on_one_port_both_take_connections() -> None:
    asyncio.run(_two_load_balancers_on_one_port())


async def _two_load_balancers_on_one_port() -> None:
    async with serve_app(_answering("a")) as url_a, serve_app(_answering("b")) as url_b:
        servers = []
        port = 0
        try:
            for url in (url_a, url_b):
                lb = LoadBalancer("svc", StaticSource(LbView((url,), "round_robin")), None, FakeClock(0.0))
                await lb.start()
                server = HttpServer(lb)
                servers.append((server, lb))
                port = (await server.start("127.0.0.1", port, reuse_port=True))[0][1]
            seen = []
            for _ in range(40):  # a new connection each: the kernel picks a server for each
                async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as response:
                    assert response.status == 200
                    seen.append(await response.text())
            assert set(seen) == {"a", "b"}, seen
        finally:
            for server, lb in servers:
                await server.close()
                await lb.close()
