"""Rows of the state store as typed values. The store returns these, never tuples or dicts."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from skyserve_lite import __version__
from skyserve_lite.codec import decode, encode
from skyserve_lite.files.manifest import TaskFiles
from skyserve_lite.netaddr import host_port
from skyserve_lite.plan.canary import CanaryState, Command
from skyserve_lite.spec.inputs import BoundInputs, bind, with_legacy_user
from skyserve_lite.spec.model import ServiceSpec, TaskSpec
from skyserve_lite.spec.parse import parse_task

if TYPE_CHECKING:  # Python 3.11's typing has it; 3.10 needs this, for the checker only
    from typing_extensions import Unpack


class ReplicaStatus(str, Enum):
    """Statuses a SkyServe user knows.

    Live: PENDING, PROVISIONING, STARTING, READY, NOT_READY (they count toward the target).
    SHUTTING_DOWN: being terminated on purpose; the row goes away once the instance is gone.
    Terminal: FAILED*, PREEMPTED; the row stays as a record, the instance is cleaned up.
    """

    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    STARTING = "STARTING"
    READY = "READY"
    NOT_READY = "NOT_READY"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    FAILED = "FAILED"
    FAILED_INITIAL_DELAY = "FAILED_INITIAL_DELAY"
    FAILED_PROBING = "FAILED_PROBING"
    FAILED_PROVISION = "FAILED_PROVISION"
    PREEMPTED = "PREEMPTED"

    # Set once per member below: these are asked for every replica several times per pass (6,000 times
    # for 1,000 replicas), and an Enum's hash in a set lookup is a Python-level call.
    _terminal: bool
    _live: bool
    _app_failure: bool

    @property
    def is_terminal(self) -> bool:
        return self._terminal

    @property
    def is_live(self) -> bool:
        return self._live

    @property
    def is_app_failure(self) -> bool:
        """A failure that says the workload itself is broken (every terminal status but PREEMPTED, which is
        the cloud taking a spot instance back)."""
        return self._app_failure


_TERMINAL_NAMES = ("FAILED", "FAILED_INITIAL_DELAY", "FAILED_PROBING", "FAILED_PROVISION", "PREEMPTED")
for _status in ReplicaStatus:
    _status._terminal = _status.name in _TERMINAL_NAMES
    _status._live = not _status._terminal and _status.name != "SHUTTING_DOWN"
    _status._app_failure = _status._terminal and _status.name != "PREEMPTED"
# Status by stored text, without the Enum's lookup machinery (rows are read every pass).
REPLICA_STATUS_BY_VALUE = {status.value: status for status in ReplicaStatus}


class ServiceStatus(str, Enum):
    CONTROLLER_INIT = "CONTROLLER_INIT"  # accepted, no controller pass has looked at it yet
    REPLICA_INIT = "REPLICA_INIT"  # replicas are being launched, none ready yet
    READY = "READY"  # at least one replica is READY
    NO_REPLICA = "NO_REPLICA"  # the target is zero and nothing runs
    SHUTTING_DOWN = "SHUTTING_DOWN"  # `serve down` asked; replicas and load balancer are going away
    FAILED = "FAILED"  # replicas of the current version keep failing; launching stopped


@dataclass(frozen=True)
class ServiceRecord:
    name: str
    current_version: int
    status: ServiceStatus
    status_reason: str | None
    lb_port: int
    lb_pid: int | None
    lb_policy: str
    deleting: bool
    created_at: float
    next_replica_id: int
    active_versions: tuple[int, ...] | None = None  # None: every READY replica gets traffic
    endpoint_host: str = "127.0.0.1"  # where clients reach the load balancer (the controller host's address)
    # The current version has `service.tls`: its load balancer serves HTTPS. Not stored: set where a view
    # of the service is built (``api``), from the current version's spec.
    endpoint_tls: bool = False
    lb_port_pinned: bool = False  # `serve up --endpoint-port`: the port never moves

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.endpoint_tls else 'http'}://{host_port(self.endpoint_host, self.lb_port)}"


def parsed_spec_json(spec: TaskSpec) -> str:
    """What a version stores of ``spec`` as parsed when it was accepted (without its files, which the
    snapshot holds): the spec by the codec, stamped with the parser that parsed it (``parser_stamp``;
    ``VersionRecord.service_spec`` reads it)."""
    document = {"parsed_by": parser_stamp(), "spec": encode(dataclasses.replace(spec, files=None))}
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


# The sources that decide what a task text parses to: the parser, the values and their defaults, the loader.
_PARSER_SOURCES = ("parse.py", "model.py", "yaml_doc.py")


def stamp_of_sources(folder: Path) -> str | None:
    """The package version and a digest of the parser's sources in ``folder``; None when one cannot be read."""
    digest = hashlib.sha256()
    try:
        for name in _PARSER_SOURCES:
            digest.update((folder / name).read_bytes())
    except OSError:
        return None
    return f"{__version__}+{digest.hexdigest()[:16]}"


