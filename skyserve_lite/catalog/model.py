"""The catalog's values: what an instance type offers where, what a task asks for, and the one error.

Everything here is an immutable value; nothing reads a file or the network.
"""

from __future__ import annotations

from dataclasses import dataclass

from skyserve_lite.errors import SkyLiteError

CLOUDS = ("aws", "gcp")


class CatalogError(SkyLiteError):
    """No offer satisfies a task's resources, or a catalog cannot be loaded.

    ``field`` is the dotted path of the constraint at fault (``resources.accelerators``,
    ``resources.cpus``, ``resources.region``, ...; ``resources.cloud`` for an unknown cloud), ``problem``
    says what was asked and what the catalog holds instead. The message is ``"<field>: <problem>"``, so
    a spec error built from it reads the same.
    """

    exit_code = 2

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class Gpu:
    """The accelerators of an instance type: a canonical name (SkyPilot's spelling, ``A100-80GB``), how
    many, and the memory of each. ``count`` 0 marks a fractional GPU (AWS g6f: an eighth of an L4), which
    is never chosen by an accelerator count, only by naming the instance type."""

    name: str
    count: int
    memory_gib: float

    def describe(self) -> str:
        return f"{self.count}x {self.name}"


@dataclass(frozen=True)
class InstanceOffer:
    """One instance type in one region, at the zones that have it.

    On GCP an n1 machine with attached GPUs is an offer of its own: ``instance_type`` is the machine
    (``n1-standard-8``), ``gpu`` the GPUs (``T4:1``), ``accelerator_type`` the name Compute Engine wants in
    ``guestAccelerators`` (``nvidia-tesla-t4``) and the prices are the machine's plus the GPUs'. Built-in
    accelerators (g2, a2, a3, every AWS type) leave ``accelerator_type`` None.
    """

    cloud: str
    instance_type: str
    region: str
    zones: tuple[str, ...]
    vcpus: float
    memory_gib: float
    gpu: Gpu | None
    arch: str  # "x86_64" | "arm64"
    ondemand_price: float | None  # USD per hour
    spot_price: float | None
    accelerator_type: str | None = None

    def price(self, spot: bool) -> float | None:
        """The hourly price ``choose`` ranks by: the spot price when ``spot`` and the catalog knows it,
        else the on-demand price; None when the catalog has neither."""
        if spot and self.spot_price is not None:
            return self.spot_price
        return self.ondemand_price


@dataclass(frozen=True)
class Need:
    """What a task's ``resources`` ask of one cloud, as numbers.

    ``cpus``/``memory_gib`` are exact unless ``*_at_least`` (``cpus: 4+``). ``accelerator`` matches a
    canonical name in any case; ``accelerator_count`` None with an accelerator means 1 (``accelerators:
    A100`` is one A100). ``region`` None falls back to the caller's default region; ``zone`` alone
    limits to offers in that zone, whatever region it is in.
    """

    cpus: float | None = None
    cpus_at_least: bool = False
    memory_gib: float | None = None
    memory_at_least: bool = False
    accelerator: str | None = None
    accelerator_count: int | None = None
    instance_type: str | None = None
    use_spot: bool = False
    region: str | None = None
    zone: str | None = None

    @property
    def is_unconstrained(self) -> bool:
        """True when nothing about the machine itself is asked: the cloud's default type applies."""
        return (self.cpus is None and self.memory_gib is None and self.accelerator is None
                and self.instance_type is None)

    @property
    def wanted_accelerator_count(self) -> int:
        return 1 if self.accelerator_count is None else self.accelerator_count

    def describe(self) -> str:
        """The machine constraints in the task's own terms: ``8x A100, 4+ vCPUs, 16 GiB memory``."""
        parts: list[str] = []
        if self.instance_type is not None:
            parts.append(self.instance_type)
        if self.accelerator is not None:
            parts.append(f"{self.wanted_accelerator_count}x {self.accelerator}")
        if self.cpus is not None:
            parts.append(f"{self.cpus:g}{'+' if self.cpus_at_least else ''} vCPUs")
        if self.memory_gib is not None:
            parts.append(f"{self.memory_gib:g}{'+' if self.memory_at_least else ''} GiB memory")
        return ", ".join(parts) or "the default instance type"
