"""Canary updates carried out by reconcile passes against the fake provider: the step's replicas only, the
split in the load balancer's view, rolled back on the new version's errors with no old replica lost,
promoted through every step, and continued from the stored step by another controller."""

from __future__ import annotations

from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.plan.canary import CanaryPhase, CanarySettings, CanaryState, Command
from skyserve_lite.state.models import ReplicaStatus

from .conftest import TASK, Harness

SETTINGS = CanarySettings(steps=(10, 50), bake_seconds=30, max_error_rate=0.02, min_requests=20, max_extensions=1)
NEW_TASK = TASK.format(replicas=4).replace("http.server $PORT", "http.server $PORT --bind 127.0.0.1")


def start(h: Harness, replicas: int = 4) -> set[int]:
    h.create(replicas=replicas)
    h.tick()
    h.tick()
    assert all(r.status is ReplicaStatus.READY for r in h.replicas())
    return {r.replica_id for r in h.replicas()}


def update_canary(h: Harness) -> int:
    version = h.update(NEW_TASK, mode="canary")
    h.store.put_canary("svc", CanaryState(version=version, settings=SETTINGS), 0, fenced=False)
    return version


def new_rows(h: Harness, version: int) -> list[int]:
    return [r.replica_id for r in h.replicas() if r.version == version and r.status.is_live]


def bake_step(h: Harness, version: int) -> float:
    """Passes until the step's replicas are READY and its window started; its start."""
    for _ in range(5):
        h.tick()
        stored = h.store.list_canaries("svc")["svc"].state
        if stored.window_start is not None:
            return stored.window_start
    raise AssertionError(f"the window never started: {h.store.list_canaries('svc')}")


def count(h: Harness, start: float, version: int, ok: int, errors: int) -> None:
    second = int(start) + 1
    h.store.record_version_counts("svc", {(version, second, "2xx"): ok, (version, second, "5xx"): errors})


def test_the_first_step_launches_its_share_and_splits_the_traffic(harness: Harness) -> None:
    start(harness)
    version = update_canary(harness)
    harness.tick()
    assert len(new_rows(harness, version)) == 1  # ceil(4 x 10%)
    view = harness.store.get_lb_view("svc")
    assert view is not None and version not in view.versions  # not READY yet: the old version serves all
    bake_step(harness, version)
    view = harness.store.get_lb_view("svc")
    assert view is not None and view.split == ((version, 10),) and view.versions.count(version) == 1
    assert len(view.versions) == 5


def test_errors_at_the_first_step_roll_back_with_no_old_replica_lost(harness: Harness) -> None:
    old = start(harness)
    version = update_canary(harness)
    harness.tick()
    window = bake_step(harness, version)
    count(harness, window, version, ok=148, errors=12)
    count(harness, window, 1, ok=1440, errors=0)
    harness.tick(31)
    canary = harness.store.list_canaries("svc")["svc"].state
    reason = "version 2 rolled back: 5xx 7.5% (12/160) over 30s at 10%, limit 2%"
    assert (canary.phase, canary.verdict) == (CanaryPhase.ROLLED_BACK, reason)
    service = harness.service()
    assert service.current_version == 3  # version 1's config again
    assert harness.store.get_version("svc", 3).note == reason
    assert any(e.message == reason for e in harness.store.list_events("svc"))
    view = harness.store.get_lb_view("svc")
    assert view is not None and view.split == () and set(view.versions) == {1}
    for _ in range(4):
        harness.tick(5)
    rows = {r.replica_id: (r.version, r.status) for r in harness.replicas()}
    assert {i: rows[i] for i in old} == {i: (3, ReplicaStatus.READY) for i in old}  # reused, none lost
    assert set(rows) == old  # the canary's replica drained and gone
    assert len(harness.provider.calls_to("terminate")) == 1


