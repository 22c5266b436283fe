"""Typed, immutable values for a task YAML after parsing and defaulting.

Mappings from the YAML (``envs``, ``file_mounts``, ``labels``, probe ``headers``) are kept as tuples of
``(key, value)`` pairs sorted by key, so that every value here is hashable and two equal documents give
equal values whatever the key order in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from skyserve_lite.files.manifest import TaskFiles
from skyserve_lite.plan.canary import CanarySettings
from skyserve_lite.spec.placement import Resolution

Pairs = tuple[tuple[str, str], ...]

# Defaults a SkyServe user expects.
DEFAULT_PROBE_PATH = "/"
DEFAULT_INITIAL_DELAY_SECONDS = 1200
DEFAULT_PROBE_TIMEOUT_SECONDS = 15
DEFAULT_UPSCALE_DELAY_SECONDS = 300
DEFAULT_DOWNSCALE_DELAY_SECONDS = 1200


class Cloud(str, Enum):
    LOCAL = "local"
    AWS = "aws"
    GCP = "gcp"


class LoadBalancingPolicy(str, Enum):
    ROUND_ROBIN = "round_robin"
    LEAST_LOAD = "least_load"
    # least load, each replica weighted by its capacity (``target_qps_per_replica`` per accelerator)
    INSTANCE_AWARE_LEAST_LOAD = "instance_aware_least_load"


class SpotPlacer(str, Enum):
    """SkyServe's ``spot_placer``: where spot replicas go. ``dynamic_fallback`` (SpotHedge) spreads them over
    the zones their placements allow, and moves launches away from a zone that just took a spot replica back
    (``plan.spot_zones``)."""

    DYNAMIC_FALLBACK = "dynamic_fallback"


class DiskTier(str, Enum):
    """SkyPilot's disk tiers; each cloud maps them to its volume types (``catalog.disk_for``)."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    ULTRA = "ultra"
    BEST = "best"


class CandidateOrder(str, Enum):
    """How a task's resource candidates are tried: ``any_of`` cheapest first, ``ordered`` as written."""

    ANY_OF = "any_of"
    ORDERED = "ordered"


@dataclass(frozen=True)
class Amount:
    """``cpus: 4`` (exactly 4) or ``cpus: 4+`` (at least 4); memory in GiB the same way."""

    value: float
    at_least: bool = False

    def describe(self) -> str:
        return f"{self.value:g}{'+' if self.at_least else ''}"


@dataclass(frozen=True)
class Accelerator:
    """``A100:8``: the accelerator's name as written (matched case-insensitively) and how many."""

    name: str
    count: int = 1

    def describe(self) -> str:
        return f"{self.name}:{self.count}"


@dataclass(frozen=True)
class Resources:
    """One way to run a replica. ``cloud`` None: the task names none, and submitting it chooses one
    (``--infra``, the home's ``default_infra``, else ``local``); ``TaskSpec.cloud`` is the one that counts."""

    cloud: Cloud | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    image_id: str | None = None
    use_spot: bool = False
    disk_size: int | None = None
    disk_tier: DiskTier | None = None
    cpus: Amount | None = None
    memory: Amount | None = None
    accelerator: Accelerator | None = None
    ports: tuple[int, ...] = ()
    labels: Pairs = ()
    # Cloud replicas run `setup` and `run` as the unprivileged user `sky` unless the task opts into root.
    run_as_root: bool = False

    def describe_need(self) -> str:
        """What this candidate asks for, for plans and errors: ``A100:8, cpus 32+`` or ``m5.large``."""
        parts = []
        if self.instance_type:
            parts.append(self.instance_type)
        if self.accelerator:
            parts.append(self.accelerator.describe())
        if self.cpus:
            parts.append(f"cpus {self.cpus.describe()}")
        if self.memory:
            parts.append(f"memory {self.memory.describe()}GB")
        return ", ".join(parts) or "the default instance type"


@dataclass(frozen=True)
class ReadinessProbe:
    path: str = DEFAULT_PROBE_PATH
    # Canonical JSON text (sorted keys, no spaces) of the body to POST; None means GET.
    post_data: str | None = None
    initial_delay_seconds: int = DEFAULT_INITIAL_DELAY_SECONDS
    timeout_seconds: float = float(DEFAULT_PROBE_TIMEOUT_SECONDS)
    headers: Pairs = ()
    # (name, digest) of each secret that ``path``, ``post_data`` or ``headers`` refer to (``$NAME``): their
    # values are filled in by the prober, at the request, and never stored or shown with the probe.
    secrets: Pairs = ()


