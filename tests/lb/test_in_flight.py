"""The in-flight ledger: whatever ends a request, it stops counting as in flight to its replica.

1,000 requests through an in-process load balancer to three misbehaving replicas on 127.0.0.1
(``misbehaving.py``), mixing answers, client aborts (while the replica works, and in the middle of a
streamed body), upstream timeouts, upstream resets, and a replica taken out of READY and put back while
requests to it run. Afterwards every count in the load report the load balancer writes is 0, and so is
every in-flight gauge of its metrics as Prometheus parses them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.metrics import compute_lb_families, render_text
from skyserve_lite.lb.metrics import LbMetrics
from skyserve_lite.lb.pooled_upstream import PooledUpstream
from skyserve_lite.lb.proxy import LbReport, LbView, LoadBalancer
from skyserve_lite.lb.server import HttpServer

from .misbehaving import MisbehavingReplica, misbehaving_replica

REQUESTS = 1_000
CONCURRENCY = 40
# Well above what a reset takes on a busy machine (at 0.3 s, a CI run saw one reset answered 504: the
# event loop all of this shares was slower than the timeout), well below the hung replicas' HANG_SECONDS.
UPSTREAM_TIMEOUT = 1.0
# What each request does, by its index modulo 10, and what its client should get.
KINDS = ("ok", "ok", "ok", "client-abort", "client-abort", "hang", "reset", "stream-abort", "stream-abort", "ok")
EXPECTED = {"ok": "200", "client-abort": "aborted", "hang": "504", "reset": "502", "stream-abort": "aborted"}


class ChurningSource:
    """Three READY replicas, of which the last is taken out of the view and put back while requests run."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        self.urls = urls
        self.view = LbView(urls, "least_load")

    def read(self) -> LbView:
        return self.view

    def take_out_last(self, out: bool) -> None:
        self.view = LbView(self.urls[:-1] if out else self.urls, "least_load")


class ReportSink:
    def __init__(self) -> None:
        self.reports: list[LbReport] = []

    def record_request_counts(self, counts: Mapping[int, int]) -> None:
        pass

    def record_load(self, report: LbReport) -> None:
        self.reports.append(report)


async def _one(session: aiohttp.ClientSession, url: str, kind: str) -> str:
    """One request of ``kind``; what the client got: a status, "aborted", or an error's name."""
    path = {"ok": "/ok", "client-abort": "/slow", "hang": "/hang", "reset": "/reset", "stream-abort": "/stream"}[kind]
    try:
        if kind == "client-abort":

            async def ask() -> str:
                async with session.get(url + path) as response:
                    await response.read()
                    return str(response.status)

            try:
                return await asyncio.wait_for(ask(), 0.05)  # the replica takes 0.3 s: the client gives up first
            except asyncio.TimeoutError:
                return "aborted"
        async with session.get(url + path, timeout=aiohttp.ClientTimeout(total=20)) as response:
            if kind == "stream-abort":
                first = await response.content.readany()
                assert first.startswith(b"chunk 0;")
                response.close()  # mid-body: the connection is dropped
                return "aborted"
            await response.read()
            return str(response.status)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return type(exc).__name__


async def _churn(source: ChurningSource, stop: asyncio.Event) -> int:
    """Take the last replica out of the view and put it back every 0.2 s until ``stop``; the times out."""
    times = 0
    while not stop.is_set():
        source.take_out_last(times % 2 == 0)
        times += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    source.take_out_last(False)
    return times // 2 + times % 2


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


@pytest.mark.timeout(180)
def test_after_1000_requests_mixing_failures_every_in_flight_count_is_zero() -> None:
    async def body() -> None:
        async with contextlib.AsyncExitStack() as stack:
            replicas: list[MisbehavingReplica] = [
                await stack.enter_async_context(misbehaving_replica()) for _ in range(3)
            ]
            source = ChurningSource(tuple(replica.url for replica in replicas))
            sink = ReportSink()
            metrics = LbMetrics("svc")
            lb = LoadBalancer(
                "svc", source, sink, FakeClock(0.0), refresh_seconds=0.05, hold_seconds=5,
                upstream=lambda: PooledUpstream(response_timeout=UPSTREAM_TIMEOUT), outcomes=(metrics,),
            )
            server = HttpServer(lb)
            await lb.start()
            try:
                host, port = (await server.start("127.0.0.1", 0))[0]
                url = f"http://{host}:{port}"
                stop_churn = asyncio.Event()
                churn = asyncio.create_task(_churn(source, stop_churn))
                limit = asyncio.Semaphore(CONCURRENCY)
                connector = aiohttp.TCPConnector(limit=CONCURRENCY)
                async with aiohttp.ClientSession(connector=connector) as session:

                    async def limited(kind: str) -> tuple[str, str]:
                        async with limit:
                            return kind, await _one(session, url, kind)

                    results = await asyncio.gather(*(limited(KINDS[index % 10]) for index in range(REQUESTS)))
                stop_churn.set()
                churned = await churn
                finished = time.monotonic()
                # The load is reported when it changes and every 2 s: the last report after the requests
                # must show every replica at 0, and the ledger itself must agree.
                deadline = finished + 10
                while True:
                    last = sink.reports[-1] if sink.reports else None
                    if last is not None and all(n == 0 for _, n in last.in_flight) and last.waiting == 0 and \
                            len(last.in_flight) == 3:
                        break
                    assert time.monotonic() < deadline, f"in flight after the requests: {last}"
                    await asyncio.sleep(0.05)
                assert dict(last.in_flight) == {replica.url: 0 for replica in replicas}
                assert lb.in_flight() == last.in_flight
                # And as Prometheus reads it: every in-flight gauge at 0, nothing held.
                text = render_text(compute_lb_families([metrics.take_snapshot(lb, 1, 0.0)]))
                gauges = {sample.labels["replica"]: sample.value for family in text_string_to_metric_families(text)
                          if family.name == "skylite_lb_in_flight_requests" for sample in family.samples}
                assert gauges == {replica.url: 0 for replica in replicas}, text
                assert "skylite_lb_waiting_requests{service=\"svc\"} 0.0" in text
                failed: collections.Counter[str] = collections.Counter()
                for family in text_string_to_metric_families(text):
                    if family.name == "skylite_lb_attempt_failures":
                        for sample in family.samples:
                            failed[sample.labels["reason"]] += int(sample.value)
                # 100 hung requests time out; of the 200 clients that give up while their replica works,
                # most leave before its answer.
                assert failed["timeout"] >= 100 and failed["aborted"] >= 100, failed
            finally:
                lb.stop_holding()
                await server.close()
                await lb.close()
        outcomes = collections.Counter(f"{kind}: {got}" for kind, got in results)
        for kind, got in results:
            assert got == EXPECTED[kind] or (kind == "client-abort" and got == "200"), outcomes
        assert churned >= 3, "the replica was taken out and put back too few times to matter"
        # Every kind of failure happened, and reached the replicas.
        seen: collections.Counter[str] = sum((replica.requests for replica in replicas), collections.Counter())
        assert seen["/hang"] >= 100 and seen["/reset"] >= 100 and seen["/stream"] >= 200, seen
        # The replicas saw the load balancer give up on the hung and aborted requests: their connections closed.
        assert sum(replica.abandoned for replica in replicas) >= 100 + 150, outcomes

    _run(body)
