"""Time planning an update over 10,000 replicas spread over 5 versions (target: under 2 s, an interactive dry run).

Versions 1-5 differ in an env value; the new task equals version 5's replica config with a larger
min_replicas, so 2,000 replicas are reused and 8,000 replaced. The plan is the forecast
(``controller.forecast``): the controller's pass planner run forward until the rollout settles, so this
times every pass of the rollout over the whole fleet (launch, ready and drain, terminate, remove).

    python benchmarks/update_plan_bench.py [--replicas 10000] [--versions 5] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from skyserve_lite.controller.forecast import forecast_update
from skyserve_lite.controller.pass_types import ServiceSnapshot
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceRecord, ServiceStatus

TASK = """\
resources: {{cloud: aws, region: us-east-1, image_id: ami-123, instance_type: m5.large}}
envs: {{MODEL: model-{version}, BATCH: "8"}}
setup: pip install -r requirements.txt
run: python serve.py --port $PORT
service:
  readiness_probe: /health
  replicas: {replicas}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=10_000)
    parser.add_argument("--versions", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    per_version = args.replicas // args.versions
    specs = {v: parse_task(TASK.format(version=v, replicas=per_version)) for v in range(1, args.versions + 1)}
    new = parse_task(TASK.format(version=args.versions, replicas=args.replicas + 100))
    replicas = [
        ReplicaRecord(service="svc", replica_id=i + 1, version=1 + i // per_version, status=ReplicaStatus.READY,
                      cloud="aws", launched_at=float(i), status_since=float(i), launch_token="t",
                      instance_id=f"i-{i + 1}", url=f"http://replica-{i + 1}.invalid")
        for i in range(per_version * args.versions)
    ]
    service = ServiceRecord(name="svc", current_version=args.versions, status=ServiceStatus.READY,
                            status_reason=None, lb_port=30001, lb_pid=1, lb_policy="least_load", deleting=False,
                            created_at=0.0, next_replica_id=len(replicas) + 1)
    snapshot = ServiceSnapshot(service, specs, tuple(replicas), lb_alive=True)
    timings = []
    plan = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        plan = forecast_update(snapshot, args.versions + 1, new, UpdateMode.ROLLING, 1_767_225_600.0,
                               ControllerSettings())
        timings.append((time.perf_counter() - start) * 1000)
    assert plan is not None and plan.converged
    print(f"replicas: {len(replicas)} in {args.versions} versions -> {plan.summary()} in {len(plan.steps)} steps")
    print(f"forecast_update: median {statistics.median(timings):.1f} ms, min {min(timings):.1f} ms "
          f"over {args.repeat} runs (target < 2,000 ms)")


if __name__ == "__main__":
    main()
