"""A replica killed in the middle of requests: what can be sent again is retried on the other replica and
counted, the dead replica is ejected after failing in a row, and once it runs again a trial request brings
it back into the rotation; the retries and the ejection show in the load balancer's metrics too. With one
replica, nothing is ever ejected.

The two replicas are processes of their own (``python -m tests.lb.misbehaving PORT``) so that one can be
killed with SIGKILL while it holds requests; the load balancer runs in the test's process, round robin.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.metrics import compute_lb_families, render_text
from skyserve_lite.lb.metrics import LbMetrics
from skyserve_lite.lb.outcomes import OutcomeSink
from skyserve_lite.lb.proxy import LbView, LoadBalancer
from skyserve_lite.lb.server import HttpServer
from skyserve_lite.procs import find_free_port

REPO = Path(__file__).resolve().parents[2]
EJECT_AFTER = 3
EJECT_SECONDS = 1.0


@contextlib.contextmanager
def _replica_process(port: int) -> Any:
    """A misbehaving replica in a process of its own on ``port``; killed (if still alive) on exit."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.lb.misbehaving", str(port)], cwd=REPO, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready"
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


class _Static:
    def __init__(self, urls: tuple[str, ...]) -> None:
        self.view = LbView(urls, "round_robin")

    def read(self) -> LbView:
        return self.view


@contextlib.asynccontextmanager
async def _lb(urls: tuple[str, ...], outcomes: tuple[OutcomeSink, ...] = ()
              ) -> AsyncIterator[tuple[str, LoadBalancer]]:
    lb = LoadBalancer("svc", _Static(urls), None, FakeClock(0.0), refresh_seconds=0.05, hold_seconds=0,
                      eject_after_failures=EJECT_AFTER, eject_seconds=EJECT_SECONDS, outcomes=outcomes)
    server = HttpServer(lb)
    await lb.start()
    try:
        host, port = (await server.start("127.0.0.1", 0))[0]
        yield f"http://{host}:{port}", lb
    finally:
        lb.stop_holding()
        await server.close()
        await lb.close()


async def _ask(session: aiohttp.ClientSession, method: str, url: str) -> tuple[int, str]:
    async with session.request(method, url, timeout=aiohttp.ClientTimeout(total=20)) as response:
        return response.status, await response.text()


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


@pytest.mark.timeout(120)
def test_a_replica_killed_mid_request_gets_its_requests_retried_elsewhere_then_ejected_then_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        caplog.set_level(logging.INFO, logger="skyserve_lite.lb.proxy")
        port_a, port_b = find_free_port(), find_free_port()
        name_a, name_b = f"127.0.0.1:{port_a}", f"127.0.0.1:{port_b}"
        url_a = f"http://{name_a}"
        metrics = LbMetrics("svc")
        with _replica_process(port_a) as process_a, _replica_process(port_b):
            async with _lb((url_a, f"http://{name_b}"), (metrics,)) as (lb_url, lb), \
                    aiohttp.ClientSession() as session:
                # 12 GETs and 4 POSTs that take the replicas 0.3 s, half of them on A, which dies meanwhile.
                requests = [("GET", f"{lb_url}/slow")] * 12 + [("POST", f"{lb_url}/slow")] * 4
                asked = [asyncio.ensure_future(_ask(session, method, url)) for method, url in requests]
                deadline = time.monotonic() + 10
                while dict(lb.in_flight()).get(url_a, 0) < 8:  # every one of A's half has been sent to it
                    assert time.monotonic() < deadline, lb.in_flight()
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.05)
                process_a.send_signal(signal.SIGKILL)
                process_a.wait(timeout=10)
                answers = await asyncio.gather(*asked)
                killed_mid_request = sum(1 for status, _ in answers if status != 200) + lb.retries
                gets = [answer for (method, _), answer in zip(requests, answers, strict=True) if method == "GET"]
                posts = [answer for (method, _), answer in zip(requests, answers, strict=True) if method == "POST"]
                # Every GET is answered, by B; a POST that A had received is not sent again: 502.
                assert all(answer == (200, f"slow from {name_b}") for answer in gets), gets
                assert all(answer in ((200, f"slow from {name_b}"),) or answer[0] == 502 for answer in posts), posts
                assert lb.retries >= 4, "A held about half of the 12 GETs when it died"
                assert sum(1 for status, _ in posts if status == 502) >= 1, posts
                assert killed_mid_request >= 6
                # Those were more than EJECT_AFTER failures in a row: A is out of the rotation, so the next
                # requests all go to B at once, with no retry.
                assert lb.ejected == {url_a}
                assert lb.ejections == 1
                # The same, as Prometheus reads the load balancer's metrics.
                families = {family.name: family for family in text_string_to_metric_families(
                    render_text(compute_lb_families([metrics.take_snapshot(lb, 1, 0.0)])))}
                assert families["skylite_lb_retries"].samples[0].value == lb.retries
                assert families["skylite_lb_ejections"].samples[0].value == 1
                assert families["skylite_lb_ejected_replicas"].samples[0].value == 1
                failed_on_a = sum(sample.value for sample in families["skylite_lb_attempt_failures"].samples
                                  if sample.labels["replica"] == url_a)
                assert failed_on_a >= lb.retries, "every retry began with a failed attempt on A"
                retries_before = lb.retries
                for _ in range(10):
                    assert await _ask(session, "GET", f"{lb_url}/ok") == (200, f"ok from {name_b}")
                assert lb.retries == retries_before
                # A runs again on its port; after the cool-down a trial request finds it and it is back.
                with _replica_process(port_a):
                    deadline = time.monotonic() + 20
                    served_by: collections.Counter[str] = collections.Counter()
                    while served_by[name_a] < 3:
                        assert time.monotonic() < deadline, f"A never came back: {served_by}"
                        status, text = await _ask(session, "GET", f"{lb_url}/ok")
                        assert status == 200
                        served_by[text.removeprefix("ok from ")] += 1
                        await asyncio.sleep(0.05)
                    assert lb.ejected == frozenset()
        messages = [record.getMessage() for record in caplog.records]
        retried = [line for line in messages if "retrying on" in line]
        assert len(retried) == lb.retries, retried
        assert all(f"retrying on http://{name_b}" in line for line in retried)
        assert any(f"replica {url_a} ejected for 1 s after {EJECT_AFTER} failed attempt(s) in a row" in line
                   for line in messages), messages
        assert any(f"replica {url_a} answered its trial request and is back" in line for line in messages)

    _run(body)


@pytest.mark.timeout(60)
def test_the_last_replica_is_never_ejected(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        port = find_free_port()  # nothing listens there: every attempt is refused
        async with _lb((f"http://127.0.0.1:{port}",)) as (lb_url, lb), aiohttp.ClientSession() as session:
            for _ in range(2 * EJECT_AFTER):
                status, text = await _ask(session, "GET", f"{lb_url}/ok")
                assert status == 502
                assert "Bad gateway" in text
            assert lb.ejected == frozenset()
            assert lb.ejections == 0
            # Once it runs, it is used at once: it never left the rotation.
            with _replica_process(port):
                assert await _ask(session, "GET", f"{lb_url}/ok") == (200, f"ok from 127.0.0.1:{port}")

    _run(body)
