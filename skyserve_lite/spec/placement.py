"""A task's placements: where and on what each replica may run, as ``plan.placement`` resolved them when its
version was submitted. Values only (stored with the version, carried by the remote protocol)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

LOCAL = "local"
# A default image named by a public SSM parameter (AWS), read when the instance is launched.
SSM_PREFIX = "ssm:"


@dataclass(frozen=True)
class Placement:
    """One way to launch a replica: candidate ``candidate`` (its index in ``spec.resource_candidates``)
    resolved to a concrete machine. ``zone`` None: any zone of the region, in the provider's order.
    ``image`` is what to boot: the task's ``image_id``, or a default (``ssm:...`` parameter, image family)
    resolved at launch (``image_is_default``)."""

    cloud: str
    candidate: int = 0
    region: str | None = None
    zone: str | None = None
    zones: tuple[str, ...] = ()  # without ``zone``: the region's zones that offer the type, in launch order
    instance_type: str | None = None
    accelerator: str | None = None  # "A100:8": the GPUs the type has (or that are attached: GCP n1)
    accelerator_type: str | None = None  # GCP's name for attached GPUs (nvidia-tesla-t4); None when built in
    price_per_hour: float | None = None
    is_spot: bool = False
    image: str | None = None
    image_is_default: bool = False
    disk_size: int | None = None
    disk_type: str | None = None
    disk_iops: int | None = None
    disk_throughput: int | None = None
    need: str = ""  # what the candidate asked for, as written: "A100:8, cpus 32+"
    # Which SkyPilot sizing rule filled in what the candidate left unsaid ("memory not given: 4 GiB per vCPU,
    # SkyPilot's CPU families"); "" when it named the type or accelerators, and in versions stored before.
    sizing: str = ""

    def describe(self) -> str:
        """``A100:8 -> p4d.24xlarge (us-east-1, $32.77/h, on-demand)``, ``cpus 4+ (memory not given: ...) ->
        m6i.xlarge (...)`` when a sizing rule chose; local: ``local process``."""
        if self.cloud == LOCAL:
            return "local process on this machine"
        where = "/".join(part for part in (self.region, self.zone) if part) or "default region"
        price = (f"${self.price_per_hour:.2f}/h" if self.price_per_hour is not None
                 else "spot price not in catalog" if self.is_spot else "price not in catalog")
        market = "spot" if self.is_spot else "on-demand"
        machine = self.instance_type or "default type"
        if self.accelerator_type and self.accelerator:
            machine += f" + {self.accelerator}"
        sizing = f" ({self.sizing})" if self.sizing else ""
        return f"{self.need}{sizing} -> {machine} ({where}, {price}, {market})"

    @property
    def zone_order(self) -> tuple[str, ...]:
        """The zones to try, in order; () lets the provider list the region's."""
        return (self.zone,) if self.zone else self.zones

    def describe_disk(self) -> str | None:
        """``256 GB io2, 20000 IOPS``; None when the image's own disk is kept."""
        if not self.disk_size and not self.disk_type:
            return None
        parts = [f"{self.disk_size} GB" if self.disk_size else "image size", self.disk_type or "default type"]
        extra = [f"{self.disk_iops} IOPS" if self.disk_iops else "",
                 f"{self.disk_throughput} MB/s" if self.disk_throughput else ""]
        return " ".join(parts) + "".join(f", {e}" for e in extra if e)

    def describe_image(self) -> str:
        if self.image is None:
            return "-"
        return f"{self.image} (newest, resolved at launch)" if self.image_is_default else self.image

    def to_json(self) -> dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()
                if value not in (None, False, "", 0, ()) or key == "cloud"}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Placement:
        return cls(**{**doc, "zones": tuple(doc.get("zones", ()))})


@dataclass(frozen=True)
class Resolution:
    """The placements of a task by market, and the candidates left out with why."""

    ondemand: tuple[Placement, ...]
    spot: tuple[Placement, ...] = ()
    skipped: tuple[str, ...] = ()

    def for_market(self, is_spot: bool) -> tuple[Placement, ...]:
        return self.spot if is_spot and self.spot else self.ondemand

    def to_json(self) -> dict[str, Any]:
        return {"ondemand": [p.to_json() for p in self.ondemand], "spot": [p.to_json() for p in self.spot],
                "skipped": list(self.skipped)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Resolution:
        return cls(ondemand=tuple(Placement.from_json(p) for p in doc.get("ondemand", [])),
                   spot=tuple(Placement.from_json(p) for p in doc.get("spot", [])),
                   skipped=tuple(doc.get("skipped", [])))