@dataclass(frozen=True)
class ReplicaPolicy:
    min_replicas: int = 1
    max_replicas: int = 1
    target_qps_per_replica: float | None = None
    target_ongoing_requests_per_replica: float | None = None
    upscale_delay_seconds: float = DEFAULT_UPSCALE_DELAY_SECONDS
    downscale_delay_seconds: float = DEFAULT_DOWNSCALE_DELAY_SECONDS
    base_ondemand_fallback_replicas: int = 0
    dynamic_ondemand_fallback: bool = False
    # Replicas kept above the autoscaler's target (SkyServe's num_overprovision).
    num_overprovision: int = 0
    # ``target_qps_per_replica: {A100: 5, L4: 2}``: each replica's share by the accelerator it landed on
    # (sorted by name); ``target_qps_per_replica`` is then the smallest of them, for the replica count.
    qps_per_accelerator: tuple[tuple[str, float], ...] = ()
    spot_placer: SpotPlacer | None = None

    @property
    def is_autoscaling(self) -> bool:
        return self.target_qps_per_replica is not None or self.target_ongoing_requests_per_replica is not None

    def describe(self) -> str:
        """One line for `serve status`.

        ``Fixed 2 replicas`` or ``Autoscaling 1-3 replicas (2 qps/replica)``.
        """
        if not self.is_autoscaling:
            noun = "replica" if self.min_replicas == 1 else "replicas"
            return f"Fixed {self.min_replicas} {noun}"
        if self.target_qps_per_replica is not None:
            per_replica = f"{self.target_qps_per_replica:g} qps/replica"
        else:
            per_replica = f"{self.target_ongoing_requests_per_replica:g} in-flight requests/replica"
        return f"Autoscaling {self.min_replicas}-{self.max_replicas} replicas ({per_replica})"


class AuthType(str, Enum):
    """How a client proves it may use the endpoint: ``bearer`` is ``Authorization: Bearer KEY``."""

    BEARER = "bearer"


@dataclass(frozen=True)
class ServiceAuth:
    """``service.auth``: the load balancer answers 401 to a request without one of these keys.

    ``api_keys`` are (name, digest) of secrets of the task, sorted by name; a digest of "" means not bound yet.
    Once bound (``spec.inputs.bind``) these secrets are the load balancer's alone: they leave
    ``TaskSpec.secrets``, so no replica gets them as a variable and a new value (a key rotated with
    ``serve update --secret``) is a service change that reuses replicas.
    """

    api_keys: Pairs
    type: AuthType = AuthType.BEARER

    @property
    def key_names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.api_keys)


class RateLimitKeyType(str, Enum):
    """What a rate limit counts requests by (dstack's ``key.type``)."""

    IP_ADDRESS = "ip_address"
    HEADER = "header"


@dataclass(frozen=True)
class RateLimitKey:
    """Whose requests share one bucket: each client address, or each value of the header ``header``."""

    type: RateLimitKeyType = RateLimitKeyType.IP_ADDRESS
    header: str | None = None  # with ``HEADER``: the header's name as written

    def describe(self) -> str:
        """``ip_address`` or ``header X-API-Key``: how plans and history show it."""
        return f"header {self.header}" if self.type is RateLimitKeyType.HEADER else self.type.value


@dataclass(frozen=True)
class RateLimit:
    """One entry of ``service.rate_limits``, dstack's fields: requests whose path starts with ``prefix`` (the
    longest matching prefix of the service's limits decides) get ``rps`` a second per key, and ``burst``
    more at once; see ``lb.guard`` for the arithmetic."""

    rps: float
    prefix: str = "/"
    burst: int = 0
    key: RateLimitKey = field(default_factory=RateLimitKey)


