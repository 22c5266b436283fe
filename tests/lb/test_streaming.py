"""Streaming through the load balancer: server-sent events and chunked bodies pass as the replica produces
them, and WebSocket connections pass through to the replica.

The replica is a small aiohttp app on 127.0.0.1 that notes when it wrote each chunk; the client notes when
each arrived. Timing is asserted loosely, for a noisy shared machine: every chunk must reach the client
before the replica writes the chunk three places after it (300 ms later), which a load balancer that
buffered the body, or any part of it, cannot do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from skyserve_lite.clock import FakeClock
from skyserve_lite.lb.proxy import LbView, LoadBalancer
from skyserve_lite.lb.server import HttpServer

CHUNKS = 10
INTERVAL = 0.1
# A chunk must arrive before the replica has written this many more.
LEAD = 3


@dataclass
class Replica:
    written: list[float] = field(default_factory=list)  # when each chunk was written, monotonic
    websockets_open: int = 0


def _replica_app(replica: Replica) -> web.Application:
    async def events(request: web.Request) -> web.StreamResponse:
        """Server-sent events, or (``?kind=chunked``) a plain chunked body: 10 chunks 100 ms apart."""
        sse = request.query.get("kind", "sse") == "sse"
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream" if sse else "application/octet-stream"}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        for index in range(CHUNKS):
            if index:
                await asyncio.sleep(INTERVAL)
            await response.write(f"data: {index}\n\n".encode() if sse else f"<{index}>".encode())
            replica.written.append(time.monotonic())
        await response.write_eof()
        return response

    async def echo(request: web.Request) -> web.WebSocketResponse:
        """Echoes every message; first says hello and sends 3 messages of its own unasked."""
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        replica.websockets_open += 1
        try:
            await ws.send_str(f"hello {request.headers.get('X-Forwarded-For')}")
            for index in range(3):
                await ws.send_str(f"push {index}")
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await ws.send_str(f"echo {message.data}")
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await ws.send_bytes(message.data[::-1])
        finally:
            replica.websockets_open -= 1
        return ws

    app = web.Application()
    app.router.add_get("/events", events)
    app.router.add_get("/ws", echo)
    return app


class _Static:
    def __init__(self, url: str) -> None:
        self.view = LbView((url,), "least_load")

    def read(self) -> LbView:
        return self.view


@contextlib.asynccontextmanager
async def _through_lb(replica: Replica) -> AsyncIterator[tuple[str, LoadBalancer]]:
    """The replica behind an in-process load balancer; yields the load balancer's url and itself."""
    runner = web.AppRunner(_replica_app(replica), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        lb = LoadBalancer("svc", _Static(f"http://{host}:{port}"), None, FakeClock(0.0), hold_seconds=0)
        server = HttpServer(lb)
        await lb.start()
        try:
            lb_host, lb_port = (await server.start("127.0.0.1", 0))[0]
            yield f"http://{lb_host}:{lb_port}", lb
        finally:
            lb.stop_holding()
            await server.close()
            await lb.close()
    finally:
        await runner.cleanup()


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


async def _wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("kind", "separator"), [("sse", b"\n\n"), ("chunked", b">")], ids=["sse", "chunked"])
def test_events_and_chunks_reach_the_client_as_the_replica_writes_them(kind: str, separator: bytes) -> None:
    async def body() -> None:
        replica = Replica()
        async with _through_lb(replica) as (url, _lb), aiohttp.ClientSession() as client:
            arrived: list[float] = []
            received = b""
            started = time.monotonic()
            async with client.get(f"{url}/events?kind={kind}") as response:
                assert response.status == 200
                assert response.headers["Transfer-Encoding"] == "chunked"
                async for data in response.content.iter_any():
                    received += data
                    # A read may hold more than one chunk on a slow machine: each counts as arrived now.
                    while len(arrived) < received.count(separator):
                        arrived.append(time.monotonic())
        expected = b"".join(
            f"data: {index}\n\n".encode() if kind == "sse" else f"<{index}>".encode() for index in range(CHUNKS)
        )
        assert received == expected
        assert len(arrived) == len(replica.written) == CHUNKS
        for index in range(CHUNKS - LEAD):
            assert arrived[index] < replica.written[index + LEAD], (
                f"chunk {index} arrived {arrived[index] - started:.3f} s after the request, after the replica "
                f"wrote chunk {index + LEAD} at {replica.written[index + LEAD] - started:.3f} s"
            )

    _run(body)


@pytest.mark.timeout(60)
def test_a_websocket_passes_through_both_ways_and_ends_with_its_connection() -> None:
    async def body() -> None:
        replica = Replica()
        async with _through_lb(replica) as (url, lb), aiohttp.ClientSession() as client:
            async with client.ws_connect(f"{url}/ws") as ws:
                assert (await ws.receive_str(timeout=10)) == "hello 127.0.0.1"
                for index in range(3):  # sent by the replica unasked
                    assert (await ws.receive_str(timeout=10)) == f"push {index}"
                for index in range(20):
                    await ws.send_str(f"message {index}")
                    assert (await ws.receive_str(timeout=10)) == f"echo message {index}"
                big = bytes(range(256)) * 1024  # 256 KiB: more than a socket read and the buffers' limits
                await ws.send_bytes(big)
                assert (await ws.receive_bytes(timeout=10)) == big[::-1]
                assert dict(lb.in_flight()) == {url_of(lb): 1}
            await _wait_until(lambda: replica.websockets_open == 0)
            await _wait_until(lambda: dict(lb.in_flight()) == {url_of(lb): 0})

    _run(body)


@pytest.mark.timeout(60)
def test_a_refused_websocket_handshake_is_relayed_and_the_connection_closed() -> None:
    async def body() -> None:
        replica = Replica()
        async with _through_lb(replica) as (url, lb), aiohttp.ClientSession() as client:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(f"{url}/nowhere")
            assert refused.value.status == 404
            await _wait_until(lambda: dict(lb.in_flight()) == {url_of(lb): 0})
            # The load balancer still serves plain requests and other handshakes.
            async with client.get(f"{url}/events?kind=chunked") as response:
                assert response.status == 200
            async with client.ws_connect(f"{url}/ws") as ws:
                hello = await ws.receive_str(timeout=10)
                assert hello == "hello 127.0.0.1"

    _run(body)


def url_of(lb: LoadBalancer) -> str:
    """The one replica url the load balancer reports in flight counts for."""
    (url, _), = lb.in_flight()
    return url
