"""The GCP catalog from Compute Engine's answers. Pure: ``scripts/build_catalog.py gcp`` makes the calls.

Inputs: ``machineTypes.aggregatedList`` (per zone: vCPUs, memory, built-in accelerators of g2/a2/a3) and
``acceleratorTypes.aggregatedList`` (per zone: the GPUs that can be attached, and at most how many), with
prices by (machine or accelerator type, region) from a snapshot.

A machine type in a region is one offer with the zones that have it. An n1 machine also becomes one offer
per GPU it can take: T4, V100, P100 (and P4) attach to n1 only, in counts and up to vCPU limits the API
does not say (``N1_GPU_LIMITS``, from Compute Engine's GPU platforms page); such an offer is in the zones
that have both the machine and the GPU and costs the machine's price plus the GPUs'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from skyserve_lite.catalog.accelerators import canonical_gcp_accelerator
from skyserve_lite.catalog.model import Gpu, InstanceOffer
from skyserve_lite.catalog.prices import Price, PriceTable

# Accelerator type -> GPU count -> the most vCPUs an n1 machine with that many may have. E.g. one V100
# goes with up to 12 vCPUs, so n1-standard-8 + 1x V100 is an offer and n1-standard-16 + 1x V100 is not.
N1_GPU_LIMITS: dict[str, dict[int, int]] = {
    "nvidia-tesla-t4": {1: 48, 2: 48, 4: 96},
    "nvidia-tesla-v100": {1: 12, 2: 24, 4: 48, 8: 96},
    "nvidia-tesla-p100": {1: 16, 2: 32, 4: 64},
    "nvidia-tesla-p4": {1: 24, 2: 48, 4: 96},
}
# Shared-core machines: the API says 2 guest CPUs, which they may burst to; sustained they get a fraction
# of one, and Compute Engine's machine types page (and its price) counts e2-micro as 0.25 vCPU.
SHARED_CORE_VCPUS: dict[str, float] = {"e2-micro": 0.25, "e2-small": 0.5, "e2-medium": 1.0,
                                       "f1-micro": 0.2, "g1-small": 0.5}
ARM_FAMILIES = frozenset({"t2a", "c4a"})


@dataclass(frozen=True)
class GcpMachineType:
    """One item of ``machineTypes.aggregatedList``: a machine type in one zone."""

    name: str
    zone: str
    guest_cpus: int
    memory_mb: int
    accelerators: tuple[tuple[str, int], ...] = ()  # built in: (guestAcceleratorType, guestAcceleratorCount)
    is_shared_cpu: bool = False
    architecture: str = ""  # the API's X86_64 or ARM64; empty when it says none (then by family)


@dataclass(frozen=True)
class GcpAcceleratorType:
    """One item of ``acceleratorTypes.aggregatedList``: a GPU that can be attached in one zone."""

    name: str
    zone: str
    maximum_cards_per_instance: int


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]


def compute_gcp_offers(machine_types: Iterable[GcpMachineType], accelerator_types: Iterable[GcpAcceleratorType],
                       prices: PriceTable) -> list[InstanceOffer]:
    """The offers of every machine type in every region it is in, and of every n1 + GPU combination."""
    machines: dict[tuple[str, str], list[GcpMachineType]] = {}
    for machine in machine_types:
        machines.setdefault((machine.name, region_of(machine.zone)), []).append(machine)
    gpu_zones: dict[tuple[str, str], dict[str, int]] = {}  # (type, region) -> zone -> most cards
    for accelerator in accelerator_types:
        cards = gpu_zones.setdefault((accelerator.name, region_of(accelerator.zone)), {})
        cards[accelerator.zone] = accelerator.maximum_cards_per_instance
    offers = []
    for (name, region), found in sorted(machines.items()):
        machine = found[0]
        zones = tuple(sorted({m.zone for m in found}))
        base = _machine_offer(machine, region, zones, prices.get((name, region), Price()))
        offers.append(base)
        if name.startswith("n1-"):
            offers.extend(_attached_offers(base, machine.guest_cpus, gpu_zones, prices))
    return offers


def _machine_offer(machine: GcpMachineType, region: str, zones: tuple[str, ...], price: Price) -> InstanceOffer:
    gpu = None
    if machine.accelerators:
        name, memory = canonical_gcp_accelerator(machine.accelerators[0][0])
        gpu = Gpu(name, sum(c for _t, c in machine.accelerators), memory)
    vcpus = SHARED_CORE_VCPUS.get(machine.name, float(machine.guest_cpus)) if machine.is_shared_cpu \
        else float(machine.guest_cpus)
    if machine.architecture:
        arch = "arm64" if machine.architecture.upper() == "ARM64" else "x86_64"
    else:
        arch = "arm64" if machine.name.split("-")[0] in ARM_FAMILIES else "x86_64"
    return InstanceOffer("gcp", machine.name, region, zones, vcpus, round(machine.memory_mb / 1024, 3), gpu, arch,
                         price.ondemand, price.spot)


def _attached_offers(base: InstanceOffer, guest_cpus: int, gpu_zones: Mapping[tuple[str, str], Mapping[str, int]],
                     prices: PriceTable) -> list[InstanceOffer]:
    """``base`` (an n1 machine) with each GPU count it may take, where its zones have that many."""
    offers = []
    for accelerator_type, limits in sorted(N1_GPU_LIMITS.items()):
        cards = gpu_zones.get((accelerator_type, base.region), {})
        name, memory = canonical_gcp_accelerator(accelerator_type)
        gpu_price = prices.get((accelerator_type, base.region), Price())
        for count, most_vcpus in sorted(limits.items()):
            zones = tuple(z for z in base.zones if cards.get(z, 0) >= count)
            if not zones or guest_cpus > most_vcpus:
                continue
            offers.append(InstanceOffer(
                "gcp", base.instance_type, base.region, zones, base.vcpus, base.memory_gib, Gpu(name, count, memory),
                base.arch, _plus(base.ondemand_price, gpu_price.ondemand, count),
                _plus(base.spot_price, gpu_price.spot, count), accelerator_type))
    return offers


def _plus(machine: float | None, per_gpu: float | None, count: int) -> float | None:
    """The machine's price plus ``count`` GPUs', rounded to 1e-6 USD; unknown if either is."""
    if machine is None or per_gpu is None:
        return None
    return round(machine + per_gpu * count, 6)