@dataclass(frozen=True)
class ServiceSpec:
    readiness_probe: ReadinessProbe = field(default_factory=ReadinessProbe)
    replica_policy: ReplicaPolicy = field(default_factory=ReplicaPolicy)
    # The port the workload listens on for cloud replicas; the local provider assigns its own ($PORT).
    port: int | None = None
    load_balancing_policy: LoadBalancingPolicy = LoadBalancingPolicy.LEAST_LOAD
    tls: TlsFiles | None = None
    auth: ServiceAuth | None = None
    # In the order written; prefixes are distinct.
    rate_limits: tuple[RateLimit, ...] = ()
    # `service.canary`: the defaults of `serve update --mode canary` (its flags override them); None: none.
    canary: CanarySettings | None = None

    @property
    def lb_policy(self) -> str:
        """The policy as the load balancer reads it: its name, and for ``instance_aware_least_load`` each
        accelerator's rate (``instance_aware_least_load:a100=5,l4=2``), so a new rate reaches it as a new
        policy does."""
        name = self.load_balancing_policy.value
        rates = self.replica_policy.qps_per_accelerator
        if self.load_balancing_policy is not LoadBalancingPolicy.INSTANCE_AWARE_LEAST_LOAD or not rates:
            return name
        return name + ":" + ",".join(f"{accelerator.lower()}={rate:g}" for accelerator, rate in rates)


@dataclass(frozen=True)
class TlsFiles:
    """``service.tls``: the load balancer serves HTTPS with this key and certificate (paths as written;
    their contents are captured with the version's files)."""

    keyfile: str
    certfile: str


@dataclass(frozen=True)
class TaskSpec:
    run: str
    service: ServiceSpec
    name: str | None = None
    # The `resources` section itself (shared by every candidate)...
    resources: Resources = field(default_factory=Resources)
    # ...and, with `any_of`, `ordered` or several accelerators, each candidate in full (the section with
    # the candidate's fields over it), in the order written; () when there is one way only.
    candidates: tuple[Resources, ...] = ()
    candidate_order: CandidateOrder = CandidateOrder.ANY_OF
    envs: Pairs = ()
    # `envs` entries written `X: null`: their values come at submit time (`--env X=v`), then live in `envs`.
    unset_envs: tuple[str, ...] = ()
    # `secrets`: (name, digest) of every secret, its value kept apart (``spec.secrets``); a digest of ""
    # means not given yet (`secrets: {X: null}` before submitting with `--secret X`). Once bound, the keys
    # of `service.auth` are not here but in ``ServiceAuth.api_keys``: what is here is what replicas get.
    secrets: Pairs = ()
    workdir: str | None = None
    file_mounts: Pairs = ()
    setup: str | None = None
    # The snapshot of `workdir` and the local `file_mounts` sources taken when the task was submitted (not
    # part of the YAML): what every replica of the version runs. None before capture, or with nothing local.
    files: TaskFiles | None = None
    # Where each replica may run, resolved when the version was submitted (``plan.placement``); not part of
    # the YAML, nor of the replica config (the candidates are). None before submission.
    resolution: Resolution | None = None

    @property
    def cloud(self) -> Cloud:
        """The one cloud every replica of the task runs on."""
        for resources in self.resource_candidates:
            if resources.cloud is not None:
                return resources.cloud
        return Cloud.LOCAL

    @property
    def resource_candidates(self) -> tuple[Resources, ...]:
        """Every way to run a replica, in the order written: the candidates, else the section."""
        return self.candidates or (self.resources,)


@dataclass(frozen=True)
class Secret:
    """A secret's value on its way from the user to the replicas; never printed (its repr hides it)."""

    value: str = field(repr=False)

    def __str__(self) -> str:
        return "<redacted>"


@dataclass(frozen=True)
class TaskInputs:
    """What `serve up`/`update` add to the YAML: ``infra`` (``--infra``: the cloud/region/zone where the task
    names none), ``default_infra`` (the home's setting, used only when neither ``infra`` nor the previous
    version decides), values of `envs: {X: null}` and of secrets (from --env/--env-file/--secret)."""

    infra: str | None = None
    default_infra: str | None = None
    envs: Pairs = ()
    secrets: tuple[tuple[str, Secret], ...] = ()
    # Secrets by the digest a stored version names (a rollback brings back the version's own values).
    secret_digests: Pairs = ()
    # A stored version's placements (a rollback launches where that version did, whatever the catalog says now).
    resolution: Resolution | None = None


@dataclass(frozen=True)
class SubmittedTask:
    """A task as the user submitted it: the exact text, where it came from, and its parsed form.

    ``text`` never holds a secret value: one written in the file is cut out when the file is read, and
    travels in ``inputs`` like one given with ``--secret``.
    """

    text: str
    source: str
    spec: TaskSpec
    inputs: TaskInputs = field(default_factory=TaskInputs)
