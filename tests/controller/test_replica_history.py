"""The replica history a controller keeps for `serve status NAME`: the first pass of each minute samples the
autoscaled services, the other passes write nothing, and samples older than an hour go."""

from __future__ import annotations

import json
import time

from skyserve_lite.api import LocalController
from skyserve_lite.controller.history import find_replica_samples
from skyserve_lite.controller.plan import PassPlan
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.snapshots import VersionCache, read_snapshot
from skyserve_lite.remote.client import RemoteController
from skyserve_lite.remote.transport import InProcessTransport
from skyserve_lite.state.history import HISTORY_MINUTES, ReplicaSample

from ..cli.runner import Cli
from .conftest import Harness

AUTO = """\
service:
  readiness_probe: /health
  replica_policy:
    min_replicas: 2
    max_replicas: 4
    target_qps_per_replica: 1
run: python -m http.server $PORT
"""
FIXED = "service:\n  readiness_probe: /health\n  replicas: 1\nrun: python -m http.server $PORT\n"


def minute_of(h: Harness) -> int:
    return int(h.clock.now() // 60)


def test_the_first_pass_of_a_minute_samples_and_the_others_write_nothing(harness: Harness) -> None:
    harness.create(text=AUTO)
    harness.create("fixed", text=FIXED)
    harness.tick()  # 00:00:01: two replicas launched, none READY yet
    first = minute_of(harness)
    assert harness.store.list_replica_samples("svc", 0) == [ReplicaSample("svc", first, 0, 2)]
    for _ in range(29):  # the rest of the minute at 2 s: both replicas turn READY, and nothing is written
        harness.tick(2)
    assert minute_of(harness) == first and all(r.status.value == "READY" for r in harness.replicas())
    assert harness.store.list_replica_samples("svc", 0) == [ReplicaSample("svc", first, 0, 2)]
    harness.tick(2)  # 00:01:01, the next minute
    assert harness.store.list_replica_samples("svc", 0) == [ReplicaSample("svc", first, 0, 2),
                                                            ReplicaSample("svc", first + 1, 2, 2)]
    assert harness.store.list_replica_samples("fixed", 0) == []  # a fixed policy has no history


def test_samples_older_than_an_hour_are_dropped(harness: Harness) -> None:
    harness.create(text=AUTO)
    harness.tick()
    first = minute_of(harness)
    for _ in range(HISTORY_MINUTES + 5):
        harness.tick(60)
    now = minute_of(harness)
    minutes = [s.minute for s in harness.store.list_replica_samples("svc", 0)]
    assert minutes == list(range(now - HISTORY_MINUTES, now + 1))
    assert minutes[0] > first


def test_a_controller_restart_in_the_same_minute_keeps_one_sample(harness: Harness) -> None:
    harness.create(text=AUTO)
    harness.tick()
    harness.reconciler = Reconciler(harness.store, {"local": harness.provider}, harness.prober, harness.lbs,
                                    harness.clock, harness.settings)
    harness.tick(2)
    harness.tick(2)
    # The new controller writes its first pass's counts over the old one's: one row per minute.
    assert harness.store.list_replica_samples("svc", 0) == [ReplicaSample("svc", minute_of(harness), 2, 2)]


def test_a_sample_counts_the_replicas_as_the_pass_leaves_them(harness: Harness) -> None:
    harness.create(text=AUTO)
    harness.tick()
    harness.tick()
    snapshot = read_snapshot(harness.store, harness.service(), harness.replicas(), harness.clock.now(),
                             harness.settings, lambda _pid: True, VersionCache())
    ready = [r for r in snapshot.replicas if r.status.value == "READY"]
    assert len(ready) == 2
    removed = PassPlan(removals=(("svc", ready[0].replica_id),))
    assert find_replica_samples([snapshot], removed, 120.0) == (ReplicaSample("svc", 2, 1, 2),)
    assert find_replica_samples([snapshot], PassPlan(deletions=("svc",)), 120.0) == ()


def test_status_carries_the_last_hour_as_json_and_as_a_line(harness: Harness) -> None:
    harness.create(text=AUTO)
    harness.create("fixed", text=FIXED)
    harness.tick()
    start = minute_of(harness)
    for _ in range(3):
        harness.tick(60)
    # 120 requests in the first sampled minute: 2 req/s.
    harness.store.record_request_counts("svc", {start * 60 + second: 2 for second in range(60)})
    controller = LocalController(harness.store.path.parent, harness.clock, start_daemon=False)
    [view] = controller.get_status(["svc"])
    assert view.history is not None
    offset = start - view.history.start_minute
    assert view.history.ready[offset:] == (0, 2, 2)
    assert view.history.requests_per_second[offset:offset + 2] == (2.0, 0.0)

    cli = Cli(controller)
    code, stdout, _stderr = cli("serve", "status", "svc", "fixed", "-o", "json")
    assert code == 0
    services = {s["name"]: s for s in json.loads(stdout)["services"]}
    history = services["svc"]["history"]
    assert history["step_seconds"] == 60 and len(history["ready_replicas"]) == HISTORY_MINUTES
    assert history["ready_replicas"][offset:] == [0, 2, 2] and history["requests_per_second"][offset] == 2.0
    assert services["fixed"]["history"] is None

    code, stdout, _stderr = cli("serve", "status", "svc", "fixed")
    [line] = [line for line in stdout.splitlines() if "(last hour)" in line]
    assert line.startswith("svc  req/s ") and " 0–2  ready " in line and line.endswith(" 0–2  (last hour)")
    assert len(line) <= 80
    # Without a name, status lists services and shows no history.
    code, stdout, _stderr = cli("serve", "status")
    assert code == 0 and "(last hour)" not in stdout


def test_the_history_travels_to_a_remote_client(harness: Harness) -> None:
    harness.create(text=AUTO)
    # The host's server reads its own (real) clock: the last whole minute before now.
    minute = int(time.time() // 60) - 1
    harness.store.record_request_counts("svc", {minute * 60 + second: 1 for second in range(60)})
    harness.store.record_replica_samples([ReplicaSample("svc", minute, 3, 4)], keep_from_minute=minute - 60)
    [view] = RemoteController(InProcessTransport(harness.store.path.parent)).get_status(["svc"])
    assert view.history is not None and len(view.history.requests) == HISTORY_MINUTES
    # Found wherever the window starts, should the minute have turned since.
    assert 60 in view.history.requests and 3 in view.history.ready and 4 in view.history.target
