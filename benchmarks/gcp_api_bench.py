"""GCP API economy: how many Compute Engine calls the GCP provider makes for the controller's common
operations, counted by method through the fake Compute Engine on 127.0.0.1 (``tests/providers/gce_fake``;
nothing leaves this machine):

- a steady inventory (``list_instances``) over 1,000 instances in 2 regions;
- scaling a service up by k replicas in one zone, with a provider that has not yet made its firewall rule
  and with one that has;
- terminating k replicas.

    python benchmarks/gcp_api_bench.py [--instances 1000] [--scale 10 50]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

REGIONS = ("us-central1", "europe-west1")
ZONES = {"us-central1": "us-central1-a", "europe-west1": "europe-west1-b"}


def summarize(calls: Counter[str]) -> str:
    return ", ".join(f"{method} x{count}" for method, count in sorted(calls.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=1000, help="instances in all, split over 2 regions")
    parser.add_argument("--scale", type=int, nargs="+", default=[10, 50], help="replicas added in one step")
    args = parser.parse_args()

    from google.auth.credentials import AnonymousCredentials

    from skyserve_lite.clock import SystemClock
    from skyserve_lite.files.blobs import BlobStore
    from skyserve_lite.providers.base import LaunchRequest
    from skyserve_lite.providers.gcp import GcpProvider
    from skyserve_lite.spec.model import Resources, ServiceSpec, TaskSpec
    from tests.providers.gce_fake import serve_fake_compute

    rows: list[tuple[str, str, int, str, float]] = []

    with serve_fake_compute() as (fake, endpoint):
        def provider() -> GcpProvider:
            return GcpProvider("bench0000000", SystemClock(), blobs=BlobStore(Path("/nonexistent")), project="p",
                               credentials=AnonymousCredentials(),
                               api_endpoint=endpoint)

        def take() -> Counter[str]:
            taken = Counter(fake.calls)
            fake.calls.clear()
            return taken

        def record(scenario: str, expected: str, calls: Counter[str], seconds: float) -> None:
            rows.append((scenario, expected, sum(calls.values()), summarize(calls), seconds))

        def requests(service: str, region: str, first: int, count: int, token: str) -> list[LaunchRequest]:
            spec = TaskSpec(run="python3 -m http.server 8080", service=ServiceSpec(port=8080),
                            resources=Resources(region=region, zone=ZONES[region]))
            return [LaunchRequest(service=service, replica_id=first + i, version=1, spec=spec, launch_token=token,
                                  is_spot=False) for i in range(count)]

        gcp = provider()
        per_region = args.instances // len(REGIONS)
        step = 50
        for region in REGIONS:
            for first in range(0, per_region, step):
                gcp.launch(requests(f"fleet-{region}", region, first, min(step, per_region - first),
                                    f"fill{region.replace('-', '')}{first:06d}"))
        take()

        for attempt in range(3):
            started = time.perf_counter()
            found = gcp.list_instances()
            seconds = time.perf_counter() - started
            assert len(found) == per_region * len(REGIONS), len(found)
            record(f"list_instances, {len(found):,} instances, {len(REGIONS)} regions (pass {attempt + 1})",
                   "aggregatedList pages only", take(), seconds)

        for k in args.scale:
            for fresh in (True, False):
                scaler = provider() if fresh else gcp
                started = time.perf_counter()
                outcomes = scaler.launch(requests("scaled", REGIONS[0], 10_000 * k + (0 if fresh else 5000), k,
                                                  f"scale{k}{'fresh' if fresh else 'warm'}"))
                seconds = time.perf_counter() - started
                assert all(o.instance for o in outcomes)
                label = "a new provider" if fresh else "a provider that made its firewall rule"
                record(f"launch {k} in one zone, {label}", "one bulkInsert", take(), seconds)
            ids = [o.instance.instance_id for o in outcomes if o.instance]
            started = time.perf_counter()
            gcp.terminate(ids)
            record(f"terminate {k}", f"{k} deletes", take(), time.perf_counter() - started)

    print(f"{'scenario':<70} {'calls':>5}  {'seconds':>7}  by method")
    for scenario, _expected, total, detail, seconds in rows:
        print(f"{scenario:<70} {total:>5}  {seconds:>7.3f}  {detail}")


if __name__ == "__main__":
    main()
