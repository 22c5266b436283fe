"""The canary split: the version drawn first by weight, then the policy among its replicas; counted per
version and status class for the judge."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Mapping

import aiohttp
import pytest
from aiohttp import web

from skyserve_lite.clock import FakeClock
from skyserve_lite.lb.outcomes import Failure, Outcome
from skyserve_lite.lb.policies import ROUND_ROBIN, InFlight, make_policy
from skyserve_lite.lb.proxy import LbView, LoadBalancer
from skyserve_lite.lb.split import Group, VersionSplit, find_group, find_groups
from skyserve_lite.lb.version_counts import CountKey, VersionCounter

from .serving import StaticSource, serve_app, serve_lb

OLD = ("http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003")
NEW = ("http://127.0.0.1:9004",)


@pytest.mark.parametrize(
    ("versions", "split", "groups"),
    [
        pytest.param((3, 3, 3, 4), ((4, 10),), ((10.0, (3,)), (100.0, (0, 1, 2))), id="ten-percent"),
        pytest.param((3, 4, 5), ((4, 10), (5, 30)), ((10.0, (1,)), (40.0, (2,)), (100.0, (0,))), id="two-shares"),
        pytest.param((3, 3, 3, 4), (), (), id="no-split"),
        pytest.param((3, 3, 3, 3), ((4, 10),), (), id="canary-not-ready-yet"),
        pytest.param((4, 4, 4, 4), ((4, 10),), (), id="no-old-replica-left"),
        pytest.param((3, 3, 3, 4), ((4, 0),), (), id="zero-percent"),
        pytest.param((), ((4, 10),), (), id="versions-unknown"),
    ],
)
def test_groups(versions: tuple[int, ...], split: tuple[tuple[int, int], ...], groups: tuple[Group, ...]) -> None:
    assert find_groups(versions, split) == groups


@pytest.mark.parametrize(("draw", "group"), [(0.0, 0), (7.3, 0), (10.0, 1), (42.0, 1), (99.99, 1)])
def test_a_draw_falls_in_one_group(draw: float, group: int) -> None:
    assert find_group(find_groups((3, 3, 3, 4), ((4, 10),)), draw) == group


def test_two_thousand_draws_at_ten_percent_give_the_new_version_ten_percent_within_three_points() -> None:
    split = VersionSplit(random.Random(28))
    split.set_view(OLD + NEW, (), (3, 3, 3, 4), ((4, 10),), ROUND_ROBIN, lambda: make_policy(ROUND_ROBIN, InFlight()))
    to_new = sum(1 for _ in range(2000) if split.select() == NEW[0])
    assert 0.07 * 2000 <= to_new <= 0.13 * 2000, to_new


def test_the_load_balancer_splits_then_round_robins_within_the_version() -> None:
    view = LbView(OLD + NEW, "round_robin", versions=(3, 3, 3, 4), split=((4, 10),))

    async def body() -> Counter[str]:
        lb = LoadBalancer("svc", StaticSource(view), None, FakeClock(0.0), hold_seconds=0,
                          split=VersionSplit(random.Random(7)))
        await lb.start()
        try:
            return Counter([await lb.select_target() or "" for _ in range(2000)])
        finally:
            await lb.close()

    chosen = asyncio.run(body())
    assert 140 <= chosen[NEW[0]] <= 260, chosen
    # Round robin among the old version's three replicas: as even as it is without a split.
    old = [chosen[url] for url in OLD]
    assert max(old) - min(old) <= 1, chosen


def test_every_replica_of_the_drawn_version_ejected_falls_back_to_any() -> None:
    split = VersionSplit(random.Random(1))
    split.set_view(OLD + NEW, (), (3, 3, 3, 4), ((4, 50),), ROUND_ROBIN, lambda: make_policy(ROUND_ROBIN, InFlight()))
    chosen = {split.select(exclude=NEW) for _ in range(50)}
    assert chosen == {None, *OLD}  # None: the caller chooses among every replica not excluded


def test_without_a_split_every_ready_replica_takes_its_turn() -> None:
    view = LbView(OLD + NEW, "round_robin", versions=(3, 3, 3, 4))

    async def body() -> Counter[str]:
        lb = LoadBalancer("svc", StaticSource(view), None, FakeClock(0.0), hold_seconds=0)
        await lb.start()
        try:
            return Counter([await lb.select_target() or "" for _ in range(400)])
        finally:
            await lb.close()

    assert asyncio.run(body()) == Counter({url: 100 for url in OLD + NEW})


def _replica(status: int) -> contextlib.AbstractAsyncContextManager[str]:
    """A replica answering every GET / with ``status``; yields its url."""
    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=status, text="hi")

    app = web.Application()
    app.router.add_get("/", answer)
    return serve_app(app)


def test_through_a_real_endpoint_the_split_and_the_counts_per_version() -> None:
    """400 requests through the load balancer's HTTP server at a 25% split: the new version (answering
    500) gets 25% +- 5 points of them, and the counter holds each version's answers by class."""
    clock = FakeClock(1000.0)
    counter = VersionCounter(clock)

    async def body() -> tuple[dict[CountKey, int], list[int]]:
        async with _replica(200) as old, _replica(500) as new, aiohttp.ClientSession() as session:
            view = LbView((old, new), "round_robin", versions=(1, 2), split=((2, 25),))
            lb = LoadBalancer("svc", StaticSource(view), None, clock, hold_seconds=0, outcomes=(counter,),
                              split=VersionSplit(random.Random(3)))
            async with serve_lb(lb) as lb_url:
                statuses = []
                for _ in range(400):
                    async with session.get(f"{lb_url}/", timeout=aiohttp.ClientTimeout(total=20)) as r:
                        await r.read()
                        statuses.append(r.status)
                await asyncio.sleep(0.05)  # the last release runs right after its body went out
        return counter.take_completed(), statuses

    counts, statuses = asyncio.run(body())
    to_new = counts.get((2, 1000, "5xx"), 0)
    assert 80 <= to_new <= 120, counts
    assert counts == {(1, 1000, "2xx"): 400 - to_new, (2, 1000, "5xx"): to_new}
    assert statuses.count(500) == to_new


def test_the_counter_counts_replica_outcomes_by_class_and_second() -> None:
    clock = FakeClock(100.0)
    counter = VersionCounter(clock)
    for outcome in (Outcome(2, "a", 200, 0.1, 1), Outcome(2, "a", 503, 0.1, 1), Outcome(2, "a", None, 0.1, 1,
                                                                                         Failure.RESET),
                    Outcome(None, None, 502, 0.1, 0), Outcome(2, "a", None, 0.1, 1, Failure.ABORTED)):
        counter.record(outcome)
    clock.advance(1.0)
    counter.record(Outcome(1, "b", 404, 0.1, 1))
    assert counter.take_completed(101) == {(2, 100, "2xx"): 1, (2, 100, "5xx"): 1, (2, 100, "failed"): 1}
    assert counter.take_completed(101) == {}
    assert counter.take_completed() == {(1, 101, "4xx"): 1}


def test_counts_a_write_failed_to_store_go_out_with_the_next_flush() -> None:
    clock = FakeClock(100.0)
    counter = VersionCounter(clock)
    counter.record(Outcome(2, "a", 200, 0.1, 1))
    clock.advance(1.0)
    written: list[Mapping[CountKey, int]] = []

    def broken(counts: Mapping[CountKey, int]) -> None:
        raise OSError("disk full")

    async def body() -> None:
        with pytest.raises(OSError):
            await counter.flush(broken)
        await counter.flush(written.append)

    asyncio.run(body())
    assert written == [{(2, 100, "2xx"): 1}]
