"""The pooled upstream client against a scripted raw HTTP backend on 127.0.0.1: framing, reuse, failures."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from skyserve_lite.lb.pooled_upstream import PooledUpstream
from skyserve_lite.lb.upstream import (
    UpstreamClient,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResetError,
    UpstreamResponse,
)

from .scripted import CLOSE, scripted_backend


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


async def _get(client: UpstreamClient, url: str, method: str = "GET", path: str = "/") -> tuple[int, bytes]:
    response = await client.request(url, method, path, b"", None)
    try:
        return response.status, await response.read()
    finally:
        response.release()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("answer", "method", "status", "body", "reused"),
    [
        (OK, "GET", 200, b"ok", True),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            "GET",
            200,
            b"abcde",
            True,
        ),
        # no length, no chunks: the body ends with the connection, which cannot be used again
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end<close>", "GET", 200, b"until the end", False),
        (b"HTTP/1.1 204 No Content\r\n\r\n", "DELETE", 204, b"", True),
        (b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n", "GET", 304, b"", True),
        # HEAD: the length is that of the body not sent
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", "HEAD", 200, b"", True),
        # informational answers are skipped
        (b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n" + OK, "GET", 200, b"ok", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", "GET", 200, b"ok", False),
    ],
    ids=["length", "chunked", "until-close", "204", "304", "head", "1xx", "connection-close"],
)
def test_response_framing_and_connection_reuse(
    answer: bytes, method: str, status: int, body: bytes, reused: bool
) -> None:
    async def run() -> None:
        async with scripted_backend(answer) as backend:
            client = PooledUpstream()
            try:
                for _ in range(3):
                    assert await _get(client, backend.url, method) == (status, body)
            finally:
                await client.close()
            assert backend.connections == (1 if reused else 3)

    _run(run)


@pytest.mark.timeout(30)
def test_request_head_body_and_framing_as_sent() -> None:
    async def run() -> None:
        async with scripted_backend(OK) as backend:
            client = PooledUpstream()
            try:
                headers = b"X-Name: caf\xc3\xa9\r\nContent-Type: text/plain\r\n"
                response = await client.request(backend.url, "POST", "/a%20b?q=1", headers, b"hello")
                response.release()
                response = await client.request(backend.url, "POST", "/empty", b"", None)
                response.release()
            finally:
                await client.close()
            first, second = backend.requests
            assert first.startswith(b"POST /a%20b?q=1 HTTP/1.1\r\n")
            lines = first.split(b"\r\n")
            assert b"X-Name: caf\xc3\xa9" in lines  # the client's bytes, unchanged
            assert b"Content-Length: 5" in lines
            assert f"Host: {backend.url.removeprefix('http://')}".encode() in lines
            assert first.endswith(b"\r\n\r\nhello")
            assert b"Content-Length: 0" in second.split(b"\r\n")

    _run(run)


@pytest.mark.timeout(30)
def test_connect_refused_is_a_connect_error() -> None:
    async def run() -> None:
        async with scripted_backend(OK) as backend:
            url = backend.url
        client = PooledUpstream()
        try:
            with pytest.raises(UpstreamConnectError):
                await _get(client, url)
        finally:
            await client.close()

    _run(run)


@pytest.mark.timeout(30)
def test_close_before_any_response_byte_is_a_reset() -> None:
    # The client never retries by itself: the load balancer decides (tests/lb/test_proxy.py checks it).
    async def run() -> None:
        async with scripted_backend(CLOSE, OK) as backend:
            client = PooledUpstream()
            try:
                with pytest.raises(UpstreamResetError):
                    await _get(client, backend.url)
                assert await _get(client, backend.url) == (200, b"ok")
            finally:
                await client.close()

    _run(run)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort<close>",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab<close>",
    ],
    ids=["length", "chunked"],
)
def test_a_body_cut_short_raises_on_read(answer: bytes) -> None:
    async def run() -> None:
        async with scripted_backend(answer) as backend:
            client = PooledUpstream()
            try:
                response = await client.request(backend.url, "GET", "/", b"", None)
                try:
                    with pytest.raises(UpstreamError):
                        await response.read()
                finally:
                    response.release()
            finally:
                await client.close()

    _run(run)


@pytest.mark.timeout(30)
def test_an_invalid_response_is_an_upstream_error_not_a_reset() -> None:
    async def run() -> None:
        async with scripted_backend(b"NONSENSE\r\n\r\n") as backend:
            client = PooledUpstream()
            try:
                with pytest.raises(UpstreamError) as raised:
                    await _get(client, backend.url)
                assert not isinstance(raised.value, (UpstreamConnectError, UpstreamResetError))
            finally:
                await client.close()

    _run(run)


@pytest.mark.timeout(30)
def test_connections_idle_past_keepalive_are_not_reused() -> None:
    async def run() -> None:
        async with scripted_backend(OK) as backend:
            client = PooledUpstream(keepalive_seconds=0.05)
            try:
                assert await _get(client, backend.url) == (200, b"ok")
                assert await _get(client, backend.url) == (200, b"ok")
                assert backend.connections == 1
                await asyncio.sleep(0.2)
                assert await _get(client, backend.url) == (200, b"ok")
                assert backend.connections == 2
            finally:
                await client.close()

    _run(run)


@pytest.mark.timeout(30)
def test_connection_released_after_a_sweep_is_still_reused() -> None:
    async def run() -> None:
        async with scripted_backend(OK) as backend:
            client = PooledUpstream(keepalive_seconds=0.05)
            try:
                assert await _get(client, backend.url) == (200, b"ok")  # arms the sweep
                response = await client.request(backend.url, "GET", "/", b"", None)
                assert await response.read() == b"ok"
                await asyncio.sleep(0.2)  # the sweep ran while the response was held
                response.release()
                assert await _get(client, backend.url) == (200, b"ok")
                assert backend.connections == 1
            finally:
                await client.close()

    _run(run)


@pytest.mark.timeout(30)
def test_streams_a_large_body_with_bounded_buffering() -> None:
    size = 8 * 1024 * 1024
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (size, b"z" * size)

    async def run() -> None:
        async with scripted_backend(answer) as backend:
            client = PooledUpstream()
            try:
                response = await client.request(backend.url, "GET", "/", b"", None)
                first = await response.read_chunk(1024)
                await asyncio.sleep(0.2)  # a slow client: reading from the replica must pause meanwhile
                buffered = _buffered_bytes(response)
                assert buffered <= 1024 * 1024, buffered
                total = len(first)
                while chunk := await response.read_chunk(256 * 1024):
                    total += len(chunk)
                assert total == size
                response.release()
            finally:
                await client.close()

    _run(run)


def _buffered_bytes(response: object) -> int:
    payload = getattr(response, "_payload")  # noqa: B009 (a private attribute, named once)
    size: int = payload._size
    return size


class _Told:
    """``ResponseCallbacks`` that keep what they are told, and wake the test."""

    def __init__(self) -> None:
        self.responses: list[UpstreamResponse] = []
        self.errors: list[UpstreamError] = []
        self.told = asyncio.Event()

    def response_arrived(self, response: UpstreamResponse) -> None:
        self.responses.append(response)
        self.told.set()

    def response_failed(self, error: UpstreamError) -> None:
        self.errors.append(error)
        self.told.set()


@pytest.mark.timeout(30)
def test_send_now_uses_an_idle_connection_and_tells_the_callbacks() -> None:
    async def run() -> None:
        async with scripted_backend(OK) as backend:
            client = PooledUpstream()
            try:
                told = _Told()
                # Never connected: nothing goes out without waiting, and nothing is sent.
                assert client.send_now(backend.url, "GET", "/", b"", None, told) is None
                assert await _get(client, backend.url) == (200, b"ok")
                assert client.send_now(backend.url, "POST", "/p", b"X-A: 1\r\n", b"hi", told) is not None
                assert not told.told.is_set()  # never from within send_now
                await asyncio.wait_for(told.told.wait(), 10)
                [response] = told.responses
                assert (response.status, response.read_now(), told.errors) == (200, b"ok", [])
                response.release()
                assert backend.connections == 1  # the pooled connection carried both
                second = backend.requests[1].split(b"\r\n")
                assert second[0] == b"POST /p HTTP/1.1" and b"X-A: 1" in second and b"Content-Length: 2" in second
            finally:
                await client.close()

    _run(run)


@pytest.mark.timeout(30)
def test_send_now_cancelled_before_its_write_sends_nothing_and_tells_nobody() -> None:
    async def run() -> None:
        async with scripted_backend(OK) as backend:
            client = PooledUpstream()
            try:
                assert await _get(client, backend.url) == (200, b"ok")
                told = _Told()
                pending = client.send_now(backend.url, "GET", "/", b"", None, told)
                assert pending is not None
                pending.cancel()  # before the loop ran the write it scheduled
                await asyncio.sleep(0.2)
                assert (len(backend.requests), told.responses, told.errors) == (1, [], [])
            finally:
                await client.close()

    _run(run)
