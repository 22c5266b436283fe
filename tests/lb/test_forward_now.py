"""``LoadBalancer.forward_now``: the first attempt sent without a coroutine, its end told to a listener by
callbacks, with the same counting, retry and outcome rules as ``forward``. The upstream is a fake that
records what is sent and lets the test say when a response or a failure comes; nothing is contacted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from skyserve_lite.clock import FakeClock
from skyserve_lite.lb.http1 import RawHeaders
from skyserve_lite.lb.outcomes import Failure, RecordingSink
from skyserve_lite.lb.proxy import Forwarded, LbView, LoadBalancer, LocalAnswer
from skyserve_lite.lb.upstream import (
    PendingResponse,
    ResponseCallbacks,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResetError,
    UpstreamResponse,
    UpstreamTimeoutError,
    UpstreamTunnel,
)

A, B = "http://127.0.0.1:9/a", "http://127.0.0.1:9/b"  # never contacted: the upstream is a fake


class _Source:
    def read(self) -> LbView:
        return LbView((A, B), "round_robin")


class _Response:
    """A whole 200 response: what the pooled client hands over for a small answer."""

    status = 200
    reason: str | None = "OK"
    headers = RawHeaders([(b"Content-Length", b"2")])
    content_length: int | None = 2

    def __init__(self) -> None:
        self.released = 0

    async def read(self) -> bytes:
        return b"ok"

    def read_now(self) -> bytes | None:
        return b"ok"

    async def read_chunk(self, size: int) -> bytes:
        return b""

    def tunnel(self) -> UpstreamTunnel:
        raise UpstreamError("no tunnel")

    def release(self) -> None:
        self.released += 1


@dataclass
class _Sent:
    url: str
    callbacks: ResponseCallbacks
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class _Upstream:
    """Sends at once to the urls in ``idle`` (an idle pooled connection), else answers None as the pooled
    client does; ``request`` (the waiting path) fails with ``request_error`` or answers 200."""

    idle: set[str] = field(default_factory=lambda: {A, B})
    sent: list[_Sent] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)
    request_error: UpstreamError | None = None

    def send_now(self, url: str, method: str, path: str, headers: bytes, body: bytes | None,
                 callbacks: ResponseCallbacks) -> PendingResponse | None:
        if url not in self.idle:
            return None
        sent = _Sent(url, callbacks)
        self.sent.append(sent)
        return sent

    async def request(self, url: str, method: str, path: str, headers: bytes,
                      body: bytes | aiohttp.StreamReader | None, upgrade: bool = False,
                      content_length: int | None = None) -> UpstreamResponse:
        self.requested.append(url)
        if self.request_error is not None:
            raise self.request_error
        return _Response()

    async def close(self) -> None:
        pass


class _Listener:
    """A ``ForwardListener`` that keeps what it is told."""

    def __init__(self) -> None:
        self.responses: list[Forwarded] = []
        self.answers: list[LocalAnswer] = []
        self.going_on: list[Coroutine[Any, Any, Forwarded | LocalAnswer]] = []

    def forwarded(self, forwarded: Forwarded) -> None:
        self.responses.append(forwarded)

    def answer(self, answer: LocalAnswer) -> None:
        self.answers.append(answer)

    def go_on(self, forwarding: Coroutine[Any, Any, Forwarded | LocalAnswer], abandon: Callable[[], None]) -> None:
        self.going_on.append(forwarding)


def _run(upstream: _Upstream, body: Any) -> None:
    async def run() -> None:
        sink = RecordingSink()
        lb = LoadBalancer("svc", _Source(), None, FakeClock(), upstream=lambda: upstream, outcomes=(sink,))
        await lb.start()
        try:
            await body(lb, sink)
        finally:
            await lb.close()

    asyncio.run(run())


def test_a_response_goes_to_the_listener_and_counts_in_flight_until_released() -> None:
    upstream = _Upstream()

    async def body(lb: LoadBalancer, sink: RecordingSink) -> None:
        listener = _Listener()
        pending = lb.forward_now(A, "GET", "/", b"", None, listener)
        assert pending is not None and [s.url for s in upstream.sent] == [A]
        assert dict(lb.in_flight())[A] == 1
        response = _Response()
        upstream.sent[0].callbacks.response_arrived(response)
        [forwarded] = listener.responses
        assert (forwarded.url, forwarded.attempt, dict(lb.in_flight())[A]) == (A, 1, 1)
        forwarded.release()
        assert (dict(lb.in_flight())[A], response.released) == (0, 1)
        assert [(o.replica, o.status, o.attempt) for o in sink.outcomes] == [(A, 200, 1)]

    _run(upstream, body)


def test_nothing_is_sent_or_counted_without_an_idle_connection() -> None:
    upstream = _Upstream(idle=set())

    async def body(lb: LoadBalancer, sink: RecordingSink) -> None:
        assert lb.forward_now(A, "GET", "/", b"", None, _Listener()) is None
        assert (upstream.sent, dict(lb.in_flight())[A], sink.outcomes) == ([], 0, [])

    _run(upstream, body)


@pytest.mark.parametrize(
    ("method", "error", "retried"),
    [
        ("GET", UpstreamResetError("reset"), True),
        ("POST", UpstreamConnectError("refused"), True),  # nothing was sent: any method goes again
        ("POST", UpstreamResetError("reset"), False),  # the replica may have acted on it
        ("GET", UpstreamTimeoutError("slow"), False),
    ],
)
def test_a_failed_first_attempt_is_retried_on_the_other_replica_as_forward_does(
    method: str, error: UpstreamError, retried: bool
) -> None:
    upstream = _Upstream()

    async def body(lb: LoadBalancer, sink: RecordingSink) -> None:
        listener = _Listener()
        assert lb.forward_now(A, method, "/", b"", b"x", listener) is not None
        upstream.sent[0].callbacks.response_failed(error)
        assert dict(lb.in_flight())[A] == 0
        if not retried:
            [answer] = listener.answers
            assert answer.status == (504 if isinstance(error, UpstreamTimeoutError) else 502)
            assert [s.url for s in upstream.sent] == [A] and lb.retries == 0
            return
        assert [s.url for s in upstream.sent] == [A, B] and lb.retries == 1
        assert dict(lb.in_flight())[B] == 1
        upstream.sent[1].callbacks.response_arrived(_Response())
        [forwarded] = listener.responses
        forwarded.release()
        assert [(o.replica, o.status, o.attempt, o.failure) for o in sink.outcomes] == [
            (A, None, 1, Failure.CONNECT if isinstance(error, UpstreamConnectError) else Failure.RESET),
            (B, 200, 2, None),
        ]

    _run(upstream, body)


def test_a_retry_without_an_idle_connection_goes_on_in_forward() -> None:
    upstream = _Upstream(idle={A})

    async def body(lb: LoadBalancer, sink: RecordingSink) -> None:
        listener = _Listener()
        assert lb.forward_now(A, "GET", "/", b"", None, listener) is not None
        upstream.sent[0].callbacks.response_failed(UpstreamResetError("reset"))
        [forwarding] = listener.going_on
        result = await forwarding
        assert isinstance(result, Forwarded) and (result.url, result.attempt) == (B, 2)
        assert upstream.requested == [B]
        result.release()
        assert [(o.replica, o.attempt) for o in sink.outcomes] == [(A, 1), (B, 2)]
        assert dict(lb.in_flight()) == {A: 0, B: 0}

    _run(upstream, body)


def test_cancel_ends_the_attempt_as_a_client_gone_away() -> None:
    upstream = _Upstream()

    async def body(lb: LoadBalancer, sink: RecordingSink) -> None:
        listener = _Listener()
        pending = lb.forward_now(A, "GET", "/", b"", None, listener)
        assert pending is not None
        pending.cancel()
        pending.cancel()  # a second time does nothing more
        assert upstream.sent[0].cancelled
        assert dict(lb.in_flight())[A] == 0
        assert [(o.replica, o.failure) for o in sink.outcomes] == [(A, Failure.ABORTED)]
        assert (listener.responses, listener.answers, listener.going_on) == ([], [], [])

    _run(upstream, body)
