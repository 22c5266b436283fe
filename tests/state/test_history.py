"""The last hour of a service: request counts per minute, replica samples, and the history built from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.history import (
    HISTORY_MINUTES,
    ReplicaSample,
    ServiceHistory,
    compute_service_history,
    history_start_minute,
)
from skyserve_lite.state.store import Store

NOW = 1_767_225_600.0 + 30  # 2026-01-01T00:00:30Z: minute 29_453_760, 30 s into it
MINUTE = 29_453_760
TEXT = "service:\n  replicas: 1\nrun: echo hi\n"


def create(store: Store, name: str = "svc") -> None:
    store.create_service(name, SubmittedTask(text=TEXT, source="/t.yaml", spec=parse_task(TEXT)),
                         30001 + len(store.list_services()), now=NOW)


@pytest.mark.parametrize(
    ("now", "start"),
    [(NOW, MINUTE - 60), (MINUTE * 60.0, MINUTE - 60), (MINUTE * 60.0 + 59.9, MINUTE - 60),
     (MINUTE * 60.0 + 60, MINUTE - 59)],
)
def test_the_history_is_the_60_whole_minutes_before_the_current_one(now: float, start: int) -> None:
    assert history_start_minute(now) == start


def test_compute_service_history_fills_each_minute_of_the_window() -> None:
    start = MINUTE - HISTORY_MINUTES
    requests = {start - 1: 99, start: 60, start + 2: 120, MINUTE: 5}  # the first and last are outside
    samples = [ReplicaSample("svc", start - 1, 9, 9), ReplicaSample("svc", start + 1, 1, 2),
               ReplicaSample("svc", MINUTE - 1, 3, 3), ReplicaSample("svc", MINUTE, 4, 4)]
    history = compute_service_history(NOW, requests, samples)
    assert history.start_minute == start
    assert history.requests == (60, 0, 120) + (0,) * 57
    assert history.ready == (None, 1) + (None,) * 57 + (3,)
    assert history.target == (None, 2) + (None,) * 57 + (3,)
    assert history.requests_per_second[:3] == (1.0, 0.0, 2.0)


def test_history_json() -> None:
    history = ServiceHistory(start_minute=MINUTE, requests=(60, 7), ready=(1, None), target=(2, None))
    assert history.to_json() == {"start": "2026-01-01T00:00:00Z", "step_seconds": 60,
                                 "requests_per_second": [1.0, 0.117], "ready_replicas": [1, None],
                                 "target_replicas": [2, None]}


def test_requests_by_minute_add_up_each_minute(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    base = MINUTE * 60
    store.record_request_counts("svc", {base - 61: 4, base - 60: 1, base - 1: 2, base: 3, base + 59: 5})
    store.record_request_counts("other", {base: 100})
    assert store.count_requests_by_minute("svc", MINUTE - 1) == {MINUTE - 1: 3, MINUTE: 8}
    assert store.count_requests_by_minute("svc", MINUTE - 2) == {MINUTE - 2: 4, MINUTE - 1: 3, MINUTE: 8}
    assert store.count_requests_by_minute("nope", 0) == {}


def test_request_counts_are_kept_for_the_whole_oldest_minute_of_the_history(tmp_path: Path) -> None:
    # At 00:00:59 the history starts at 23:00:00, 3659 s before; the load balancer's newest count is of
    # 00:00:58 and it drops what is older than its keep time before that: none of 23:00 may go.
    store = Store.open(tmp_path)
    now = MINUTE * 60 + 59
    start = history_start_minute(now)
    store.record_request_counts("svc", {start * 60: 1, start * 60 + 59: 1})
    store.record_request_counts("svc", {now - 1: 1})
    assert store.count_requests_by_minute("svc", start)[start] == 2


def test_replica_samples_replace_within_a_minute_and_older_ones_are_dropped(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    create(store)
    create(store, "web")
    store.record_replica_samples([ReplicaSample("svc", MINUTE - 61, 1, 1), ReplicaSample("web", MINUTE - 61, 5, 5)],
                                 keep_from_minute=MINUTE - 121)
    store.record_replica_samples([ReplicaSample("svc", MINUTE - 60, 1, 2)], keep_from_minute=MINUTE - 120)
    store.record_replica_samples([ReplicaSample("svc", MINUTE, 2, 2)], keep_from_minute=MINUTE - 60)
    store.record_replica_samples([ReplicaSample("svc", MINUTE, 3, 3)], keep_from_minute=MINUTE - 60)
    # Minute - 61 is gone for every service, not only for those sampled in the write that dropped it.
    assert store.list_replica_samples("svc", 0) == [ReplicaSample("svc", MINUTE - 60, 1, 2),
                                                    ReplicaSample("svc", MINUTE, 3, 3)]
    assert store.list_replica_samples("web", 0) == []
    assert store.list_replica_samples("svc", MINUTE) == [ReplicaSample("svc", MINUTE, 3, 3)]


def test_samples_of_a_service_that_is_gone_are_not_written_and_go_with_it(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    create(store)
    store.record_replica_samples([ReplicaSample("svc", MINUTE, 1, 1), ReplicaSample("gone", MINUTE, 1, 1)],
                                 keep_from_minute=MINUTE - 60)
    assert store.list_replica_samples("gone", 0) == []
    store.delete_service("svc")
    assert store.list_replica_samples("svc", 0) == []
