"""What an update will do: the controller's own pass planner, run forward over the current state. Pure.

`serve update --dry-run`, and the plan `serve update` asks about, is this module's value. It takes the
service as a pass reads it (``controller.snapshots``), makes the new version current, and runs
``plan_service_pass`` pass after pass over a model of the world until a pass has nothing left to do. The
model is the one a user hopes for: every instance runs and every probe answers 200, so a replica launched
in one pass is READY in the next, and a drained replica is terminated on the pass after it left traffic.
What the passes launched, drained and terminated is the plan: its counts and per-replica actions are the
controller's own decisions, not a second planner's guess at them.

Time stands still in the model. The autoscaler therefore decides once for the new version, from the same
metrics and at the same moment the next real pass would, and its target then holds. With spot and
dynamic on-demand fallback the controller launches an on-demand stand-in for every spot replica that is not
READY yet and terminates the stand-ins once the spot replicas are: target 4, base 1, no replica yet ->
4 on demand + 3 spot = 7 launched, 3 of them terminated again, and the plan says exactly that.
"""

from __future__ import annotations

import dataclasses

from skyserve_lite.autoscalers.target import carry_over, compute_target_replicas
from skyserve_lite.controller.pass_types import Observation, PassPlan, ServiceSnapshot
from skyserve_lite.controller.plan import InstanceIndex, find_probe_targets, plan_service_pass
from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.plan.canary import CanaryPreview, CanarySettings, find_canary_settings, plan_canary_preview
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.plan.update import LaunchDecision, PlanStep, ReplicaAction, ReplicaDecision, UpdatePlan
from skyserve_lite.providers.base import Instance, InstanceState
from skyserve_lite.spec.config import FieldChange, find_config_changes
from skyserve_lite.spec.model import TaskSpec
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceRecord

# A rollout settles in a handful of passes in the model (rolling: launch all, all READY and the old ones
# drained, terminated, rows removed, then nothing to do: 5); the limit only stops a planner bug from
# looping forever.
MAX_PASSES = 100
_PROBE_OK = ProbeResult(ok=True, detail="HTTP 200")


def forecast_update(snapshot: ServiceSnapshot, to_version: int, new_spec: TaskSpec, mode: UpdateMode,
                    now: float, settings: ControllerSettings, *, reuse_identical_files: bool = False,
                    canary: CanarySettings | None = None) -> UpdatePlan:
    """The plan of making ``new_spec`` version ``to_version`` of ``snapshot``'s service, rolled out with
    ``mode`` (reusing replicas whose files are identical with ``reuse_identical_files``; a canary with
    ``canary``, else the task's `service.canary`, else the defaults). See the module docstring for the
    model."""
    # A canary's passes wait on its bake windows and the load balancers' counts, which the model has not:
    # its replicas end as a rolling update's do once promoted, and its steps are the plan's ``canary``.
    run_mode = UpdateMode.ROLLING if mode is UpdateMode.CANARY else mode
    world = _World(snapshot, to_version, new_spec, run_mode, reuse_identical_files)
    settings = dataclasses.replace(settings, drain_seconds=0.0)
    steps: list[PlanStep] = []
    converged = False
    for _ in range(MAX_PASSES):
        observation = world.observe()
        part = plan_service_pass(world.snapshot, InstanceIndex(observation), observation.probes, now, settings)
        if not (part.launches or part.terminations or part.removals or part.replica_updates):
            converged = True
            break
        step = world.apply(part)
        if step.launch or step.drain:
            steps.append(step)
    policy = new_spec.service.replica_policy
    target = compute_target_replicas(policy, carry_over(world.snapshot.autoscaler, policy, to_version))
    replicas = _decide_replicas(snapshot, new_spec, world.gone, target, reuse_identical_files)
    launches = tuple(LaunchDecision(rid, is_spot, kept=rid not in world.gone)
                     for rid, is_spot in world.launched.items())
    preview = CanaryPreview()
    if mode is UpdateMode.CANARY:
        # The controller's own step planner, as its first pass would call it: a canary is judged only when a
        # live replica runs another config (``controller.canary_steps``: reused ones count as the new version).
        reused = sum(1 for d in replicas if d.action is ReplicaAction.REUSE)
        preview = plan_canary_preview(to_version, target, find_canary_settings(new_spec.service.canary, canary),
                                      config_changed=any(d.action is ReplicaAction.REPLACE for d in replicas),
                                      reused=reused, launch_ids=tuple(d.replica_id for d in launches if d.kept))
    return UpdatePlan(
        service=snapshot.service.name, from_version=snapshot.service.current_version, to_version=to_version,
        mode=mode, target_replicas=target,
        replicas=replicas, launches=launches, steps=tuple(steps), converged=converged, canary=preview.steps,
        notes=() if preview.done is None else (preview.done,),
    )


def _decide_replicas(snapshot: ServiceSnapshot, new_spec: TaskSpec, gone: set[int], target: int,
                     reuse_identical_files: bool) -> tuple[ReplicaDecision, ...]:
    """Name each replica live at the start by what the passes did with it."""
    live = sorted((r for r in snapshot.replicas if r.status.is_live), key=lambda r: r.replica_id)
    # The comparison depends only on the replica's version: compare each version once, not each replica
    # (10,000 replicas in 5 versions: 5 comparisons).
    changes = {v: find_config_changes(snapshot.versions[v], new_spec, reuse_identical_files=reuse_identical_files)
               for v in {r.version for r in live}}
    reusable = sum(1 for r in live if not changes[r.version])
    decisions = []
    for replica in live:
        differs = changes[replica.version]
        if differs:
            decisions.append(ReplicaDecision(replica.replica_id, replica.version, ReplicaAction.REPLACE, differs))
        elif replica.replica_id in gone:
            surplus = FieldChange("target_replicas", reusable, target, note=_surplus_note(replica, new_spec))
            decisions.append(ReplicaDecision(replica.replica_id, replica.version, ReplicaAction.TERMINATE,
                                             (surplus,)))
        else:
            decisions.append(ReplicaDecision(replica.replica_id, replica.version, ReplicaAction.REUSE))
    return tuple(decisions)


