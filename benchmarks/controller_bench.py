"""Controller cost: CPU time of one reconcile pass over 1,000 replicas in 10 services, and peak RSS.

Uses the in-package fake provider, fake prober and fake load balancer runner, so what is measured is the
controller itself: reading the store, planning, and writing what changed.

    python benchmarks/controller_bench.py [--services 10] [--replicas-per-service 100] [--passes 20]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.store import Store

TASK = "service:\n  readiness_probe: /health\n  replicas: {replicas}\nrun: python -m http.server $PORT\n"


def cpu_ms(func: object) -> float:
    start = time.process_time()
    func()  # type: ignore[operator]
    return (time.process_time() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10)
    parser.add_argument("--replicas-per-service", type=int, default=100)
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as home:
        store = Store.open(Path(home))
        clock = FakeClock()
        provider = FakeProvider(name="local")
        reconciler = Reconciler(store, {"local": provider}, FakeProber(), FakeLoadBalancerRunner(), clock,
                                ControllerSettings())
        text = TASK.format(replicas=args.replicas_per_service)
        for index in range(args.services):
            task = SubmittedTask(text=text, source="/bench.yaml", spec=parse_task(text))
            store.create_service(f"svc-{index}", task, 30001 + index, clock.now())

        launch = cpu_ms(reconciler.reconcile_once)
        clock.advance(1)
        ready = cpu_ms(reconciler.reconcile_once)
        steady = []
        for _ in range(args.passes):
            clock.advance(1)
            steady.append(cpu_ms(reconciler.reconcile_once))
        replicas = len(store.list_replicas())
        store.close()

    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"replicas: {replicas} in {args.services} services")
    print(f"launch pass (all {replicas} launched): {launch:.1f} ms CPU")
    print(f"readiness pass (all become READY):    {ready:.1f} ms CPU")
    print(f"steady pass, median of {args.passes}:          {statistics.median(steady):.1f} ms CPU "
          f"(max {max(steady):.1f})")
    print(f"peak RSS of the process:              {rss_mb:.1f} MB")


if __name__ == "__main__":
    main()