def test_a_good_version_is_promoted_through_every_step(harness: Harness) -> None:
    old = start(harness)
    version = update_canary(harness)
    harness.tick()
    window = bake_step(harness, version)
    count(harness, window, version, ok=160, errors=0)
    harness.tick(31)
    assert harness.store.list_canaries("svc")["svc"].state.step == 1
    harness.tick()
    assert len(new_rows(harness, version)) == 2  # ceil(4 x 50%)
    assert all(r.status is ReplicaStatus.READY for r in harness.replicas() if r.replica_id in old)
    window = bake_step(harness, version)
    assert harness.store.list_canaries("svc")["svc"].percent == 50
    count(harness, window, version, ok=400, errors=1)
    harness.tick(31)
    stored = harness.store.list_canaries("svc")["svc"]
    assert (stored.state.phase, stored.percent) == (CanaryPhase.PROMOTED, 100)
    for _ in range(6):
        harness.tick(5)
    rows = harness.replicas()
    assert {r.version for r in rows} == {version} and len(rows) == 4
    assert all(r.status is ReplicaStatus.READY for r in rows)


def test_nothing_of_the_old_version_is_terminated_before_the_last_step(harness: Harness) -> None:
    start(harness)
    version = update_canary(harness)
    for _ in range(10):
        harness.tick(10)  # no counts: the window is extended once, then paused
    assert harness.provider.calls_to("terminate") == []
    stored = harness.store.list_canaries("svc")["svc"].state
    assert stored.paused and stored.phase is CanaryPhase.STEPPING
    harness.store.request_canary_command("svc", Command.PROMOTE)
    harness.tick()
    assert harness.store.list_canaries("svc")["svc"].state.phase is CanaryPhase.PROMOTED
    assert harness.store.list_canaries("svc")["svc"].command is None
    assert len(new_rows(harness, version)) >= 1


def test_another_controller_continues_from_the_stored_step(harness: Harness) -> None:
    start(harness)
    version = update_canary(harness)
    harness.tick()
    window = bake_step(harness, version)
    count(harness, window, version, ok=160, errors=0)
    # The controller is gone; another one (nothing in memory) takes over from the store.
    h = harness
    h.reconciler = Reconciler(h.store, {"local": h.provider}, h.prober, h.lbs, h.clock, h.settings)
    h.tick(10)
    assert h.store.list_canaries("svc")["svc"].state.window_start == window  # the same window, not a new one
    h.tick(21)
    assert h.store.list_canaries("svc")["svc"].state.step == 1


def test_an_update_that_reuses_every_replica_has_nothing_to_judge(harness: Harness) -> None:
    start(harness)
    harness.update(TASK.format(replicas=4) + "# only a comment\n", mode="canary")
    harness.tick()
    stored = harness.store.list_canaries("svc")["svc"]
    assert stored.state.phase is CanaryPhase.NOTHING_TO_JUDGE
    assert any("nothing to judge" in e.message for e in harness.store.list_events("svc"))
    assert harness.provider.calls_to("launch")[1:] == []


def update_watched(h: Harness, mode: str = "rolling") -> int:
    version = h.update(NEW_TASK, mode=mode)
    h.store.put_canary("svc", CanaryState(version=version, settings=SETTINGS, phase=CanaryPhase.WATCHING), 100,
                       fenced=False)
    return version


# The verdict on a watched version's window of 80 2xx and 20 5xx (count(ok=80, errors=20)).
WATCHED_5XX_VERDICT = "version 2 rolled back: 5xx 20% (20/100) over 30s after taking traffic, limit 2%"


def bake_watched_with_one_new_ready(h: Harness) -> tuple[int, list[int], float, set[int]]:
    """A watched rolling update of 4 replicas whose first new replica becomes READY while the other three
    stay STARTING (inside their initial delay), so rolling has replaced one old replica when the window
    starts: (the version, its replicas, the window's start, the 3 old READY ones kept)."""
    old = start(h)
    version = update_watched(h)
    h.tick()
    new = new_rows(h, version)
    h.prober.set({("svc", rid): ProbeResult(ok=False, detail="HTTP 503") for rid in new[1:]})
    window = bake_step(h, version)
    kept = {r.replica_id for r in h.replicas() if r.version == 1 and r.status is ReplicaStatus.READY}
    assert len(kept) == 3 and kept < old
    return version, new, window, kept