@cache
def parser_stamp() -> str | None:
    """What identifies this sky-lite's parser: any change to its sources, within one version too, makes the
    parsed forms stored before it parsed again from their texts. None (the sources cannot be read: nothing
    stored is trusted) stores forms that no reader trusts."""
    from skyserve_lite.spec import parse

    return stamp_of_sources(Path(parse.__file__).parent)


@dataclass(frozen=True)
class VersionRecord:
    """One accepted task YAML: the text exactly as submitted, its parsed form, and the snapshot of its
    files taken when it was accepted."""

    service: str
    version: int
    text: str
    source: str
    created_at: float
    mode: str  # "initial" for version 1, else the update mode: "rolling" | "blue_green"
    note: str | None = None
    files_json: str | None = None  # the snapshot's manifest (TaskFiles as JSON); None: nothing captured
    files_expired: bool = False  # the snapshot was dropped (SKY_LITE_KEEP_SNAPSHOT_VERSIONS): no rollback to it
    reuse_identical_files: bool = False  # its update reuses replicas whose files are identical
    inputs_json: str | None = None  # what the submission added to the text (``spec.inputs.BoundInputs``)
    spec_json: str | None = field(default=None, repr=False)  # the spec as parsed when accepted (``parsed_spec_json``)

    @cached_property
    def inputs(self) -> BoundInputs:
        return BoundInputs.from_json(self.inputs_json)

    @cached_property
    def files(self) -> TaskFiles | None:
        if self.files_json is None or self.files_expired:
            return None
        return TaskFiles.from_json(json.loads(self.files_json))

    @cached_property
    def spec(self) -> TaskSpec:
        # The text was validated when it was accepted; parsing it again gives the same value.
        source = f"{self.service} version {self.version}"
        # Not strict: a text an earlier sky-lite stored runs as it did, whatever rules came since.
        parsed = with_legacy_user(bind(parse_task(self.text, source=source, strict=False), self.inputs, source,
                                       fill_mounts=self.inputs_json is not None, strict=False), self.inputs)
        return dataclasses.replace(parsed, files=self.files) if self.files is not None else parsed

    @cached_property
    def service_spec(self) -> ServiceSpec:
        """``spec.service`` without parsing the text when this sky-lite's parser (``parser_stamp``) parsed the
        version and stored what it parsed, in the shape of today's values (`serve status` of 100 services
        parsed 100 texts, and loaded PyYAML, for their service sections alone). Otherwise (a version another
        sky-lite or another parser accepted, a stored form of another shape) it is parsed from the text, as
        the controller does."""
        stored = _stored_service(self.spec_json)
        return stored if stored is not None else self.spec.service


def _stored_service(spec_json: str | None) -> ServiceSpec | None:
    """The service section ``parsed_spec_json`` stored, when this sky-lite's parser stored it and it
    decodes to today's fields exactly; else None (the text is parsed: always safe)."""
    if spec_json is None:
        return None
    stamp = parser_stamp()
    try:
        document = json.loads(spec_json)
        if stamp is None or document.get("parsed_by") != stamp:
            return None
        service: ServiceSpec = decode(ServiceSpec, document["spec"]["service"], "service", exact=True)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError):  # a damaged row
        return None
    return service


