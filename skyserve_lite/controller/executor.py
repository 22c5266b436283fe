"""Applies a ``PassPlan``: the only code that calls a provider or writes replica rows and service status.

Order matters for crash safety:

1. replica status changes are written first (a replica marked FAILED is not counted again);
2. instances are terminated, rows whose instance is gone are removed;
3. launches write their intent (PROVISIONING rows with a launch token) *before* the provider is asked,
   then record each outcome; a crash in between leaves rows that the next pass adopts or relaunches;
4. load balancers, service statuses, deletions and events follow.

Provider errors never escape: they become replica status reasons and events, and the next pass (which
sees the same level) tries again. Every event the executor stores is also a line of the controller's log
(``log_event``: INFO, WARNING for a failure), so the log says what `serve status` says: each launch, reuse,
drain and termination, and each failure with its reason.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from skyserve_lite.clock import Clock
from skyserve_lite.controller.lb_runner import LoadBalancerRunner, find_lb_port
from skyserve_lite.controller.plan import Event, LaunchBatch, PassPlan, Termination
from skyserve_lite.errors import ProviderError, StateConflictError, TransientProviderError
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.providers.base import InstanceState, LaunchOutcome, LaunchRequest, Provider
from skyserve_lite.spec.model import Secret, TaskSpec
from skyserve_lite.state.history import HISTORY_MINUTES, ReplicaSample
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, replace_replica
from skyserve_lite.state.secrets import SecretStore
from skyserve_lite.state.store import Store

log = logging.getLogger(__name__)

# How often a pass records that it completed: one small write per 5 s, not per pass (steady passes write
# nothing else). `serve status` calls a heartbeat older than 30 s (or 10 passes) stale.
HEARTBEAT_SECONDS = 5.0


# A secret value younger than this is kept though no version names it yet (its submission is under way).
SECRET_GRACE_SECONDS = 3600.0


def log_event(event: Event) -> None:
    """The controller log's line of an event: ``service web replica 3: launching version 2 on local``."""
    who = f"service {event.service}" + (f" replica {event.replica_id}" if event.replica_id is not None else "")
    log.log(logging.WARNING if event.warning else logging.INFO, "%s: %s", who, event.message)


