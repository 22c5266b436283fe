"""AWS API economy: how many EC2 calls the AWS provider makes for the controller's common operations.

Runs against moto in-process (nothing leaves this machine; fake credentials are set here) and counts every
EC2 call with botocore's ``provide-client-params`` event:

- a steady inventory (``list_instances``) over 1,000 instances in 2 regions;
- scaling a service up by k replicas in one zone, with a provider that has not yet seen the region
  (security group and default VPC looked up) and with one that has;
- terminating k replicas.

    python benchmarks/aws_api_bench.py [--instances 1000] [--scale 10 50]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REGIONS = ("us-east-1", "eu-west-1")


class CallCounter:
    """Counts API calls by (service, operation, region) of every client made from a session."""

    def __init__(self, session: Any) -> None:
        self.calls: Counter[tuple[str, str, str]] = Counter()
        session.events.register("provide-client-params", self._record)

    def _record(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        self.calls[(model.service_model.service_name, model.name, context["client_region"])] += 1

    def take(self) -> Counter[tuple[str, str, str]]:
        taken = Counter(self.calls)
        self.calls.clear()
        return taken


def summarize(calls: Counter[tuple[str, str, str]]) -> str:
    by_operation: Counter[str] = Counter()
    for (_, operation, _), count in calls.items():
        by_operation[operation] += count
    return ", ".join(f"{operation} x{count}" for operation, count in sorted(by_operation.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=1000, help="instances in all, split over 2 regions")
    parser.add_argument("--scale", type=int, nargs="+", default=[10, 50], help="replicas added in one step")
    args = parser.parse_args()

    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGIONS[0]})
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):
        os.environ.pop(name, None)

    import boto3
    from moto import mock_aws

    from skyserve_lite.clock import SystemClock
    from skyserve_lite.files.blobs import BlobStore
    from skyserve_lite.providers.aws import AwsProvider
    from skyserve_lite.providers.base import LaunchRequest
    from skyserve_lite.spec.model import Resources, ServiceSpec, TaskSpec

    rows: list[tuple[str, str, int, str, float]] = []

    def record(scenario: str, expected: str, calls: Counter[tuple[str, str, str]], seconds: float) -> None:
        ec2 = Counter({k: v for k, v in calls.items() if k[0] == "ec2"})
        rows.append((scenario, expected, sum(ec2.values()), summarize(ec2), seconds))

    with mock_aws(), tempfile.TemporaryDirectory() as scratch:
        blobs = BlobStore(Path(scratch) / "blobs")  # the tasks ship no files: never read
        session = boto3.Session(region_name=REGIONS[0])
        counter = CallCounter(session)
        images = {region: boto3.client("ec2", region_name=region).describe_images(Owners=["amazon"])["Images"][0]
                  ["ImageId"] for region in REGIONS}

        def task(region: str) -> TaskSpec:
            return TaskSpec(run="python3 -m http.server $PORT", service=ServiceSpec(port=8080),
                            resources=Resources(region=region, zone=f"{region}a", image_id=images[region]))

        def requests(service: str, region: str, first: int, count: int, token: str) -> list[LaunchRequest]:
            spec = task(region)
            return [LaunchRequest(service=service, replica_id=first + i, version=1, spec=spec, launch_token=token,
                                  is_spot=False) for i in range(count)]

        provider = AwsProvider("bench", SystemClock(), session=session, blobs=blobs)
        per_region = args.instances // len(REGIONS)
        step = 50  # replicas per launch call while filling the fleet, as an autoscaler adding 50 at once would
        for region in REGIONS:
            for first in range(0, per_region, step):
                provider.launch(requests(f"fleet-{region}", region, first, min(step, per_region - first),
                                         f"fill-{region}-{first}"))
        counter.take()

        for attempt in range(3):
            started = time.perf_counter()
            found = provider.list_instances(REGIONS[1:])
            seconds = time.perf_counter() - started
            assert len(found) == per_region * len(REGIONS), len(found)
            record(f"list_instances, {len(found):,} instances, {len(REGIONS)} regions (pass {attempt + 1})",
                   "DescribeInstances pages only", counter.take(), seconds)

        for k in args.scale:
            cold = AwsProvider(f"bench-new-{k}", SystemClock(), session=session, blobs=blobs)  # its own group
            started = time.perf_counter()
            outcomes = cold.launch(requests(f"cold-{k}", REGIONS[0], 0, k, f"cold-{k}"))
            assert all(o.instance is not None for o in outcomes)
            record(f"scale up by {k} in one zone, a new controller's first launch in the region", "1 RunInstances",
                   counter.take(), time.perf_counter() - started)

            started = time.perf_counter()
            outcomes = provider.launch(requests(f"warm-{k}", REGIONS[0], 0, k, f"warm-{k}"))
            assert all(o.instance is not None for o in outcomes)
            record(f"scale up by {k} in one zone, later launches", "1 RunInstances", counter.take(),
                   time.perf_counter() - started)

            started = time.perf_counter()
            provider.terminate([o.instance.instance_id for o in outcomes if o.instance])
            record(f"terminate {k} in one region", "1 TerminateInstances", counter.take(),
                   time.perf_counter() - started)

    print("| operation | spec | EC2 calls | calls by API | seconds (moto) |")
    print("| --- | --- | ---: | --- | ---: |")
    for scenario, expected, total, detail, seconds in rows:
        print(f"| {scenario} | {expected} | {total} | {detail} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