def test_a_watched_rolling_update_with_errors_after_taking_traffic_is_rolled_back(harness: Harness) -> None:
    start(harness)
    version = update_watched(harness)
    harness.tick()
    window = bake_step(harness, version)  # its first replica READY and serving: the window starts
    # The mode's own traffic, as `serve status` shows the share: 100, not the 0 of a canary before its split.
    assert harness.store.list_canaries("svc")["svc"].percent == 100
    count(harness, window, version, ok=80, errors=20)
    count(harness, window, 1, ok=300, errors=0)
    # Rolling replaced all 4 old replicas before the window was judged: none is READY to take traffic back.
    assert not any(r.status is ReplicaStatus.READY for r in harness.replicas() if r.version == 1)
    harness.tick(31)
    reason = WATCHED_5XX_VERDICT
    rolled = harness.store.list_canaries("svc")["svc"]
    assert (rolled.state.verdict, rolled.percent) == (reason, 0)
    assert harness.service().current_version == 3
    assert harness.store.get_version("svc", 3).note == reason
    # Never 0 capacity: version 2 keeps serving, and the event says why, until version 3's replicas are READY.
    view = harness.store.get_lb_view("svc")
    assert view is not None and view.versions == (2, 2, 2, 2)
    assert [e.message for e in harness.store.list_events("svc") if e.message.startswith(reason)] == [
        f"{reason}; no READY replica of an older version remains: version 2 keeps serving until the "
        "rollback's replicas are READY"]
    for _ in range(8):
        harness.tick(5)
        view = harness.store.get_lb_view("svc")
        assert view is not None and len(view.ready_urls) >= 4
    rows = harness.replicas()
    assert {r.version for r in rows} == {3} and len(rows) == 4
    assert all(r.status is ReplicaStatus.READY for r in rows)


def test_a_watched_rollback_sends_the_traffic_back_to_the_old_replicas_at_once(harness: Harness) -> None:
    version, new, window, kept = bake_watched_with_one_new_ready(harness)
    count(harness, window, version, ok=80, errors=20)
    count(harness, window, 1, ok=300, errors=0)
    harness.tick(31)
    reason = WATCHED_5XX_VERDICT
    assert harness.service().current_version == 3
    # In the very pass that rolled it back: only the old replicas serve, every new one drains with the reason.
    view = harness.store.get_lb_view("svc")
    assert view is not None and view.versions == (1, 1, 1)
    rows = {r.replica_id: r for r in harness.replicas()}
    assert {(rows[i].status, rows[i].status_reason) for i in new} == {(ReplicaStatus.SHUTTING_DOWN, reason)}
    assert all(rows[i].status is ReplicaStatus.READY for i in kept)
    assert [e.message for e in harness.store.list_events("svc") if e.message.startswith(reason)] == [reason]
    for _ in range(8):
        harness.tick(5)
    rows = {r.replica_id: r for r in harness.replicas() if r.status.is_live}
    assert kept < set(rows) and len(rows) == 4  # the 3 old ones reused, one more of their config launched
    assert all(r.version == 3 and r.status is ReplicaStatus.READY for r in rows.values())


def test_a_watched_update_whose_replicas_keep_failing_is_rolled_back(harness: Harness) -> None:
    old = start(harness)
    version = update_watched(harness)
    harness.tick()
    new = new_rows(harness, version)
    harness.prober.set({("svc", rid): ProbeResult(ok=False, detail="HTTP 500") for rid in new})
    for _ in range(4):
        harness.tick(30)  # past the 60 s initial delay: FAILED_INITIAL_DELAY, launching stops at 3
    reason = harness.store.list_canaries("svc")["svc"].state.verdict
    assert reason == "version 2 rolled back: 4 replicas failed before becoming ready"
    assert harness.service().current_version == 3
    harness.tick()
    rows = {r.replica_id: r for r in harness.replicas() if r.status.is_live}
    assert set(rows) == old and all(r.version == 3 for r in rows.values())  # the old ones, reused


