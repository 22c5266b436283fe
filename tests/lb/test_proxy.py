"""The load balancer over real HTTP on 127.0.0.1: two aiohttp backends, a fake source, a recording sink.

pytest-asyncio is not used: each test is a plain function running its async body with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from skyserve_lite.clock import FakeClock
from skyserve_lite.lb.http1 import RawHeaders
from skyserve_lite.lb.proxy import (
    LbReport,
    LbView,
    LoadBalancer,
    is_report_due,
    merge_counts,
    render_upstream_headers,
    split_completed_seconds,
)
from skyserve_lite.lb.server import serve
from skyserve_lite.procs import find_free_port

from .scripted import CLOSE, scripted_backend
from .serving import serve_app, serve_lb

BIG = 5 * 1024 * 1024
# Deterministic, not all-equal bytes, so that a reordered or dropped chunk changes the digest.
BIG_BODY = hashlib.sha256(b"seed").digest() * (BIG // 32)
START = 1_767_225_600.25  # 2026-01-01T00:00:00.25Z


# -- backends ---------------------------------------------------------------------------------------------


@dataclass
class Backend:
    ident: str
    url: str = ""
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)
    release_slow: asyncio.Event = field(default_factory=asyncio.Event)
    hits: int = 0


def _backend_app(backend: Backend) -> web.Application:
    async def echo(request: web.Request) -> web.StreamResponse:
        backend.hits += 1
        path = request.path
        if path == "/slow":
            backend.slow_started.set()
            await backend.release_slow.wait()
        if path == "/big":
            if request.query.get("chunked") == "1":
                response = web.StreamResponse()
                response.enable_chunked_encoding()
                await response.prepare(request)
                for offset in range(0, BIG, 100_000):
                    await response.write(BIG_BODY[offset : offset + 100_000])
                await response.write_eof()
                return response
            return web.Response(body=BIG_BODY, content_type="application/octet-stream")
        if path == "/digest":
            digest = hashlib.sha256()
            size = 0
            async for chunk in request.content.iter_any():
                digest.update(chunk)
                size += len(chunk)
            return web.json_response(
                {
                    "id": backend.ident,
                    "sha256": digest.hexdigest(),
                    "size": size,
                    "transfer_encoding": request.headers.get("Transfer-Encoding"),
                    "content_length": request.headers.get("Content-Length"),
                }
            )
        body = await request.read()
        headers = {
            "X-Backend": backend.ident,
            "Connection": "X-Resp-Hop",
            "X-Resp-Hop": "secret",
            "Keep-Alive": "timeout=5",
            "Proxy-Authenticate": "Basic",
            "X-Kept": "yes",
        }
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": "1234"})
        return web.json_response(
            {
                "id": backend.ident,
                "method": request.method,
                "path": request.path,
                "query": request.query_string,
                "body": body.decode(),
                "headers": [[name, value] for name, value in request.headers.items()],
            },
            headers=headers,
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


def _dead_url() -> str:
    """A url on which nothing listens: a port the kernel just handed out and that is closed again."""
    return f"http://127.0.0.1:{find_free_port()}"


# -- fakes ------------------------------------------------------------------------------------------------


class MutableSource:
    """A TargetSource whose view the test changes; counts reads so tests can wait for a refresh."""

    def __init__(self, view: LbView | None) -> None:
        self.view = view
        self.reads = 0

    def read(self) -> LbView | None:
        self.reads += 1
        return self.view


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[dict[int, int]] = []
        self.reports: list[LbReport] = []

    def record_request_counts(self, counts: Mapping[int, int]) -> None:
        self.calls.append(dict(counts))

    def record_load(self, report: LbReport) -> None:
        self.reports.append(report)


@dataclass
class Harness:
    backends: list[Backend]
    source: MutableSource
    sink: RecordingSink
    clock: FakeClock
    lb: LoadBalancer
    lb_url: str
    client: aiohttp.ClientSession

    async def get_json(self, path: str = "/") -> dict[str, Any]:
        async with self.client.get(self.lb_url + path) as response:
            assert response.status == 200, await response.text()
            data: dict[str, Any] = await response.json()
            return data

    async def wait_refreshes(self, count: int = 2) -> None:
        """Wait until the load balancer has read the source ``count`` more times (a pass has completed)."""
        target = self.source.reads + count
        await _wait_for(lambda: self.source.reads >= target)


async def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def _harness(
    policy: str = "round_robin",
    targets: Callable[[list[str]], tuple[str, ...]] | None = None,
    refresh_seconds: float = 0.02,
    **lb_options: Any,
) -> AsyncIterator[Harness]:
    backends = [Backend("b0"), Backend("b1")]
    async with contextlib.AsyncExitStack() as stack:
        for backend in backends:
            backend.url = await stack.enter_async_context(serve_app(_backend_app(backend)))
        urls = [backend.url for backend in backends]
        source = MutableSource(LbView(ready_urls=targets(urls) if targets else tuple(urls), policy=policy))
        sink = RecordingSink()
        clock = FakeClock(START)
        lb = LoadBalancer("svc", source, sink, clock, refresh_seconds=refresh_seconds, **lb_options)
        lb_url = await stack.enter_async_context(serve_lb(lb))
        client = await stack.enter_async_context(aiohttp.ClientSession(auto_decompress=False))
        yield Harness(backends, source, sink, clock, lb, lb_url, client)


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


# -- pure helpers -----------------------------------------------------------------------------------------


def _raw(pairs: list[tuple[str, str]]) -> RawHeaders:
    return RawHeaders([(name.encode(), value.encode()) for name, value in pairs])


def _lines(block: bytes) -> list[tuple[str, str]]:
    """Header lines back into (name, value) pairs; every line must end in CRLF."""
    assert block == b"" or block.endswith(b"\r\n")
    pairs = []
    for line in block.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b": ")
        pairs.append((name.decode(), value.decode()))
    return pairs


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ([("Connection", "keep-alive"), ("Keep-Alive", "timeout=5"), ("X-A", "1")], [("X-A", "1")]),
        (
            [("Connection", "X-Private, x-other"), ("X-Private", "1"), ("X-Other", "2"), ("X-A", "3")],
            [("X-A", "3")],
        ),
        (
            [
                ("TE", "trailers"),
                ("Trailer", "X"),
                ("Trailers", "X"),
                ("Transfer-Encoding", "chunked"),
                ("Upgrade", "h2c"),
                ("Proxy-Authorization", "Basic x"),
                ("Proxy-Authenticate", "Basic"),
                ("Proxy-Connection", "keep-alive"),
                ("Content-Type", "text/plain"),
            ],
            [("Content-Type", "text/plain")],
        ),
        # Repeats keep their order and count; Content-Length is the upstream client's to write.
        ([("X-A", "1"), ("x-a", "2"), ("Content-Length", "5")], [("X-A", "1"), ("x-a", "2")]),
    ],
)
def test_render_upstream_headers_drops_hop_by_hop_table(
    given: list[tuple[str, str]], kept: list[tuple[str, str]]
) -> None:
    assert _lines(render_upstream_headers(_raw(given), None, "http")) == [*kept, ("X-Forwarded-Proto", "http")]


@pytest.mark.parametrize(
    ("given", "peer", "scheme", "expected"),
    [
        (
            [("Host", "lb:8080"), ("Accept", "*/*")],
            "192.0.2.7",
            "http",
            [
                ("Accept", "*/*"),
                ("X-Forwarded-For", "192.0.2.7"),
                ("X-Forwarded-Host", "lb:8080"),
                ("X-Forwarded-Proto", "http"),
            ],
        ),
        (
            [
                ("Host", "lb"),
                ("X-Forwarded-For", "1.2.3.4"),
                ("x-forwarded-for", "5.6.7.8"),
                ("X-Forwarded-Host", "claimed"),
                ("X-Forwarded-Proto", "https"),
                ("Expect", "100-continue"),
            ],
            "192.0.2.7",
            "http",
            [
                ("X-Forwarded-For", "1.2.3.4, 5.6.7.8, 192.0.2.7"),
                ("X-Forwarded-Host", "lb"),
                ("X-Forwarded-Proto", "http"),
            ],
        ),
        # A second Host goes nowhere: the replica gets one, its own.
        ([("Host", "a"), ("Host", "b")], "192.0.2.7", "https",
         [("X-Forwarded-For", "192.0.2.7"), ("X-Forwarded-Host", "a"), ("X-Forwarded-Proto", "https")]),
        ([], None, "https", [("X-Forwarded-Proto", "https")]),
        # X-Forwarded-Host is this hop's to say: a client's goes, even when Connection lists Host or the
        # request has none (HTTP/1.0).
        ([("Connection", "host"), ("Host", "lb"), ("X-Forwarded-Host", "evil.example")], None, "http",
         [("X-Forwarded-Host", "lb"), ("X-Forwarded-Proto", "http")]),
        ([("X-Forwarded-Host", "evil.example")], None, "http", [("X-Forwarded-Proto", "http")]),
    ],
)
def test_render_upstream_headers_table(
    given: list[tuple[str, str]], peer: str | None, scheme: str, expected: list[tuple[str, str]]
) -> None:
    assert _lines(render_upstream_headers(_raw(given), peer, scheme)) == expected


def test_render_upstream_headers_relays_the_clients_very_bytes() -> None:
    raw = RawHeaders([(b"X-Name", b"caf\xc3\xa9 \xff"), (b"authorization", b"Bearer k")])
    assert render_upstream_headers(raw, None, "http") == (
        b"X-Name: caf\xc3\xa9 \xff\r\nauthorization: Bearer k\r\nX-Forwarded-Proto: http\r\n"
    )
    assert render_upstream_headers(raw, None, "http", strip_authorization=True) == (
        b"X-Name: caf\xc3\xa9 \xff\r\nX-Forwarded-Proto: http\r\n"
    )


@pytest.mark.parametrize(
    ("counts", "now_second", "completed", "current"),
    [
        ({}, 100, {}, {}),
        ({98: 3, 99: 4, 100: 5}, 100, {98: 3, 99: 4}, {100: 5}),
        ({100: 5, 101: 1}, 100, {}, {100: 5, 101: 1}),
    ],
)
def test_split_completed_seconds_table(
    counts: dict[int, int], now_second: int, completed: dict[int, int], current: dict[int, int]
) -> None:
    assert split_completed_seconds(counts, now_second) == (completed, current)


@pytest.mark.parametrize(
    ("into", "more", "oldest", "expected"),
    [
        ({10: 1}, {9: 2, 10: 3}, 0, {9: 2, 10: 4}),
        ({10: 1}, {5: 2, 10: 3}, 8, {10: 4}),
        ({4: 1}, {}, 8, {}),
    ],
)
def test_merge_counts_table(into: dict[int, int], more: dict[int, int], oldest: int, expected: dict[int, int]) -> None:
    assert merge_counts(into, more, oldest) == expected


# -- proxying ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH"])
def test_method_body_and_query_pass_through(method: str) -> None:
    async def body() -> None:
        async with _harness() as h:
            payload = f"payload for {method} \u00e9".encode()
            url = h.lb_url + "/some/path%20x?a=1&b=x%20y&a=2"
            async with h.client.request(method, url, data=payload) as response:
                assert response.status == 200
                echoed = await response.json()
            assert echoed["method"] == method
            assert echoed["path"] == "/some/path x"
            assert echoed["query"] == "a=1&b=x y&a=2"
            assert echoed["body"] == payload.decode()

    _run(body)


@pytest.mark.timeout(60)
def test_head_keeps_the_replica_content_length_and_sends_no_body() -> None:
    async def body() -> None:
        async with _harness() as h, h.client.head(h.lb_url + "/x") as response:
            assert response.status == 200
            assert response.headers["Content-Length"] == "1234"
            assert await response.read() == b""

    _run(body)


@pytest.mark.timeout(60)
def test_round_robin_alternates_between_both_backends() -> None:
    async def body() -> None:
        async with _harness() as h:
            ids = [(await h.get_json())["id"] for _ in range(6)]
            assert ids == ["b0", "b1", "b0", "b1", "b0", "b1"]

    _run(body)


@pytest.mark.timeout(60)
def test_least_load_avoids_a_backend_with_a_slow_request_in_flight() -> None:
    async def body() -> None:
        async with _harness(policy="least_load") as h:
            slow = asyncio.create_task(h.get_json("/slow"))
            await asyncio.wait_for(h.backends[0].slow_started.wait(), 10)
            ids = [(await h.get_json())["id"] for _ in range(4)]
            assert ids == ["b1"] * 4
            h.backends[0].release_slow.set()
            assert (await slow)["id"] == "b0"
            # b0 is free again: both are idle, so choices alternate once more
            after = {(await h.get_json())["id"] for _ in range(2)}
            assert after == {"b0", "b1"}

    _run(body)


@pytest.mark.timeout(60)
def test_hop_by_hop_headers_dropped_and_forwarded_headers_added() -> None:
    async def body() -> None:
        async with _harness() as h:
            request_headers = {
                "Connection": "keep-alive, X-Req-Hop",
                "X-Req-Hop": "secret",
                "Keep-Alive": "timeout=5",
                "TE": "trailers",
                "Trailers": "X-Checksum",
                "Upgrade": "h2c",
                "Proxy-Authorization": "Basic eDp5",
                "X-End-To-End": "kept",
                "X-Forwarded-For": "203.0.113.9",
            }
            async with h.client.get(h.lb_url + "/h", headers=request_headers) as response:
                assert response.status == 200
                echoed = await response.json()
                response_headers = response.headers
            seen = {name.lower(): value for name, value in echoed["headers"]}
            for dropped in ("x-req-hop", "keep-alive", "te", "trailers", "upgrade", "proxy-authorization"):
                assert dropped not in seen, dropped
            assert "x-req-hop" not in seen.get("connection", "").lower()
            assert seen["x-end-to-end"] == "kept"
            assert seen["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
            assert seen["x-forwarded-host"] == h.lb_url.removeprefix("http://")
            assert seen["x-forwarded-proto"] == "http"
            # the replica sees its own address as Host, like behind nginx
            assert seen["host"] == h.backends[0].url.removeprefix("http://")

            assert response_headers["X-Kept"] == "yes"
            for dropped in ("X-Resp-Hop", "Keep-Alive", "Proxy-Authenticate"):
                assert dropped not in response_headers, dropped
            assert "x-resp-hop" not in response_headers.get("Connection", "").lower()

    _run(body)


@pytest.mark.timeout(60)
def test_the_proxy_adds_no_default_headers_of_its_own() -> None:
    async def body() -> None:
        async with _harness() as h:
            bare = ["User-Agent", "Accept", "Accept-Encoding", "Content-Type"]
            async with h.client.post(h.lb_url + "/bare", data=b"raw bytes", skip_auto_headers=bare) as response:
                assert response.status == 200
                echoed = await response.json()
            seen = {name.lower() for name, _ in echoed["headers"]}
            assert not seen & {"user-agent", "accept", "accept-encoding", "content-type"}, seen
            assert echoed["body"] == "raw bytes"

    _run(body)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("chunked", [False, True])
def test_large_streamed_response_passes_intact(chunked: bool) -> None:
    async def body() -> None:
        async with _harness() as h:
            url = h.lb_url + "/big" + ("?chunked=1" if chunked else "")
            async with h.client.get(url) as response:
                assert response.status == 200
                if chunked:
                    assert "Content-Length" not in response.headers
                else:
                    assert response.headers["Content-Length"] == str(BIG)
                data = await response.read()
            assert len(data) == BIG
            assert data == BIG_BODY

    _run(body)


@pytest.mark.timeout(60)
def test_chunked_request_body_passes_intact() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for offset in range(0, BIG, 300_000):
            yield BIG_BODY[offset : offset + 300_000]

    async def body() -> None:
        async with _harness() as h:
            async with h.client.post(h.lb_url + "/digest", data=chunks()) as response:
                assert response.status == 200
                echoed = await response.json()
            assert echoed["size"] == BIG
            assert echoed["sha256"] == hashlib.sha256(BIG_BODY).hexdigest()
            assert echoed["transfer_encoding"] == "chunked"

    _run(body)


@pytest.mark.timeout(60)
def test_large_request_body_with_length_is_streamed_with_its_length() -> None:
    async def body() -> None:
        async with _harness() as h:
            async with h.client.put(h.lb_url + "/digest", data=io.BytesIO(BIG_BODY)) as response:
                assert response.status == 200
                echoed = await response.json()
            assert echoed["size"] == BIG
            assert echoed["sha256"] == hashlib.sha256(BIG_BODY).hexdigest()
            assert echoed["content_length"] == str(BIG)

    _run(body)


@pytest.mark.timeout(60)
def test_compressed_response_passes_through_undecoded() -> None:
    async def body() -> None:
        backend = Backend("gz")

        async def gz(request: web.Request) -> web.Response:
            response = web.Response(text="hello " * 1000)
            response.enable_compression()
            return response

        app = web.Application()
        app.router.add_get("/", gz)
        async with serve_app(app) as backend_url, contextlib.AsyncExitStack() as stack:
            backend.url = backend_url
            lb = LoadBalancer("svc", MutableSource(LbView((backend_url,), "round_robin")), None, FakeClock(START))
            lb_url = await stack.enter_async_context(serve_lb(lb))
            client = await stack.enter_async_context(aiohttp.ClientSession(auto_decompress=False))
            async with client.get(lb_url + "/", headers={"Accept-Encoding": "gzip"}) as response:
                assert response.headers["Content-Encoding"] == "gzip"
                raw = await response.read()
            assert raw[:2] == b"\x1f\x8b"  # gzip magic: the bytes were not decoded on the way
            # without Accept-Encoding the proxy must not ask for compression on the client's behalf
            async with client.get(lb_url + "/", skip_auto_headers=["Accept-Encoding"]) as response:
                assert "Content-Encoding" not in response.headers
                assert await response.text() == "hello " * 1000

    _run(body)


# -- failures ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_dead_replica_is_retried_on_the_live_one() -> None:
    async def body() -> None:
        dead = _dead_url()
        async with _harness(targets=lambda urls: (dead, urls[1])) as h:
            for _ in range(4):  # round robin puts the dead one first every other request
                assert (await h.get_json("/r"))["id"] == "b1"
            async with h.client.post(h.lb_url + "/r", data=b"x" * 1000) as response:
                assert response.status == 200
                assert (await response.json())["body"] == "x" * 1000

            async def chunks() -> AsyncIterator[bytes]:
                yield b"y" * 500
                yield b"z" * 500

            # Nothing was sent to the dead replica, so even a streamed body goes to the live one.
            for _ in range(2):
                async with h.client.post(h.lb_url + "/r", data=chunks()) as response:
                    assert response.status == 200
                    assert (await response.json())["body"] == "y" * 500 + "z" * 500
            assert h.lb.retries >= 3

    _run(body)


# (method, body) -> the status the client gets and how many times the replica saw the request, when the
# replica closes the connection after reading the request and before answering: sent again (on a new
# connection, there being no other replica) only when the method may be repeated and the body re-sent.
_RESET_CASES = {
    "GET": ("GET", None, 200, 2),
    "PUT with a buffered body": ("PUT", "buffered", 200, 2),
    "DELETE": ("DELETE", None, 200, 2),
    "POST with a buffered body": ("POST", "buffered", 502, 1),
    "PATCH with a buffered body": ("PATCH", "buffered", 502, 1),
    "PUT with a streamed body": ("PUT", "streamed", 502, 1),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("method", "body_kind", "status", "seen"), list(_RESET_CASES.values()), ids=list(_RESET_CASES))
def test_a_connection_reset_before_the_answer_is_retried_only_for_an_idempotent_method_and_a_replayable_body(
    method: str, body_kind: str | None, status: int, seen: int
) -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def chunks() -> AsyncIterator[bytes]:
        yield b"part one, "
        yield b"part two"

    async def body() -> None:
        async with scripted_backend(CLOSE, ok) as backend, contextlib.AsyncExitStack() as stack:
            lb = LoadBalancer("svc", MutableSource(LbView((backend.url,), "round_robin")), None, FakeClock(START))
            lb_url = await stack.enter_async_context(serve_lb(lb))
            client = await stack.enter_async_context(aiohttp.ClientSession())
            data = {None: None, "buffered": b"replayable", "streamed": chunks()}[body_kind]
            async with client.request(method, lb_url + "/r", data=data) as response:
                assert response.status == status
                text = await response.text()
            assert len(backend.requests) == seen
            if status == 200:
                assert text == "ok"
                assert lb.retries == 1
            else:
                assert "1 attempt(s)" in text
                assert lb.retries == 0

    _run(body)


@pytest.mark.timeout(60)
def test_all_targets_dead_gives_502() -> None:
    async def body() -> None:
        dead = (_dead_url(), _dead_url())
        async with _harness(targets=lambda urls: dead) as h:
            async with h.client.get(h.lb_url + "/") as response:
                assert response.status == 502
                text = await response.text()
            assert "Bad gateway" in text
            assert "service svc" in text
            assert "2 attempt(s)" in text

    _run(body)


@pytest.mark.timeout(60)
def test_no_target_within_hold_seconds_gives_503_naming_the_status_command() -> None:
    async def body() -> None:
        async with _harness(targets=lambda urls: (), hold_seconds=0.3) as h:
            started = time.monotonic()
            async with h.client.get(h.lb_url + "/") as response:
                assert response.status == 503
                text = await response.text()
            assert time.monotonic() - started >= 0.3
            assert text == ("No ready replica for service svc. Run 'sky-lite serve status svc' to see why.\n")
            assert h.lb.waiting == 0

    _run(body)


@pytest.mark.timeout(60)
def test_target_and_policy_changes_are_picked_up_after_refresh() -> None:
    async def body() -> None:
        async with _harness(targets=lambda urls: (urls[0],), hold_seconds=0) as h:
            assert {(await h.get_json())["id"] for _ in range(3)} == {"b0"}
            h.source.view = LbView(ready_urls=(h.backends[1].url,), policy="round_robin")
            await h.wait_refreshes()
            assert {(await h.get_json())["id"] for _ in range(3)} == {"b1"}
            h.source.view = LbView(ready_urls=(), policy="round_robin")
            await h.wait_refreshes()
            async with h.client.get(h.lb_url + "/") as response:
                assert response.status == 503
            h.source.view = LbView(ready_urls=tuple(b.url for b in h.backends), policy="least_load")
            await h.wait_refreshes()
            slow = asyncio.create_task(h.get_json("/slow"))
            await asyncio.wait_for(h.backends[0].slow_started.wait(), 10)
            assert {(await h.get_json())["id"] for _ in range(3)} == {"b1"}  # least_load is in force
            h.backends[0].release_slow.set()
            await slow

    _run(body)


@pytest.mark.timeout(60)
def test_unknown_policy_in_the_view_keeps_the_previous_one() -> None:
    async def body() -> None:
        async with _harness() as h:
            h.source.view = LbView(ready_urls=tuple(b.url for b in h.backends), policy="random")
            await h.wait_refreshes()
            ids = [(await h.get_json())["id"] for _ in range(4)]
            assert sorted(ids) == ["b0", "b0", "b1", "b1"]

    _run(body)


# -- holding requests while no replica is READY -----------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_held_request_is_answered_once_a_target_appears() -> None:
    async def body() -> None:
        # refresh_seconds 30: only the reads that holding triggers can find the new target in time
        async with _harness(targets=lambda urls: (), refresh_seconds=30, hold_seconds=10) as h:
            reads_at_start = h.source.reads
            held = asyncio.create_task(h.get_json("/woken"))
            await _wait_for(lambda: h.lb.waiting == 1)
            await _wait_for(lambda: h.source.reads > reads_at_start)  # the first waiter asked for a read
            h.source.view = LbView(ready_urls=(h.backends[0].url,), policy="round_robin")
            appeared = time.monotonic()
            echoed = await asyncio.wait_for(held, 10)
            assert time.monotonic() - appeared < 1.0
            assert (echoed["id"], echoed["path"]) == ("b0", "/woken")
            assert h.lb.waiting == 0

    _run(body)


@pytest.mark.timeout(60)
def test_beyond_max_waiting_a_request_gets_503_at_once() -> None:
    async def body() -> None:
        async with _harness(targets=lambda urls: (), refresh_seconds=30, hold_seconds=20, max_waiting=2) as h:
            held = [asyncio.create_task(h.get_json(f"/held{i}")) for i in range(2)]
            await _wait_for(lambda: h.lb.waiting == 2)
            started = time.monotonic()
            async with h.client.get(h.lb_url + "/third") as response:
                assert response.status == 503
            assert time.monotonic() - started < 5.0  # far below the 20 s hold
            h.source.view = LbView(ready_urls=tuple(b.url for b in h.backends), policy="round_robin")
            answers = await asyncio.wait_for(asyncio.gather(*held), 10)
            assert sorted(a["path"] for a in answers) == ["/held0", "/held1"]

    _run(body)


@pytest.mark.timeout(60)
def test_held_requests_are_counted_on_arrival_and_reported_as_waiting() -> None:
    async def body() -> None:
        async with _harness(targets=lambda urls: (), refresh_seconds=30, hold_seconds=20) as h:
            held = [asyncio.create_task(h.get_json()) for _ in range(3)]
            await _wait_for(lambda: bool(h.sink.reports) and h.sink.reports[-1].waiting == 3)
            assert h.sink.reports[-1].in_flight == ()
            # counted while still held: the autoscaler's wake from zero needs the demand before any answer
            h.clock.advance(1.0)
            await _wait_for(lambda: h.sink.calls == [{int(START): 3}])
            assert h.lb.waiting == 3
            h.source.view = LbView(ready_urls=(h.backends[0].url,), policy="round_robin")
            await asyncio.wait_for(asyncio.gather(*held), 10)
            assert h.lb.waiting == 0

    _run(body)


# -- request counting -------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ready", [True, False], ids=["ready", "no-replica"])
def test_requests_counted_per_second_and_flushed_once_the_second_is_over(ready: bool) -> None:
    async def body() -> None:
        async with _harness(targets=None if ready else (lambda urls: ()), hold_seconds=0) as h:
            second = int(START)
            for _ in range(5):
                async with h.client.get(h.lb_url + "/") as response:
                    assert response.status == (200 if ready else 503)
            await h.wait_refreshes(3)
            assert h.sink.calls == []  # the second is still running
            h.clock.advance(1.0)
            for _ in range(2):
                async with h.client.get(h.lb_url + "/"):
                    pass
            await _wait_for(lambda: len(h.sink.calls) >= 1)
            await h.wait_refreshes(3)
            assert h.sink.calls == [{second: 5}]
            h.clock.advance(1.0)
            await _wait_for(lambda: len(h.sink.calls) >= 2)
            assert h.sink.calls == [{second: 5}, {second + 1: 2}]

    _run(body)


class FlakySink:
    def __init__(self) -> None:
        self.fail = True
        self.calls: list[dict[int, int]] = []
        self.reports: list[LbReport] = []

    def record_request_counts(self, counts: Mapping[int, int]) -> None:
        if self.fail:
            raise RuntimeError("database is locked")
        self.calls.append(dict(counts))

    def record_load(self, report: LbReport) -> None:
        if self.fail:
            raise RuntimeError("database is locked")
        self.reports.append(report)


@pytest.mark.timeout(60)
def test_counts_refused_by_the_sink_are_handed_over_later() -> None:
    async def body() -> None:
        async with _harness() as h:
            sink = FlakySink()
            lb = LoadBalancer("svc", h.source, sink, h.clock, refresh_seconds=0.02)
            async with serve_lb(lb) as lb_url:
                for _ in range(3):
                    async with h.client.get(lb_url + "/"):
                        pass
                h.clock.advance(1.0)
                async with h.client.get(lb_url + "/"):
                    pass
                await h.wait_refreshes(6)
                h.clock.advance(1.0)
                await h.wait_refreshes(2)
                assert sink.calls == []
                assert sink.reports == []
                sink.fail = False
                await _wait_for(lambda: len(sink.calls) >= 1 and len(sink.reports) >= 1)
                assert sink.calls == [{int(START): 3, int(START) + 1: 1}]
                # the load report refused all along goes out on the first pass that works
                assert sink.reports[0].reported_at == START + 2

    _run(body)


# -- load reports -----------------------------------------------------------------------------------------

_A, _B = "http://127.0.0.1:1001", "http://127.0.0.1:1002"
_LAST = LbReport(reported_at=100.0, in_flight=((_A, 1), (_B, 0)), waiting=0)


@pytest.mark.parametrize(
    ("last", "in_flight", "waiting", "now", "due"),
    [
        (None, (), 0, 100.0, True),  # nothing reported yet
        (_LAST, ((_A, 1), (_B, 0)), 0, 101.9, False),  # unchanged within 2 s
        (_LAST, ((_A, 1), (_B, 0)), 0, 102.0, True),  # unchanged, heartbeat
        (_LAST, ((_A, 0), (_B, 0)), 0, 100.1, True),  # in-flight changed
        (_LAST, ((_A, 1),), 0, 100.1, True),  # a url went away
        (_LAST, ((_A, 1), (_B, 0)), 3, 100.1, True),  # requests wait
        (_LAST, ((_A, 1), (_B, 0)), 0, 99.0, True),  # the clock went back
    ],
)
def test_is_report_due_table(
    last: LbReport | None, in_flight: tuple[tuple[str, int], ...], waiting: int, now: float, due: bool
) -> None:
    assert is_report_due(last, in_flight, waiting, now) is due


@pytest.mark.timeout(60)
def test_load_report_shows_a_slow_request_in_flight_until_it_ends() -> None:
    async def body() -> None:
        async with _harness(policy="least_load") as h:
            b0, b1 = (b.url for b in h.backends)
            await _wait_for(lambda: len(h.sink.reports) >= 1)
            assert h.sink.reports[0] == LbReport(reported_at=START, in_flight=tuple(sorted(((b0, 0), (b1, 0)))))
            slow = asyncio.create_task(h.get_json("/slow"))
            await asyncio.wait_for(h.backends[0].slow_started.wait(), 10)
            busy = tuple(sorted(((b0, 1), (b1, 0))))
            await _wait_for(lambda: h.sink.reports[-1].in_flight == busy)
            h.backends[0].release_slow.set()
            assert (await slow)["id"] == "b0"
            await _wait_for(lambda: h.sink.reports[-1].in_flight == tuple(sorted(((b0, 0), (b1, 0)))))
            assert all(report.waiting == 0 for report in h.sink.reports)

    _run(body)


@pytest.mark.timeout(60)
def test_unchanged_load_is_reported_again_after_two_seconds_only() -> None:
    async def body() -> None:
        async with _harness() as h:
            await _wait_for(lambda: len(h.sink.reports) >= 1)
            h.clock.advance(1.9)
            await h.wait_refreshes(5)
            assert len(h.sink.reports) == 1  # nothing changed within 2 s: no write
            h.clock.advance(0.1)
            await _wait_for(lambda: len(h.sink.reports) >= 2)
            await h.wait_refreshes(5)
            first, heartbeat = h.sink.reports
            assert heartbeat.reported_at == START + 2.0
            assert (heartbeat.in_flight, heartbeat.waiting) == (first.in_flight, first.waiting)

    _run(body)


# -- lifecycle --------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_source_returning_none_stops_serve_and_answers_held_requests() -> None:
    async def body() -> None:
        source = MutableSource(LbView(ready_urls=(), policy="round_robin"))
        sink = RecordingSink()
        clock = FakeClock(START)
        lb = LoadBalancer("svc", source, sink, clock, refresh_seconds=0.02)  # holds for the default 30 s
        port = find_free_port()
        task = asyncio.create_task(serve(lb, "127.0.0.1", port, asyncio.Event()))
        await _wait_for_port(port)
        async with aiohttp.ClientSession() as client:
            held = asyncio.create_task(client.get(f"http://127.0.0.1:{port}/"))
            await _wait_for(lambda: lb.waiting == 1)
            clock.advance(1.0)
            source.view = None
            async with await asyncio.wait_for(held, 10) as response:
                assert response.status == 503
        await asyncio.wait_for(task, 10)
        # the held request; the last completed second was flushed on the way out
        assert sink.calls == [{int(START): 1}]
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()

    _run(body)


@pytest.mark.timeout(60)
def test_held_requests_get_503_when_serve_is_stopped() -> None:
    async def body() -> None:
        lb = LoadBalancer("svc", MutableSource(LbView((), "round_robin")), None, FakeClock(START))
        port = find_free_port()
        stop = asyncio.Event()
        task = asyncio.create_task(serve(lb, "127.0.0.1", port, stop))
        await _wait_for_port(port)
        async with aiohttp.ClientSession() as client:
            held = asyncio.create_task(client.get(f"http://127.0.0.1:{port}/"))
            await _wait_for(lambda: lb.waiting == 1)
            stopped = time.monotonic()
            stop.set()
            async with await asyncio.wait_for(held, 10) as response:
                assert response.status == 503
        await asyncio.wait_for(task, 10)
        assert time.monotonic() - stopped < 5.0  # not the 30 s hold

    _run(body)


@pytest.mark.timeout(60)
def test_serve_proxies_until_the_stop_event_is_set() -> None:
    async def body() -> None:
        backend = Backend("only")
        async with serve_app(_backend_app(backend)) as backend_url:
            lb = LoadBalancer("svc", MutableSource(LbView((backend_url,), "round_robin")), None, FakeClock(START))
            port = find_free_port()
            stop = asyncio.Event()
            task = asyncio.create_task(serve(lb, "127.0.0.1", port, stop))
            async with aiohttp.ClientSession() as client:
                await _wait_for_listening(client, f"http://127.0.0.1:{port}/")
                async with client.put(f"http://127.0.0.1:{port}/p?q=1", data=b"through serve") as response:
                    assert response.status == 200
                    echoed = await response.json()
            assert (echoed["id"], echoed["method"], echoed["query"], echoed["body"]) == (
                "only",
                "PUT",
                "q=1",
                "through serve",
            )
            stop.set()
            await asyncio.wait_for(task, 10)

    _run(body)


@pytest.mark.timeout(60)
def test_serve_raises_oserror_when_the_port_is_taken() -> None:
    async def body() -> None:
        lb = LoadBalancer("svc", MutableSource(LbView((), "round_robin")), None, FakeClock(START))
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            with pytest.raises(OSError):
                await asyncio.wait_for(serve(lb, "127.0.0.1", taken.getsockname()[1], asyncio.Event()), 10)

    _run(body)


async def _wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on port {port}"
            await asyncio.sleep(0.01)
        else:
            writer.close()
            await writer.wait_closed()
            return


async def _wait_for_listening(client: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            async with client.get(url):
                return
        except aiohttp.ClientConnectorError:
            assert time.monotonic() < deadline, f"{url} never answered"
            await asyncio.sleep(0.01)