@dataclass(frozen=True)
class ReplicaRecord:
    service: str
    replica_id: int
    version: int
    status: ReplicaStatus
    cloud: str
    launched_at: float  # when the controller recorded its intent to launch
    status_since: float  # when `status` last changed
    launch_token: str  # idempotency token of the launch batch (a cloud's ClientToken)
    is_spot: bool = False
    region: str | None = None
    zone: str | None = None
    instance_id: str | None = None
    url: str | None = None
    first_ready_at: float | None = None
    probe_failing_since: float | None = None
    status_reason: str | None = None
    # When a provider's inventory first listed its instance. Until then a missing instance may just not be
    # listed yet (a cloud's inventory lags its launches); after it, a missing instance is gone.
    seen_at: float | None = None
    # What it landed on: the instance type and accelerators ("A100:8") of the placement it was launched with.
    instance_type: str | None = None
    accelerator: str | None = None


class ReplicaChanges(TypedDict, total=False):
    """What ``replace_replica`` may change: every field of ``ReplicaRecord``, typed as there (a test holds
    the two to the same names and types)."""

    service: str
    replica_id: int
    version: int
    status: ReplicaStatus
    cloud: str
    launched_at: float
    status_since: float
    launch_token: str
    is_spot: bool
    region: str | None
    zone: str | None
    instance_id: str | None
    url: str | None
    first_ready_at: float | None
    probe_failing_since: float | None
    status_reason: str | None
    seen_at: float | None
    instance_type: str | None
    accelerator: str | None


_REPLICA_FIELDS = frozenset(ReplicaChanges.__annotations__)


def replace_replica(record: ReplicaRecord, /, **changes: Unpack[ReplicaChanges]) -> ReplicaRecord:
    """``dataclasses.replace`` for the row passes change by the thousand (every replica of a launch, three
    times each as they become ready), about four times faster: ``dataclasses.replace`` walks the fields and
    runs ``__init__``'s twenty frozen assignments, this copies the row's attributes and sets the changed
    ones. The result is the same value (equal, same hash)."""
    if not _REPLICA_FIELDS.issuperset(changes):
        raise TypeError(f"ReplicaRecord has no field {sorted(set(changes) - _REPLICA_FIELDS)[0]!r}")
    new = object.__new__(ReplicaRecord)
    state = new.__dict__
    state.update(record.__dict__)
    state.update(changes)
    return new


def replica_from_fields(values: dict[str, Any]) -> ReplicaRecord:
    """``ReplicaRecord(**values)`` for a row the store decodes (10,000 of them whenever replica rows
    changed), in half the time: the dict becomes the row's own attributes, without ``__init__``'s twenty
    frozen assignments. ``values`` must hold every field, each of its field's type."""
    if len(values) != len(_REPLICA_FIELDS):
        raise TypeError(f"a replica row has {len(_REPLICA_FIELDS)} fields, not {len(values)}")
    record = object.__new__(ReplicaRecord)
    object.__setattr__(record, "__dict__", values)
    return record


@dataclass(frozen=True)
class EventRecord:
    event_id: int
    time: float
    service: str
    replica_id: int | None
    kind: str
    message: str


@dataclass(frozen=True)
class LbView:
    """What a service's load balancer needs from the state: where to send traffic, and how."""

    ready_urls: tuple[str, ...]
    policy: str
    accelerators: tuple[str | None, ...] = ()  # of each ready url, in order ("A100:8"; None: unknown)
    versions: tuple[int, ...] = ()  # the service version of each ready url, in order (empty: unknown)
    # A canary rollout's split: (version, percent of the requests) for the versions given a share; every other
    # version in ``versions`` shares the rest. Empty: no split, every ready url by the policy alone.
    split: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class StoredCanary:
    """A service's canary rollout as stored: its state, the new version's share of the traffic now, and a
    person's command the controller has not yet acted on (None: none)."""

    state: CanaryState
    percent: int
    command: Command | None = None


@dataclass(frozen=True)
class LbEndpoint:
    """What a load balancer recorded once it listened: the ``address`` it bound (``127.0.0.1:30001``) on
    ``host`` (its machine's name), its ``pid``, and when (epoch seconds)."""

    service: str
    host: str
    address: str
    pid: int
    bound_at: float


@dataclass(frozen=True)
class LbReport:
    """A load balancer's latest report: in-flight requests per replica url, and requests held waiting for
    a READY replica (scale from zero)."""

    reported_at: float
    in_flight: tuple[tuple[str, int], ...] = ()
    waiting: int = 0


@dataclass(frozen=True)
class AutoscalerObservation:
    """What the autoscaler last saw and decided, for `serve status`."""

    policy: str
    raw_target: int
    qps: float | None = None
    average_ongoing: float | None = None
    held_back: str | None = None