def _surplus_note(replica: ReplicaRecord, spec: TaskSpec) -> str:
    if spec.resources.use_spot and not replica.is_spot:
        return "more on-demand replicas than the fallback keeps once spot replicas are READY"
    return "more reusable replicas than the target"


class _World:
    """The model the passes run against: the snapshot as the executor would leave it after each pass,
    and one running instance per live or draining replica."""

    def __init__(self, snapshot: ServiceSnapshot, to_version: int, new_spec: TaskSpec, mode: UpdateMode,
                 reuse_identical_files: bool) -> None:
        service = dataclasses.replace(snapshot.service, current_version=to_version)
        self.snapshot = dataclasses.replace(snapshot, service=service, versions={**snapshot.versions,
                                            to_version: new_spec}, mode=mode, lb_alive=True,
                                            reuse_identical_files=reuse_identical_files)
        self.clouds = frozenset({new_spec.cloud.value, *(r.cloud for r in snapshot.replicas)})
        self.instances: dict[int, tuple[str, Instance]] = {}  # replica id -> (cloud, instance)
        for replica in snapshot.replicas:
            if replica.status.is_live or replica.status is ReplicaStatus.SHUTTING_DOWN:
                self._add_instance(replica)
        self.launched: dict[int, bool] = {}  # replica id -> is_spot, in launch order
        self.gone: set[int] = set()  # replica ids drained or terminated

    def _add_instance(self, replica: ReplicaRecord) -> str:
        instance_id = replica.instance_id or f"forecast-{replica.replica_id}"
        self.instances[replica.replica_id] = (replica.cloud, Instance(
            instance_id=instance_id, service=replica.service, replica_id=replica.replica_id,
            version=replica.version, state=InstanceState.RUNNING,
            url=replica.url or f"http://forecast.invalid/{replica.replica_id}", region=replica.region,
            zone=replica.zone, is_spot=replica.is_spot))
        return instance_id

    def observe(self) -> Observation:
        by_cloud: dict[str, list[Instance]] = {cloud: [] for cloud in self.clouds}
        for cloud, instance in self.instances.values():
            by_cloud[cloud].append(instance)
        partial = Observation(instances=by_cloud, known_clouds=self.clouds)
        targets = find_probe_targets([self.snapshot], InstanceIndex(partial))
        probes = {(t.service, t.replica_id): _PROBE_OK for t in targets}
        return dataclasses.replace(partial, probes=probes)

    def apply(self, part: PassPlan) -> PlanStep:
        """Apply one pass's plan as the executor would, with every launch succeeding."""
        snapshot = self.snapshot
        rows = {r.replica_id: r for r in snapshot.replicas}
        drained = []
        for record in part.replica_updates:
            before = rows.get(record.replica_id)
            if record.status is ReplicaStatus.SHUTTING_DOWN and before is not None and before.status.is_live:
                drained.append(record.replica_id)
            rows[record.replica_id] = record
        by_instance = {instance.instance_id: rid for rid, (_, instance) in self.instances.items()}
        for termination in part.terminations:
            rid = by_instance.get(termination.instance_id)
            if rid is not None:
                del self.instances[rid]
                self.gone.add(rid)
        for _service, rid in part.removals:
            rows.pop(rid, None)
        service = snapshot.service
        next_id = service.next_replica_id
        launched = []
        for batch in part.launches:
            for row in batch.retry:
                rows[row.replica_id] = dataclasses.replace(row, instance_id=self._add_instance(row))
            for _ in range(batch.count):
                row = ReplicaRecord(service=batch.service, replica_id=next_id, version=batch.version,
                                    status=ReplicaStatus.PROVISIONING, cloud=batch.cloud, launched_at=0.0,
                                    status_since=0.0, launch_token="forecast", is_spot=batch.is_spot)
                rows[next_id] = dataclasses.replace(row, instance_id=self._add_instance(row))
                self.launched[next_id] = batch.is_spot
                launched.append(next_id)
                next_id += 1
        self.gone.update(drained)
        service = _apply_service_changes(dataclasses.replace(service, next_replica_id=next_id), part)
        autoscaler, observed = snapshot.autoscaler, snapshot.observed
        for _name, state, observation in part.autoscaler_updates:
            autoscaler, observed = state, observation
        self.snapshot = dataclasses.replace(snapshot, service=service, autoscaler=autoscaler, observed=observed,
                                            replicas=tuple(rows[rid] for rid in sorted(rows)))
        active = service.active_versions or (service.current_version,)
        return PlanStep(launch=tuple(launched), drain=tuple(sorted(drained)), active_versions=active)


def _apply_service_changes(service: ServiceRecord, part: PassPlan) -> ServiceRecord:
    """The service row as the executor leaves it: versions in traffic, status, load balancer policy."""
    for _name, versions in part.active_version_changes:
        service = dataclasses.replace(service, active_versions=versions)
    for _name, status, reason in part.status_changes:
        service = dataclasses.replace(service, status=status, status_reason=reason)
    for _name, policy in part.lb_policy_changes:
        service = dataclasses.replace(service, lb_policy=policy)
    return service
