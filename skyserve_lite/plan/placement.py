"""Where and on what a replica runs: each resource candidate of a task resolved against the cloud's catalog.

``resolve_placements`` is the one decision, made once when a version is submitted (and by every dry run,
with the same inputs): per market (on-demand, and spot when the task asks for it), the placements to try
in order, each a concrete cloud, region, zone, instance type, price, image and disk. The version stores
them (``spec.inputs.BoundInputs``) and providers launch exactly them, so what a plan shows is what is
launched, and a newer catalog never changes a running version.

Order: ``ordered`` candidates as written; ``any_of`` (and several accelerators) cheapest first, ties as
written. A candidate the cloud cannot satisfy is left out when another can (``Resolution.skipped`` says
why); when none can, the error names the first one's field and every candidate considered.

Pure: the catalog and the default regions come in as arguments.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.model import Cloud, Resources, TaskSpec
from skyserve_lite.spec.placement import SSM_PREFIX, Placement, Resolution

# Images a replica boots when the task names none: an Ubuntu LTS, or for accelerator types one with the
# GPU driver. AWS names them by public SSM parameter and GCP by image family; both are resolved to the
# newest image when the instance is launched (docs/yaml.md#image_id).
_UBUNTU_SSM = SSM_PREFIX + "/aws/service/canonical/ubuntu/server/24.04/stable/current/{arch}/hvm/ebs-gp3/ami-id"
_GPU_SSM = SSM_PREFIX + "/aws/service/deeplearning/ami/{arch}/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
_GCE_FAMILY = "projects/{project}/global/images/family/{family}"
DEFAULT_IMAGES: Mapping[tuple[str, str, bool], str] = {
    ("aws", "x86_64", False): _UBUNTU_SSM.format(arch="amd64"),
    ("aws", "arm64", False): _UBUNTU_SSM.format(arch="arm64"),
    ("aws", "x86_64", True): _GPU_SSM.format(arch="x86_64"),
    ("aws", "arm64", True): _GPU_SSM.format(arch="arm64"),
    ("gcp", "x86_64", False): _GCE_FAMILY.format(project="ubuntu-os-cloud", family="ubuntu-2404-lts-amd64"),
    ("gcp", "arm64", False): _GCE_FAMILY.format(project="ubuntu-os-cloud", family="ubuntu-2404-lts-arm64"),
    ("gcp", "x86_64", True): _GCE_FAMILY.format(project="ubuntu-os-accelerator-images",
                                                family="ubuntu-accelerator-2204-amd64-with-nvidia-550"),
    ("gcp", "arm64", True): _GCE_FAMILY.format(project="ubuntu-os-accelerator-images",
                                               family="ubuntu-accelerator-2204-arm64-with-nvidia-550"),
}


def resolve_placements(spec: TaskSpec, source: str, default_regions: Mapping[str, str | None],
                       load_catalog: Callable[[str], Any]) -> Resolution:
    """Every placement of ``spec`` (see the module docstring). ``default_regions`` maps a cloud to the
    region a candidate without one uses (None: the cheapest region of the catalog); ``load_catalog`` is
    ``catalog.load_catalog``. Raises ``SpecError`` naming the field when no candidate can run."""
    cloud = spec.cloud
    candidates = spec.resource_candidates
    if cloud is Cloud.LOCAL:
        for resources in candidates:
            if resources.accelerator is not None:
                considered = ", ".join(c.describe_need() for c in candidates)
                raise SpecError(source, "resources.accelerators",
                                f"{resources.accelerator.describe()}: the local cloud runs replicas as processes on "
                                f"this machine, without accelerators (candidates considered: {considered}); name a "
                                "cloud with --infra or resources.infra")
        return Resolution(ondemand=(Placement(cloud=cloud.value),))
    from skyserve_lite.catalog import CatalogError, Need, describe_sizing, disk_for

    catalog = load_catalog(cloud.value)
    markets = [False, True] if spec.resources.use_spot else [False]
    by_market: dict[bool, list[Placement]] = {}
    skipped: list[str] = []
    first_error: CatalogError | None = None
    for is_spot in markets:
        placements = []
        for index, resources in enumerate(candidates):
            need = Need(
                cpus=resources.cpus.value if resources.cpus else None,
                cpus_at_least=bool(resources.cpus and resources.cpus.at_least),
                memory_gib=resources.memory.value if resources.memory else None,
                memory_at_least=bool(resources.memory and resources.memory.at_least),
                accelerator=resources.accelerator.name if resources.accelerator else None,
                accelerator_count=resources.accelerator.count if resources.accelerator else None,
                instance_type=resources.instance_type, use_spot=is_spot, region=resources.region,
                zone=resources.zone)
            region = resources.region or default_regions.get(cloud.value)
            try:
                offer = catalog.choose(need, default_regions.get(cloud.value))
            except CatalogError as exc:
                found = find_uncatalogued(catalog, resources, region)
                if found is None:
                    first_error = first_error or exc
                    if not is_spot:
                        skipped.append(f"{resources.describe_need()}: {exc.problem}")
                    continue
                offer = found
            try:
                disk = disk_for(cloud.value, resources.disk_tier.value, offer) if resources.disk_tier else None
            except CatalogError as exc:
                raise SpecError(source, exc.field, exc.problem) from None
            placements.append(Placement(
                cloud=cloud.value, candidate=index, region=offer.region, zone=resources.zone,
                zones=() if resources.zone else tuple(offer.zones),
                instance_type=offer.instance_type,
                accelerator=f"{offer.gpu.name}:{offer.gpu.count}" if offer.gpu is not None else None,
                accelerator_type=offer.accelerator_type, is_spot=is_spot,
                # a spot price the catalog lacks is unknown, not the on-demand one
                price_per_hour=offer.spot_price if is_spot else offer.ondemand_price,
                image=resources.image_id or DEFAULT_IMAGES.get((cloud.value, offer.arch, offer.gpu is not None)),
                image_is_default=resources.image_id is None, disk_size=resources.disk_size,
                disk_type=disk.volume_type if disk else None, disk_iops=disk.iops if disk else None,
                disk_throughput=disk.throughput_mbps if disk else None, need=resources.describe_need(),
                sizing=describe_sizing(cloud.value, need)))
        if not placements:
            assert first_error is not None
            if len(candidates) == 1:
                raise SpecError(source, first_error.field, first_error.problem)
            raise SpecError(source, first_error.field, f"no candidate fits on {cloud.value} (candidates "
                                                       f"considered: {'; '.join(skipped)})")
        if spec.candidate_order.value == "any_of":
            placements.sort(key=lambda p: math.inf if p.price_per_hour is None else p.price_per_hour)
        by_market[is_spot] = placements
    return Resolution(ondemand=tuple(by_market[False]), spot=tuple(by_market.get(True, ())),
                      skipped=tuple(skipped))


# Clouds whose catalog lists every region (AWS's is built from every region's offerings); for the others a
# region the catalog lacks may be real, and must look like one (us-central1, europe-west12).
COMPLETE_REGION_LISTS = frozenset({"aws"})
_GCP_REGION_RE = re.compile(r"[a-z]+-[a-z]+[0-9]{1,2}")


def find_uncatalogued(catalog: Any, resources: Resources, region: str | None) -> Any:
    """An offer for a region the catalog holds nothing of, when the candidate names its instance type (or
    asks for nothing): the type as written, unpriced, with its shape from another region where the catalog
    has it (so its image defaults by architecture and GPUs). None when the catalog knows the region or the
    candidate asks by need, which only the catalog can answer."""
    from skyserve_lite.catalog import InstanceOffer

    if region is None or region in catalog.regions() or resources.cpus or resources.memory or resources.accelerator:
        return None
    if catalog.cloud in COMPLETE_REGION_LISTS or not _GCP_REGION_RE.fullmatch(region):
        return None  # the catalog lists every region of this cloud: another is a typo (us-east-7)
    instance_type = resources.instance_type or catalog.default_instance_type
    if instance_type is None:
        return None
    known = next((offer for other in catalog.regions() if (offer := catalog.find(instance_type, other))), None)
    return InstanceOffer(
        cloud=catalog.cloud, instance_type=instance_type, region=region, zones=(),
        vcpus=known.vcpus if known else 0.0, memory_gib=known.memory_gib if known else 0.0,
        gpu=known.gpu if known else None, arch=known.arch if known else "x86_64", ondemand_price=None,
        spot_price=None, accelerator_type=known.accelerator_type if known else None)


@dataclass(frozen=True)
class ReplicaLaunch:
    """One replica a new service starts with: its market and the placements it tries, in order."""

    replica: int  # 1, 2, ... in launch order (the ids the controller gives them)
    is_spot: bool
    placements: tuple[Placement, ...]

    @property
    def market(self) -> str:
        return "spot" if self.is_spot else "on-demand"


@dataclass(frozen=True)
class LaunchPlan:
    """What `serve up` would start: `serve up --dry-run` prints it, nothing is stored or contacted."""

    service: str
    cloud: str
    replicas: tuple[ReplicaLaunch, ...]
    skipped: tuple[str, ...] = ()
    envs: tuple[str, ...] = ()  # names only
    secrets: tuple[str, ...] = ()  # names only: values are never in a plan
    files: str | None = None  # "sha256 9f2c1a0b4e7d (12.0 KiB)": the snapshot the version would hold
    notes: tuple[str, ...] = ()  # what the plan could not check here (a cloud library not installed)

    @property
    def hourly_price(self) -> float | None:
        """What the replicas cost per hour on their first placements; None when a price is unknown."""
        prices = [r.placements[0].price_per_hour for r in self.replicas if r.placements]
        return None if any(p is None for p in prices) or self.cloud == Cloud.LOCAL.value else sum(
            p for p in prices if p is not None)

    def to_json(self) -> dict[str, Any]:
        return {"service": self.service, "cloud": self.cloud, "hourly_price": self.hourly_price,
                "replicas": [{"replica": r.replica, "market": r.market,
                              "placements": [p.to_json() for p in r.placements]} for r in self.replicas],
                "left_out": list(self.skipped), "envs": list(self.envs), "secrets": list(self.secrets),
                "files": self.files, "notes": list(self.notes)}


def plan_launch(name: str, spec: TaskSpec, files: str | None = None) -> LaunchPlan:
    """The replicas a new service of ``spec`` (resolved: ``spec.resolution``) starts with: the policy's
    initial target, split between spot and on-demand as the controller splits it. Pure."""
    from skyserve_lite.autoscalers.fallback import plan_market_targets
    from skyserve_lite.autoscalers.target import compute_target_replicas

    assert spec.resolution is not None, "plan_launch needs a resolved spec"
    policy = spec.service.replica_policy
    target = compute_target_replicas(policy)
    markets = plan_market_targets(spec.resources.use_spot, policy, target, ready_spot=0)
    # The controller launches on-demand fallback replicas first (they are what serves until spot is READY).
    order = [False] * markets.on_demand + [True] * markets.spot
    replicas = tuple(ReplicaLaunch(i, is_spot, spec.resolution.for_market(is_spot))
                     for i, is_spot in enumerate(order, start=1))
    return LaunchPlan(service=name, cloud=spec.cloud.value, replicas=replicas, skipped=spec.resolution.skipped,
                      envs=tuple(n for n, _ in spec.envs), secrets=tuple(n for n, _ in spec.secrets), files=files)