def test_a_watched_update_with_a_good_window_ends_the_watch(harness: Harness) -> None:
    start(harness)
    version = update_watched(harness)
    harness.tick()
    window = bake_step(harness, version)
    count(harness, window, version, ok=200, errors=0)
    harness.tick(31)
    stored = harness.store.list_canaries("svc")["svc"].state
    assert stored.phase is CanaryPhase.PROMOTED and harness.service().current_version == version
    for _ in range(6):
        harness.tick(5)
    assert {r.version for r in harness.replicas()} == {version}


def pause_for_too_few_requests(h: Harness) -> int:
    """A canary whose windows see no requests: extended once (max_extensions 1), then paused for a person."""
    start(h)
    version = update_canary(h)
    h.tick()
    window = bake_step(h, version)
    h.tick(31)
    extended = h.store.list_canaries("svc")["svc"].state
    assert (extended.window_start, extended.extensions, extended.paused) == (window, 1, False)
    assert extended.verdict is not None and "fewer than the 20 needed to judge; baking 30s more (1 of 1)" in \
        extended.verdict
    h.tick(30)
    paused = h.store.list_canaries("svc")["svc"]
    assert paused.state.paused and paused.state.phase is CanaryPhase.STEPPING and paused.percent == 10
    assert paused.state.verdict is not None and "paused after 1 extension:" in paused.state.verdict
    for _ in range(3):
        h.tick(60)  # a person has not decided: held where it is, nothing judged, nothing terminated
    assert h.store.list_canaries("svc")["svc"] == paused
    assert h.provider.calls_to("terminate") == []
    return version


def test_a_person_resumes_a_paused_canary_with_a_fresh_window(harness: Harness) -> None:
    version = pause_for_too_few_requests(harness)
    harness.store.request_canary_command("svc", Command.RESUME)
    harness.tick()
    resumed = harness.store.list_canaries("svc")["svc"]
    assert not resumed.state.paused and resumed.command is None and resumed.state.extensions == 0
    # A new window from the resume pass on, and the 10% the pause held is kept through it: the new version
    # stays among the versions the load balancer sends to.
    window = resumed.state.window_start
    assert window == harness.clock.now() and resumed.percent == 10
    assert version in (harness.service().active_versions or ())
    count(harness, window, version, ok=40, errors=0)
    harness.tick(31)
    assert harness.store.list_canaries("svc")["svc"].state.step == 1


def test_a_person_aborts_a_paused_canary(harness: Harness) -> None:
    version = pause_for_too_few_requests(harness)
    old = {r.replica_id for r in harness.replicas() if r.version != version}
    harness.store.request_canary_command("svc", Command.ABORT)
    harness.tick()
    stored = harness.store.list_canaries("svc")["svc"].state
    assert (stored.phase, stored.verdict) == (CanaryPhase.ROLLED_BACK,
                                              "version 2 rolled back: aborted by an operator at 10%")
    view = harness.store.get_lb_view("svc")
    assert view is not None and set(view.versions) == {1}
    for _ in range(4):
        harness.tick(5)
    assert {r.replica_id for r in harness.replicas() if r.status.is_live} == old


