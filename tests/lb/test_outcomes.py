"""The outcome hook: every finished attempt and every answer the load balancer makes itself reaches the
sinks once, with the replica's version and status (none for an attempt without a response). And the
identity the load balancer answers itself at its reserved path, before API keys."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import web

from skyserve_lite.clock import FakeClock
from skyserve_lite.endpoint_identity import (
    IDENTITY_HEADER,
    IDENTITY_PATH,
    EndpointIdentity,
    find_identity_problem,
    read_endpoint_identity,
)
from skyserve_lite.lb.guard import ApiKeys, Guard, GuardConfig
from skyserve_lite.lb.outcomes import Failure, Outcome, RecordingSink
from skyserve_lite.lb.proxy import LbView, LoadBalancer
from skyserve_lite.procs import find_free_port
from skyserve_lite.spec.model import RateLimit

from .serving import StaticSource, serve_app, serve_lb


async def _answer(request: web.Request) -> web.Response:
    return web.Response(status=int(request.match_info["status"]), text="answered")


def _replica() -> contextlib.AbstractAsyncContextManager[str]:
    """A replica answering /status/<n> with status n; yields its url."""
    app = web.Application()
    app.router.add_get("/status/{status}", _answer)
    return serve_app(app)


def _lb(view: LbView, sink: RecordingSink, guard: Guard | None = None) -> contextlib.AbstractAsyncContextManager[str]:
    lb = LoadBalancer("svc", StaticSource(view), None, FakeClock(0.0), hold_seconds=0, guard=guard,
                      outcomes=(sink,))
    return serve_lb(lb)


async def _get(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=20)) as response:
        await response.read()
        return response.status


def test_each_answered_request_gives_one_outcome_with_its_replica_version_and_status() -> None:
    async def body() -> list[Outcome]:
        sink = RecordingSink()
        async with _replica() as replica, _lb(LbView((replica,), "round_robin", versions=(7,)), sink) as lb, \
                aiohttp.ClientSession() as session:
            statuses = [await _get(session, f"{lb}/status/{s}") for s in (200, 200, 404, 500)]
            assert statuses == [200, 200, 404, 500]
            await asyncio.sleep(0.05)  # the last release runs right after the body went out
            return [dataclass_without_seconds(o, replica) for o in sink.outcomes]

    assert asyncio.run(body()) == [
        Outcome(7, "R", 200, 0.0, 1), Outcome(7, "R", 200, 0.0, 1),
        Outcome(7, "R", 404, 0.0, 1), Outcome(7, "R", 500, 0.0, 1),
    ]


def dataclass_without_seconds(outcome: Outcome, replica: str) -> Outcome:
    """``outcome`` with its replica url "R" (when it is ``replica``) and 0 seconds, after checking them."""
    assert 0.0 <= outcome.seconds < 20.0
    return Outcome(outcome.version, "R" if outcome.replica == replica else outcome.replica, outcome.status, 0.0,
                   outcome.attempt, outcome.failure)


def test_a_refused_attempt_and_its_retry_are_two_outcomes() -> None:
    async def body() -> tuple[list[Outcome], str, str]:
        sink = RecordingSink()
        dead = f"http://127.0.0.1:{find_free_port()}"
        async with _replica() as replica, \
                _lb(LbView((dead, replica), "round_robin", versions=(3, 4)), sink) as lb, \
                aiohttp.ClientSession() as session:
            # Round robin starts with the dead replica: refused, retried on the live one.
            assert await _get(session, f"{lb}/status/200") == 200
            await asyncio.sleep(0.05)
            return sink.outcomes, dead, replica

    outcomes, dead, replica = asyncio.run(body())
    assert [(o.version, o.replica, o.status, o.attempt, o.failure) for o in outcomes] == [
        (3, dead, None, 1, Failure.CONNECT), (4, replica, 200, 2, None),
    ]


def test_answers_without_a_replica_are_outcomes_without_one() -> None:
    async def body() -> list[Outcome]:
        sink = RecordingSink()
        dead = f"http://127.0.0.1:{find_free_port()}"
        # One request per 100 s: the second request in a row is refused with 429.
        guard = Guard(GuardConfig(keys=None, rate_limits=(RateLimit(rps=0.01),)))
        async with _lb(LbView((dead,), "round_robin", versions=(1,)), sink, guard) as lb, \
                aiohttp.ClientSession() as session:
            assert await _get(session, f"{lb}/status/200") == 502  # refused, nowhere else to go
            assert await _get(session, f"{lb}/status/200") == 429
        async with _lb(LbView((), "round_robin"), sink) as lb, aiohttp.ClientSession() as session:
            assert await _get(session, f"{lb}/status/200") == 503
        return sink.outcomes

    outcomes = asyncio.run(body())
    assert [(o.version, o.replica is None, o.status, o.attempt, o.failure) for o in outcomes] == [
        (1, False, None, 1, Failure.CONNECT), (None, True, 502, 0, None),
        (None, True, 429, 0, None), (None, True, 503, 0, None),
    ]


def test_the_identity_path_is_answered_by_the_load_balancer_before_api_keys_and_counts_nothing() -> None:
    async def body() -> None:
        sink = RecordingSink()
        guard = Guard(GuardConfig(keys=ApiKeys.from_values([("API_KEY", "s3cret")])))
        lb = LoadBalancer("svc", StaticSource(LbView((), "round_robin")), None, FakeClock(0.0), hold_seconds=0,
                          guard=guard, outcomes=(sink,), identity={"service": "svc", "controller_id": "c1", "pid": 7})
        async with serve_lb(lb) as lb_url, aiohttp.ClientSession() as session:
            async with session.get(f"{lb_url}{IDENTITY_PATH}") as response:
                assert response.status == 200
                assert response.headers["Content-Type"] == "application/json"
                assert response.headers[IDENTITY_HEADER] == "svc"
                assert await response.json() == {"service": "svc", "controller_id": "c1", "pid": 7}
            assert await _get(session, f"{lb_url}/anything") == 401  # the keys still hold
        # The identity is no request of the service's: only the 401 is an outcome.
        assert [(o.replica, o.status) for o in sink.outcomes] == [(None, 401)]

    asyncio.run(body())


def test_the_endpoint_identity_is_read_over_http_and_judged() -> None:
    async def body() -> tuple[EndpointIdentity | str, EndpointIdentity | str]:
        sink = RecordingSink()
        view = LbView((), "round_robin")
        lb = LoadBalancer("svc", StaticSource(view), None, FakeClock(0.0), hold_seconds=0, outcomes=(sink,),
                          identity={"service": "svc", "controller_id": "c1", "pid": 7})
        async with serve_lb(lb) as lb_url:
            ours = await asyncio.to_thread(read_endpoint_identity, lb_url)
        async with _replica() as replica:  # an HTTP server that is no load balancer: 404
            stranger = await asyncio.to_thread(read_endpoint_identity, replica)
        return ours, stranger

    ours, stranger = asyncio.run(body())
    assert ours == EndpointIdentity("svc", "c1", 7)
    assert find_identity_problem(ours, "svc", "c1", "E") is None
    assert find_identity_problem(ours, "svc", "c2", "E") == \
        "E is the endpoint of service 'svc' of controller c1 (pid 7), not of this service yet"
    assert isinstance(stranger, str) and "answered 404" in stranger
    refused = read_endpoint_identity(f"http://127.0.0.1:{find_free_port()}")
    assert isinstance(refused, str) and refused.startswith("nothing answers at")