class Executor:
    def __init__(self, store: Store, providers: Mapping[str, Provider], lb_runner: LoadBalancerRunner,
                 clock: Clock, *, new_token: Callable[[], str] | None = None, blobs: BlobStore | None = None,
                 secrets: SecretStore | None = None) -> None:
        self._store = store
        self._secrets = secrets
        self._providers = providers
        self._lb_runner = lb_runner
        self._clock = clock
        self._new_token = new_token or (lambda: uuid.uuid4().hex)
        self._blobs = blobs
        self._collected_once = False
        self._port_conflicts: set[str] = set()  # services whose pinned port another process holds
        self._heartbeat_at = float("-inf")
        self._history_minute: int | None = None  # the minute whose replica samples were written last

    def record_replica_history(self, samples: Sequence[ReplicaSample]) -> None:
        """Write the replica samples of a minute (``controller.history``) once: the first pass of the minute
        writes them and drops those older than ``HISTORY_MINUTES`` in the same transaction; the other passes
        of the minute (29 of 30 at a 2 s interval) write nothing. With no sample nothing is written, not even
        the pruning: nothing grows then either."""
        if not samples or samples[0].minute == self._history_minute:
            return
        minute = samples[0].minute
        self._store.record_replica_samples(samples, keep_from_minute=minute - HISTORY_MINUTES)
        self._history_minute = minute

    def record_pass(self) -> None:
        """Record that a pass completed, at most every ``HEARTBEAT_SECONDS``."""
        now = self._clock.now()
        if now - self._heartbeat_at >= HEARTBEAT_SECONDS:
            self._store.record_pass(now)
            self._heartbeat_at = now

    def collect_garbage(self, *, force: bool = False) -> None:
        """Delete the blobs no stored version needs any more: on the first pass (what a submission that
        failed half-way left), after a service was deleted (``force``), and when a submission expired
        snapshots. A capture under way defers it to a later pass."""
        if not (force or not self._collected_once or self._store.gc_pending):
            return
        if self._secrets is not None:
            dropped = self._secrets.collect(self._store.find_needed_secrets(),
                                            older_than=self._clock.now() - SECRET_GRACE_SECONDS)
            if dropped:
                log.info("deleted %d secret values that no version names", dropped)
        if self._blobs is None:
            self._collected_once = True
            return
        deleted = self._blobs.collect_garbage(self._store.find_needed_blobs)
        self._collected_once = True
        if deleted is None:
            self._store.set_gc_pending(True)
            return
        if self._store.gc_pending:
            self._store.set_gc_pending(False)
        if deleted:
            log.info("deleted %d blobs that no version needs", deleted)

    def apply(self, plan: PassPlan) -> None:
        events: list[Event] = list(plan.events)
        # A canary's step before the versions that serve: a load balancer reading between the two sees the new
        # share with the new version not serving yet (no split, the old version serves all), never the new
        # version serving without its share. A crash between them repeats the step from the stored state.
        for update in plan.canary_updates:
            self._store.put_canary(update.service, update.state, update.percent, done_command=update.done_command)
        self._store.put_replicas(plan.replica_updates, dict(plan.active_version_changes))
        if plan.requests_done:  # after the drains they asked for are stored: a crash between repeats them
            self._store.delete_replica_terminations(plan.requests_done)
        terminations, launches = self._drop_lost(plan)
        self._terminate(terminations)
        self._store.delete_replicas(plan.removals)
        self._launch_all(launches, events)
        self._apply_load_balancers(plan, events)
        self._store.set_service_statuses(plan.status_changes)
        self._store.put_autoscaler_states([u for u in plan.autoscaler_updates if u[0] not in plan.deletions])
        for rollback in plan.rollbacks:
            self._store.add_rollback_version(rollback.service, rollback.from_version, rollback.to_version,
                                             rollback.note, self._clock.now())
        for name in plan.deletions:
            self._delete_service(name)
        now = self._clock.now()
        self._store.add_events([(now, e.service, e.replica_id, e.kind, e.message) for e in events])
        for event in events:
            log_event(event)

    def abandon(self) -> None:
        """The state directory was deleted under the controller: ask every provider to stop what only it
        can still find (local processes it started), since no later pass will ever see them again."""
        for cloud, provider in self._providers.items():
            try:
                provider.abandon()
            except ProviderError as exc:
                log.warning("abandoning %s failed: %s", cloud, exc)

    def _delete_service(self, name: str) -> None:
        """Release what the clouds the service used keep for it (files, buckets), then forget it. When a
        release fails the service stays, SHUTTING_DOWN with no replica, and the next pass tries again:
        deleting the row first would leak whatever the release did not remove."""
        clouds = {version.spec.cloud.value for version in self._store.list_versions(name)}
        for cloud in sorted(clouds):
            provider = self._providers.get(cloud)
            if provider is None:
                continue
            try:
                provider.release_service(name)
            except ProviderError as exc:
                log.warning("releasing %s on %s failed, retrying next pass: %s", name, cloud, exc)
                self._store.add_events([(self._clock.now(), name, None, "provider",
                                         f"releasing {cloud} resources failed, will retry: {exc}")])
                return
        self._store.delete_service(name)

    def _drop_lost(self, plan: PassPlan) -> tuple[Sequence[Termination], Sequence[LaunchBatch]]:
        """The plan's terminations and launches less those of services whose lease this loop lost since the
        pass read it (``Store.find_lost_leases``, one read, just before the cloud calls). Rows are fenced by
        their transactions, cloud calls are not: a loop paused between reading its leases and terminating
        (a slow listing, a stopped VM) would otherwise terminate an instance the new owner just launched and
        that the paused loop's stale rows do not claim. A launch of a lost service is dropped as well: its
        new rows' intents would not be written anyway, but a retry re-sends a row written before."""
        if not plan.terminations and not plan.launches:
            return (), ()
        lost = self._store.find_lost_leases({t.service for t in plan.terminations}
                                            | {b.service for b in plan.launches}, self._clock.now())
        if not lost:
            return plan.terminations, plan.launches
        log.warning("lease of %s lost since this pass read it: its terminations and launches are dropped",
                    ", ".join(sorted(lost)))
        return ([t for t in plan.terminations if t.service not in lost],
                [b for b in plan.launches if b.service not in lost])

    def _terminate(self, terminations: Sequence[Termination]) -> None:
        by_cloud: dict[str, list[str]] = defaultdict(list)
        for termination in terminations:
            by_cloud[termination.cloud].append(termination.instance_id)
        for cloud, instance_ids in by_cloud.items():
            provider = self._providers.get(cloud)
            if provider is None:
                continue
            try:
                provider.terminate(instance_ids)
            except ProviderError as exc:
                # The instances are still observed next pass, whose plan asks to terminate them again.
                log.warning("terminating %s on %s failed, retrying next pass: %s", instance_ids, cloud, exc)

    def _read_secrets(self, spec: TaskSpec) -> tuple[tuple[str, Secret], ...]:
        """The values of ``spec``'s secrets; ``StateConflictError`` when one is not in the store."""
        if not spec.secrets:
            return ()
        if self._secrets is None:
            raise StateConflictError("this controller has no secret store: the task's secrets cannot be read")
        return tuple((name, self._secrets.get(digest)) for name, digest in spec.secrets)

    def _launch_all(self, batches: Sequence[LaunchBatch], events: list[Event]) -> None:
        """Record the intent of every batch (one transaction, before any provider is asked), launch each
        batch, and store every outcome (one transaction). A crash in between leaves rows with no instance
        id: the next pass adopts their instances by tags, or re-sends them with the same launch token."""
        if not batches:
            return
        now = self._clock.now()
        fresh = [(b.service, b.count, ReplicaRecord(
            service=b.service, replica_id=0, version=b.version, status=ReplicaStatus.PROVISIONING, cloud=b.cloud,
            launched_at=now, status_since=now, launch_token=self._new_token(), is_spot=b.is_spot,
        )) for b in batches if b.count]
        added = iter(self._store.add_replica_batches(fresh))
        outcomes: list[ReplicaRecord] = []
        try:
            for batch in batches:
                rows = list(batch.retry)
                if batch.count:
                    new = next(added)
                    if new is None:  # the service was deleted since the pass read it: launch none of it
                        continue
                    rows.extend(new)
                    events.extend(Event(batch.service, r.replica_id, "replica",
                                        f"launching version {batch.version} on {batch.cloud}") for r in new)
                if rows:
                    outcomes.extend(self._launch(batch, rows, now, events))
        finally:
            # What was launched before a batch that raised is stored all the same; rows of a service deleted
            # meanwhile are left out (their instances are orphans, terminated by the next pass), so that one
            # such row does not lose every other outcome of the pass.
            self._store.put_replicas(outcomes, skip_deleted_services=True)

    def _launch(self, batch: LaunchBatch, rows: list[ReplicaRecord], now: float,
                events: list[Event]) -> list[ReplicaRecord]:
        """Ask the batch's provider for ``rows`` (recorded already); the rows as the outcomes leave them."""
        provider = self._providers.get(batch.cloud)
        if provider is None:
            reason = f"no provider for cloud {batch.cloud!r}"
            events.extend(Event(r.service, r.replica_id, "replica", f"FAILED_PROVISION: {reason}", warning=True)
                          for r in rows)
            return [replace_replica(r, status=ReplicaStatus.FAILED_PROVISION, status_since=now, status_reason=reason)
                    for r in rows]
        specs = {r.version: batch.specs.get(r.version) or self._store.get_version(r.service, r.version).spec
                 for r in rows}
        try:
            secrets = {number: self._read_secrets(spec) for number, spec in specs.items()}
            requests = [LaunchRequest(service=r.service, replica_id=r.replica_id, version=r.version,
                                      spec=specs[r.version], launch_token=r.launch_token, is_spot=r.is_spot,
                                      secrets=secrets[r.version])
                        for r in rows]
            outcomes = provider.launch(requests)
        except (ProviderError, StateConflictError) as exc:
            outcomes = [LaunchOutcome(r.replica_id, error=str(exc),
                                      permanent=not isinstance(exc, TransientProviderError)) for r in rows]
        by_id = {r.replica_id: r for r in rows}
        updated = []
        for outcome in outcomes:
            row = by_id[outcome.replica_id]
            if outcome.instance is not None:
                instance = outcome.instance
                status = (ReplicaStatus.PROVISIONING if instance.state is InstanceState.PENDING
                          else row.status)
                updated.append(replace_replica(row, instance_id=instance.instance_id, status=status,
                                               region=instance.region, zone=instance.zone,
                                               instance_type=instance.instance_type or row.instance_type,
                                               accelerator=instance.accelerator or row.accelerator,
                                               status_reason=None))
                if instance.detail:  # e.g. "launched in us-east-1b; no capacity in us-east-1a: ..."
                    events.append(Event(row.service, row.replica_id, "provider", instance.detail))
            elif outcome.permanent:
                updated.append(replace_replica(row, status=ReplicaStatus.FAILED_PROVISION,
                                               status_since=now, status_reason=outcome.error))
                events.append(Event(row.service, row.replica_id, "replica",
                                    f"FAILED_PROVISION: {outcome.error}", warning=True))
            else:
                updated.append(replace_replica(row, status_reason=f"launch will be retried: {outcome.error}"))
                events.append(Event(row.service, row.replica_id, "provider", f"launch failed: {outcome.error}",
                                    warning=True))
        return updated

    def _lb_port(self, name: str, port: int, events: list[Event]) -> int | None:
        """The service's port, or a new one when another process took it since `serve up` chose it: a
        load balancer that cannot bind would otherwise be restarted on every pass, and the service would
        never answer. The move is recorded as an event (status shows the new endpoint)."""
        if self._lb_runner.is_port_free(port):
            self._port_conflicts.discard(name)
            return port
        service = self._store.find_service(name)
        if service is not None and service.lb_port_pinned:
            if name not in self._port_conflicts:  # said once, while the conflict lasts
                self._port_conflicts.add(name)
                events.append(Event(name, None, "load_balancer", f"port {port} is taken by another process; the "
                                    "endpoint is pinned (--endpoint-port), so the load balancer waits for it",
                                    warning=True))
            return None
        moved = find_lb_port(self._store.used_lb_ports(), self._lb_runner.is_port_free)
        if moved is None:
            events.append(Event(name, None, "load_balancer", f"port {port} is taken and no other port is free",
                                warning=True))
            return None
        self._store.set_lb_port(name, moved)
        events.append(Event(name, None, "load_balancer",
                            f"port {port} is taken by another process; the endpoint moved to port {moved}",
                            warning=True))
        return moved

    def _apply_load_balancers(self, plan: PassPlan, events: list[Event]) -> None:
        for name, pid in plan.stop_lbs:
            self._lb_runner.stop(pid)
            service = self._store.find_service(name)
            if service is not None:
                self._store.set_load_balancer(name, None, service.lb_policy)
        policies = dict(plan.lb_policy_changes)
        for name in plan.start_lbs:
            service = self._store.find_service(name)
            if service is None:
                continue
            port = self._lb_port(service.name, service.lb_port, events)
            if port is None:
                continue
            try:
                pid = self._lb_runner.start(name, port)
            except OSError as exc:  # e.g. no such interpreter; the next pass tries again
                events.append(Event(name, None, "load_balancer", f"load balancer could not start: {exc}",
                                    warning=True))
                continue
            self._store.set_load_balancer(name, pid, policies.pop(name, service.lb_policy))
            events.append(Event(name, None, "load_balancer", f"load balancer started on port {port} (pid {pid})"))
        for name, policy in policies.items():
            service = self._store.find_service(name)
            if service is not None:
                self._store.set_load_balancer(name, service.lb_pid, policy)

