"""The client-facing server at the protocol level: raw bytes in over a socket, raw bytes out.

What an HTTP client library would smooth over: pipelining, chunked uploads, 100-continue, malformed
requests, HEAD framing, and a client that reads a large response slowly. The backend is a small aiohttp
app; the load balancer runs on ``HttpServer``. The connection limit and the open-file limit are in
``test_limits.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
from aiohttp import web

from skyserve_lite.lb.http1 import MAX_HEAD_BYTES
from skyserve_lite.lb.proxy import LocalAnswer
from skyserve_lite.lb.server import describe_build, describe_loop, render_local_answer, render_response_head

from .serving import serving

BIG = 4 * 1024 * 1024
BIG_BODY = hashlib.sha256(b"server").digest() * (BIG // 32)


def _backend() -> web.Application:
    async def echo(request: web.Request) -> web.StreamResponse:
        if request.path == "/big":
            return web.Response(body=BIG_BODY)
        if request.path == "/stream":
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b"one,")
            await response.write(b"two")
            await response.write_eof()
            return response
        body = await request.read()
        if request.method == "HEAD":
            return web.Response(headers={"Content-Length": "42"})
        return web.json_response(
            {
                "path": request.path_qs,
                "size": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
                "te": request.headers.get("Transfer-Encoding"),
            }
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


@contextlib.asynccontextmanager
async def _serving(targets_alive: bool = True) -> AsyncIterator[tuple[str, int]]:
    async with serving(_backend(), targets_alive=targets_alive) as address:
        yield address


async def _read_response(reader: asyncio.StreamReader, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One response off the wire: status, headers (lower-case names), body (Content-Length or chunked)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if head_only or status in (100, 204, 304):
        return status, headers, b""
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            body += await reader.readexactly(size + 2)
            body = body[:-2]
            if size == 0:
                return status, headers, body
    return status, headers, await reader.read()


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


@pytest.mark.timeout(60)
def test_pipelined_requests_are_answered_in_order() -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"".join(f"GET /p{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(20)))
            writer.write(b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            for i in range(20):
                status, _, data = await _read_response(reader)
                assert (status, json.loads(data)["path"]) == (200, f"/p{i}")
            status, _, data = await _read_response(reader)
            assert json.loads(data)["size"] == 5
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
def test_requests_pipelined_before_a_last_one_are_all_answered_then_the_connection_closes() -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /p0 HTTP/1.1\r\nHost: x\r\n\r\nGET /p1 HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n")
            for path in ("/p0", "/p1", "/last"):
                status, headers, data = await _read_response(reader)
                assert (status, json.loads(data)["path"]) == (200, path)
            assert headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
def test_chunked_request_body_goes_to_the_replica_whole_and_chunked() -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (b"abc", b"defgh", b"i" * 70_000):
                writer.write(b"%x\r\n%b\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            status, _, data = await _read_response(reader)
            echoed = json.loads(data)
            assert status == 200
            assert echoed["sha256"] == hashlib.sha256(b"abcdefgh" + b"i" * 70_000).hexdigest()
            assert echoed["te"] == "chunked"
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"PUT /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
            status, _, _ = await _read_response(reader)
            assert status == 100
            writer.write(b"data")
            status, _, data = await _read_response(reader)
            assert (status, json.loads(data)["size"]) == (200, 4)
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
def test_an_unknown_expectation_gets_417_and_a_close() -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"PUT /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: magic\r\n\r\n")
            status, headers, _ = await _read_response(reader)
            assert (status, headers["connection"]) == (417, "close")
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "request_bytes",
    [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n"],
    ids=["request-line", "header", "content-length"],
)
def test_a_malformed_request_on_a_used_connection_gets_400_and_a_close(request_bytes: bytes) -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, data = await _read_response(reader)
            assert (status, json.loads(data)["path"]) == (200, "/first")
            writer.write(request_bytes)
            status, headers, text = await _read_response(reader)
            assert (status, headers["connection"]) == (400, "close")
            assert text.startswith(b"Bad request")
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
def test_a_request_head_beyond_the_bound_gets_400_and_a_close() -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\nX-Big: ")
            for _ in range(MAX_HEAD_BYTES // 8192 + 2):  # a header that never ends, 8 KiB at a time
                writer.write(b"a" * 8192)
                await writer.drain()
                await asyncio.sleep(0.01)
            status, headers, text = await _read_response(reader)
            assert (status, headers["connection"]) == (400, "close")
            assert f"request head larger than {MAX_HEAD_BYTES} bytes".encode() in text
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
def test_head_sends_the_replica_length_and_no_body_and_the_connection_stays_usable() -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, _ = await _read_response(reader, head_only=True)
            assert (status, headers["content-length"]) == (200, "42")
            status, _, data = await _read_response(reader)  # a body after the HEAD would garble this one
            assert (status, json.loads(data)["path"]) == (200, "/after")
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
def test_unknown_length_body_is_chunked_for_http11_and_close_delimited_for_http10() -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, data = await _read_response(reader)
            assert (status, headers["transfer-encoding"], data) == (200, "chunked", b"one,two")
            writer.close()
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /stream HTTP/1.0\r\n\r\n")
            status, headers, data = await _read_response(reader)
            assert (status, headers.get("connection"), data) == (200, "close", b"one,two")
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
def test_a_large_response_reaches_a_slow_client_intact() -> None:
    async def body() -> None:
        async with _serving() as (host, port):
            # A small receive buffer and pauses between reads make the load balancer wait on its write buffer.
            reader, writer = await asyncio.open_connection(host, port, limit=16 * 1024)
            writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert b"Content-Length: %d" % BIG in head
            received = bytearray()
            while len(received) < BIG:
                received += await asyncio.wait_for(reader.read(256 * 1024), 10)
                await asyncio.sleep(0.005)
            assert bytes(received) == BIG_BODY
            writer.close()

    _run(body)


@pytest.mark.timeout(60)
def test_no_replica_gives_503_and_an_unread_body_closes_the_connection() -> None:
    async def body() -> None:
        async with _serving(targets_alive=False) as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, _ = await _read_response(reader)
            assert (status, "connection" in headers) == (503, False)
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npartial")
            status, headers, _ = await _read_response(reader)
            assert (status, headers["connection"]) == (503, "close")
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()

    _run(body)


@pytest.mark.parametrize(
    ("headers", "extra", "expected"),
    [
        ({"A": "1", "Connection": "X-Hop", "X-Hop": "2", "Keep-Alive": "t"}, b"", b"HTTP/1.1 200 OK\r\nA: 1\r\n\r\n"),
        ({"Transfer-Encoding": "chunked"}, b"Connection: close\r\n", b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"),
        ({"Set-Cookie": "a=\udcff"}, b"", b"HTTP/1.1 200 OK\r\nSet-Cookie: a=\xff\r\n\r\n"),
        # A replica naming Content-Length in Connection does not take the body's framing away.
        ({"Connection": "content-length", "Content-Length": "2"}, b"", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"),
    ],
)
def test_render_response_head_table(headers: dict[str, str], extra: bytes, expected: bytes) -> None:
    from skyserve_lite.lb.http1 import RawHeaders

    raw = RawHeaders([(name.encode(), value.encode("utf-8", "surrogateescape")) for name, value in headers.items()])
    assert render_response_head(200, None, raw, extra) == expected


@pytest.mark.parametrize(("response", "hop_by_hop", "expected"), [
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nX-A: \xff b\r\n\r\nok", False,
     b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nX-A: \xff b\r\nConnection: close\r\n\r\n"),
    (b"HTTP/1.1 204 No Content\r\n\r\n", False, b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"),
    (b"HTTP/1.1 200 Fine\r\nKEEP-ALIVE: timeout=5\r\nContent-Length: 0\r\n\r\n", True,
     b"HTTP/1.1 200 Fine\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    (b"HTTP/1.1 200 OK\r\nConnection: x-hop\r\nX-Hop: 1\r\nContent-Length: 0\r\n\r\n", True,
     b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
], ids=["plain", "no-headers", "keep-alive", "connection-lists"])
def test_a_parsed_response_head_is_relayed_as_the_header_by_header_path_renders_it(
    response: bytes, hop_by_hop: bool, expected: bytes
) -> None:
    """The parser says whether a response has hop-by-hop headers; without any, its lines are relayed whole:
    the same bytes as looking at each header gives."""
    from skyserve_lite.lb.http1 import RawHeaders, ResponseParser

    from .recording_flow import RecordingFlow

    async def parse() -> None:
        parser = ResponseParser(RecordingFlow(), asyncio.get_running_loop(), 2**16)
        parser.begin(True, upgrade=False)
        found = parser.feed(response).response
        assert found is not None
        head = found[0]
        assert head.headers.hop_by_hop is hop_by_hop
        extra = b"Connection: close\r\n"
        rendered = render_response_head(head.status, head.reason, head.headers, extra)
        assert rendered == expected
        assert rendered == render_response_head(head.status, head.reason, RawHeaders(head.headers.raw), extra)

    asyncio.run(parse())


def test_requests_on_the_common_path_leave_no_reference_cycles() -> None:
    """A request answered in the callbacks frees its objects as it ends: none are left in reference cycles for
    the garbage collector, whose passes would then stall the event loop (one such cycle per request showed as
    a 15% longer p99 in benchmarks/lb_bench.py)."""

    async def run() -> int:
        async with _serving() as (host, port):
            reader, writer = await asyncio.open_connection(host, port)
            request = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
            for _ in range(5):  # the pooled connection is open: the next requests take the callback path
                writer.write(request)
                assert (await _read_response(reader))[0] == 200
            gc.collect()
            gc.disable()
            try:
                for _ in range(100):
                    writer.write(request)
                    assert (await _read_response(reader))[0] == 200
                left = gc.collect()
            finally:
                gc.enable()
            writer.close()
            return left

    assert asyncio.run(run()) < 100


def test_render_local_answer_head_only_keeps_the_length() -> None:
    rendered = render_local_answer(LocalAnswer(503, "no\n"), keep_alive=False, head_only=True)
    assert rendered.endswith(b"Content-Length: 3\r\nConnection: close\r\n\r\n")


def test_the_event_loop_is_named_for_the_log() -> None:
    loop = asyncio.new_event_loop()
    try:
        assert describe_loop(loop).startswith("asyncio's own")
    finally:
        loop.close()
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        assert describe_loop(loop) == "uvloop"
    finally:
        loop.close()


@pytest.mark.parametrize(("module_file", "said"), [
    ("/site-packages/skyserve_lite/lb/server.py", "interpreted"),
    ("/site-packages/skyserve_lite/lb/server.cpython-311-x86_64-linux-gnu.so", "compiled with mypyc"),
    ("C:/site-packages/skyserve_lite/lb/server.cp311-win_amd64.pyd", "compiled with mypyc"),
])
def test_the_log_says_whether_the_load_balancer_runs_compiled(module_file: str, said: str) -> None:
    assert describe_build(module_file) == said
