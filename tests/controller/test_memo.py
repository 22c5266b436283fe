"""The memo per service is keyed by the database's change counter: which services a pass reads again, and
when a settled mark holds, as tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.controller.pass_types import ServiceSnapshot
from skyserve_lite.controller.service_steps import StepCensus
from skyserve_lite.controller.settled import ServiceMemo, ServiceMemos, find_stale
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ServiceRecord, ServiceStatus
from skyserve_lite.state.store import Store

from .conftest import Harness

TEXT = "service:\n  replicas: 1\nrun: echo hi\n"


def memo(generation: int | None) -> ServiceMemo:
    return ServiceMemo(generation, ())


@pytest.mark.parametrize(("memos", "generations", "services", "stale"), [
    # Counters as the memos were made: nothing is read again.
    ({"a": 3, "b": 7}, {"a": 3, "b": 7}, ["a", "b"], []),
    # Another controller (or the CLI) wrote a row of b: only b is read again.
    ({"a": 3, "b": 7}, {"a": 3, "b": 8}, ["a", "b"], ["b"]),
    # A new service: no memo yet.
    ({"a": 3}, {"a": 3, "c": 1}, ["a", "c"], ["c"]),
    # A service without a counter (none moved since the counters began) is never kept past its pass.
    ({"a": None}, {}, ["a"], ["a"]),
    ({}, {}, ["a"], ["a"]),
    # A service deleted and created again under its name counts on: the old memo does not match.
    ({"a": 5}, {"a": 9}, ["a"], ["a"]),
    # Only the services asked about: a counter of a service that is gone is not read.
    ({"a": 3}, {"a": 3, "gone": 4}, ["a"], []),
])
def test_find_stale(memos: dict[str, int | None], generations: dict[str, int], services: list[str],
                    stale: list[str]) -> None:
    assert find_stale({name: memo(g) for name, g in memos.items()}, generations, services) == stale


def snapshot(lb_alive: bool = True) -> ServiceSnapshot:
    service = ServiceRecord(name="a", current_version=1, status=ServiceStatus.READY, status_reason=None,
                            lb_port=30001, lb_pid=1, lb_policy="round_robin", deleting=False, created_at=1.0,
                            next_replica_id=2)
    return ServiceSnapshot(service, {1: parse_task(TEXT)}, (), lb_alive)


CENSUS = StepCensus.of([], 1)
CLOUDS = frozenset({"local"})


@pytest.mark.parametrize(("generation", "lb_alive", "clouds", "found"), [
    (4, True, CLOUDS, True),  # nothing moved: settled
    (5, True, CLOUDS, False),  # a row of the service was written (by anyone)
    (4, False, CLOUDS, False),  # its load balancer died
    (4, True, frozenset(), False),  # its cloud's inventory was not read this pass
])
def test_a_settled_mark_holds_only_under_the_key_it_was_made_with(generation: int, lb_alive: bool,
                                                                   clouds: frozenset[str], found: bool) -> None:
    memos = ServiceMemos()
    memos.refresh({"a": 4}, ["a"], {"a": ()})
    memos.next_pass()
    memos.remember(snapshot(), CLOUDS, CENSUS)
    memos.next_pass()
    if generation != 4:
        memos.refresh({"a": generation}, ["a"], {"a": ()})
    assert (memos.find(snapshot(lb_alive), clouds) is CENSUS) is found


def test_a_settled_mark_not_renewed_by_a_pass_is_dropped() -> None:
    memos = ServiceMemos()
    memos.refresh({"a": 4}, ["a"], {"a": ()})
    memos.next_pass()
    memos.remember(snapshot(), CLOUDS, CENSUS)
    memos.next_pass()
    assert memos.find(snapshot(), CLOUDS) is CENSUS
    memos.carry(snapshot())
    memos.next_pass()
    assert memos.find(snapshot(), CLOUDS) is CENSUS
    memos.next_pass()  # the pass in between decided something for it (neither carried nor remembered)
    assert memos.find(snapshot(), CLOUDS) is None


def test_a_memo_of_a_service_gone_is_forgotten_and_its_replicas_leave_the_table() -> None:
    memos = ServiceMemos()
    memos.refresh({"a": 1, "b": 1}, ["a", "b"], {"a": (), "b": ()})
    memos.keep_snapshot(snapshot())
    assert memos.last_snapshot("a") is not None
    memos.refresh({"a": 1}, ["b"], {})
    assert memos.last_snapshot("a") is None and memos.all_replicas() == ()


def test_a_row_written_while_a_pass_reads_is_read_again_by_the_next_pass(tmp_path: Path) -> None:
    """Another process commits a service row just after this pass read the services: the pass read the
    counters before the rows, so its memo is keyed by the counter before that write, and the next pass reads
    the service again (and puts its status right) instead of keeping the row it read too early."""
    harness = Harness(tmp_path / "home")
    harness.create("svc", replicas=1)
    for _ in range(4):
        harness.tick()
    assert harness.service().status is ServiceStatus.READY
    read = harness.store.list_services
    writes = [lambda: Store.open(harness.home).set_service_status("svc", ServiceStatus.REPLICA_INIT, "elsewhere")]

    def read_then_someone_writes() -> list[ServiceRecord]:
        found = read()
        while writes:
            writes.pop()()
        return found

    harness.store.list_services = read_then_someone_writes  # type: ignore[method-assign]
    harness.tick()
    assert harness.service().status is ServiceStatus.REPLICA_INIT  # written after this pass read it
    harness.tick()
    assert harness.service().status is ServiceStatus.READY
    harness.store.close()
