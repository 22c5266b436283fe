"""A request answered in the protocols' callbacks (``_ClientConnection._answer_now``) against what can happen
in the same turn of the event loop: a pipelined request's answer, a close of the idle connection, the
client going away. The client's side is a real socket pair; the replica's side is the recording fake of
test_forward_now, so the test says exactly when its answer comes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from skyserve_lite.clock import FakeClock
from skyserve_lite.lb.guard import ApiKeys, Guard, GuardConfig
from skyserve_lite.lb.outcomes import Failure, RecordingSink
from skyserve_lite.lb.proxy import LoadBalancer
from skyserve_lite.lb.server import HttpServer, _ClientConnection
from skyserve_lite.lb.upstream import UpstreamResetError

from .test_forward_now import A, B, _Response, _Source, _Upstream

KEY = "answer-now-key"
GET_1 = f"GET /1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
GET_2_WITHOUT_KEY = b"GET /2 HTTP/1.1\r\nHost: x\r\n\r\n"

Scenario = Callable[[LoadBalancer, _Upstream, _ClientConnection, asyncio.StreamReader, RecordingSink],
                    Coroutine[Any, Any, None]]


def _run(upstream: _Upstream, scenario: Scenario) -> None:
    async def run() -> None:
        sink = RecordingSink()
        guard = Guard(GuardConfig(keys=ApiKeys.from_values([("k", KEY)])))
        lb = LoadBalancer("svc", _Source(), None, FakeClock(), upstream=lambda: upstream, guard=guard,
                          outcomes=(sink,))
        await lb.start()
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        try:
            _, connection = await loop.connect_accepted_socket(
                lambda: _ClientConnection(HttpServer(lb), loop, lambda: None), ours)
            reader, writer = await asyncio.open_connection(sock=theirs)
            assert isinstance(connection, _ClientConnection)
            writer.write(GET_1)
            for _ in range(200):
                if upstream.sent:
                    break
                await asyncio.sleep(0.01)
            assert [sent.url for sent in upstream.sent] == [A]
            await scenario(lb, upstream, connection, reader, sink)
            writer.close()
        finally:
            await lb.close()

    asyncio.run(run())


async def _status_lines(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    lines = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines_of_head = head.split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines_of_head if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        lines.append(head.split(b"\r\n", 1)[0])
    return lines


@pytest.mark.timeout(30)
def test_a_pipelined_requests_answer_never_overtakes_the_one_before() -> None:
    async def scenario(lb: LoadBalancer, upstream: _Upstream, connection: _ClientConnection,
                       reader: asyncio.StreamReader, sink: RecordingSink) -> None:
        # The replica's answer to /1 and the client's /2 (refused: no key) come in one turn of the loop.
        upstream.sent[0].callbacks.response_arrived(_Response())
        connection.data_received(GET_2_WITHOUT_KEY)
        assert await _status_lines(reader, 2) == [b"HTTP/1.1 200 OK", b"HTTP/1.1 401 Unauthorized"]

    _run(_Upstream(), scenario)


@pytest.mark.timeout(30)
def test_closing_the_idle_connection_in_the_same_turn_still_sends_the_answer() -> None:
    async def scenario(lb: LoadBalancer, upstream: _Upstream, connection: _ClientConnection,
                       reader: asyncio.StreamReader, sink: RecordingSink) -> None:
        upstream.sent[0].callbacks.response_arrived(_Response())
        connection.close_when_idle()  # what a shutdown or the connection limit's eviction does
        assert await _status_lines(reader, 1) == [b"HTTP/1.1 200 OK"]
        assert await asyncio.wait_for(reader.read(), 10) == b""

    _run(_Upstream(), scenario)


@pytest.mark.timeout(30)
def test_a_client_gone_before_its_answer_ends_the_attempt_as_aborted() -> None:
    async def scenario(lb: LoadBalancer, upstream: _Upstream, connection: _ClientConnection,
                       reader: asyncio.StreamReader, sink: RecordingSink) -> None:
        connection.connection_lost(None)
        assert upstream.sent[0].cancelled
        assert dict(lb.in_flight())[A] == 0
        assert [(o.replica, o.failure) for o in sink.outcomes] == [(A, Failure.ABORTED)]

    _run(_Upstream(), scenario)


@pytest.mark.timeout(30)
def test_a_retry_handed_to_the_task_but_never_run_counts_as_aborted() -> None:
    async def scenario(lb: LoadBalancer, upstream: _Upstream, connection: _ClientConnection,
                       reader: asyncio.StreamReader, sink: RecordingSink) -> None:
        # B has no idle connection: the retry is handed to the task; the client goes in the same turn.
        upstream.sent[0].callbacks.response_failed(UpstreamResetError("reset"))
        connection.connection_lost(None)
        await asyncio.sleep(0.05)
        assert upstream.requested == []  # forward never ran
        assert [(o.replica, o.attempt, o.failure) for o in sink.outcomes] == [
            (A, 1, Failure.RESET), (B, 2, Failure.ABORTED)]
        assert dict(lb.in_flight()) == {A: 0, B: 0}

    _run(_Upstream(idle={A}), scenario)