def test_a_watched_rollback_cut_short_after_its_verdict_is_carried_out_by_the_next_pass(harness: Harness) -> None:
    version, new, _, _ = bake_watched_with_one_new_ready(harness)
    # The pass that judged it stored the verdict (the executor's first write) and stopped there: no drain, no
    # rollback version. The next pass, by this or another controller, carries both out.
    reason = WATCHED_5XX_VERDICT
    harness.store.put_canary("svc", CanaryState(version=version, settings=SETTINGS, phase=CanaryPhase.ROLLED_BACK,
                                                verdict=reason), 0)
    harness.reconciler = Reconciler(harness.store, {"local": harness.provider}, harness.prober, harness.lbs,
                                    harness.clock, harness.settings)
    harness.tick()
    assert harness.service().current_version == 3
    assert harness.store.get_version("svc", 3).note == reason
    view = harness.store.get_lb_view("svc")
    assert view is not None and view.versions == (1, 1, 1)
    assert {r.status for r in harness.replicas() if r.replica_id in new} == {ReplicaStatus.SHUTTING_DOWN}


def test_a_canary_rolled_back_with_no_old_replica_ready_keeps_serving_until_the_rollback_is(harness: Harness
                                                                                           ) -> None:
    old = start(harness)
    version = update_canary(harness)
    harness.tick()
    bake_step(harness, version)
    # Every old replica stops answering its probe (NOT_READY, out of traffic): only the canary's serves.
    harness.prober.set({("svc", rid): ProbeResult(ok=False, detail="HTTP 503") for rid in old})
    harness.tick()
    assert {r.status for r in harness.replicas() if r.replica_id in old} == {ReplicaStatus.NOT_READY}
    harness.store.request_canary_command("svc", Command.ABORT)
    harness.tick()
    reason = "version 2 rolled back: aborted by an operator at 10%"
    assert harness.store.list_canaries("svc")["svc"].state.verdict == reason
    assert harness.service().current_version == 3
    # Draining the canary's replica would leave nothing to answer: it keeps serving, and the event says so.
    [canary] = [r for r in harness.replicas() if r.version == version]
    assert canary.status is ReplicaStatus.READY
    view = harness.store.get_lb_view("svc")
    assert view is not None and view.versions == (version,)
    assert [e.message for e in harness.store.list_events("svc") if e.message.startswith(reason)] == [
        f"{reason}; no READY replica of an older version remains: version 2 keeps serving until the "
        "rollback's replicas are READY"]


def test_a_watched_blue_green_update_failing_before_its_switch_leaves_the_old_ones_serving(harness: Harness
                                                                                           ) -> None:
    old = start(harness)
    version = update_watched(harness, mode="blue_green")
    harness.tick()
    new = new_rows(harness, version)
    assert len(new) == 4
    harness.prober.set({("svc", rid): ProbeResult(ok=False, detail="HTTP 500") for rid in new})
    for _ in range(4):
        harness.tick(30)  # past the 60 s initial delay: failed before READY, launching stops
        view = harness.store.get_lb_view("svc")
        assert view is not None and set(view.versions) == {1} and len(view.versions) == 4  # never switched
    assert harness.store.list_canaries("svc")["svc"].state.phase is CanaryPhase.ROLLED_BACK
    assert harness.service().current_version == 3
    harness.tick()
    rows = {r.replica_id: r for r in harness.replicas() if r.status.is_live}
    assert set(rows) == old and all(r.version == 3 and r.status is ReplicaStatus.READY for r in rows.values())


def test_a_watched_blue_green_update_failing_after_its_switch_serves_until_the_rollback_is_ready(
        harness: Harness) -> None:
    start(harness)
    version = update_watched(harness, mode="blue_green")
    harness.tick()
    window = bake_step(harness, version)  # all 4 new READY: the switch, the old ones drained
    assert not any(r.status is ReplicaStatus.READY for r in harness.replicas() if r.version == 1)
    count(harness, window, version, ok=80, errors=20)
    harness.tick(31)
    assert harness.service().current_version == 3
    view = harness.store.get_lb_view("svc")
    assert view is not None and view.versions == (2, 2, 2, 2)  # not 0 replicas: the new ones until v3's
    for _ in range(8):
        harness.tick(5)
        view = harness.store.get_lb_view("svc")
        assert view is not None and len(view.ready_urls) >= 4
    rows = harness.replicas()
    assert {r.version for r in rows} == {3} and len(rows) == 4
