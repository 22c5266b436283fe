"""Parse and validate a task YAML into a ``TaskSpec``.

Every rejection is a ``SpecError`` naming the source, the dotted field path and what is wrong; nothing
here touches state, so a rejected file changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from skyserve_lite.errors import SpecError
from skyserve_lite.plan.canary import CanarySettings, find_settings_problem
from skyserve_lite.spec.model import (
    DEFAULT_DOWNSCALE_DELAY_SECONDS,
    DEFAULT_INITIAL_DELAY_SECONDS,
    DEFAULT_PROBE_PATH,
    DEFAULT_PROBE_TIMEOUT_SECONDS,
    DEFAULT_UPSCALE_DELAY_SECONDS,
    Accelerator,
    Amount,
    AuthType,
    CandidateOrder,
    Cloud,
    DiskTier,
    LoadBalancingPolicy,
    Pairs,
    RateLimit,
    RateLimitKey,
    RateLimitKeyType,
    ReadinessProbe,
    ReplicaPolicy,
    Resources,
    Secret,
    ServiceAuth,
    ServiceSpec,
    SpotPlacer,
    SubmittedTask,
    TaskInputs,
    TaskSpec,
    TlsFiles,
)

if TYPE_CHECKING:
    import yaml

_T = TypeVar("_T")

# DNS-1123 label: what a hostname part, a Kubernetes name and a cloud tag accept alike.
_NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
# A task's `name`, as SkyPilot accepts it; only the service name must be a DNS label.
_TASK_NAME_RE = re.compile(r"[A-Za-z]([-_.A-Za-z0-9]*[A-Za-z0-9])?")
# `cpus: 4`, `4+`, `0.5+`; `memory: 16`, `32+`, `8GB`, `1TB+`.
_AMOUNT_RE = re.compile(r"(?P<value>\d+(\.\d+)?|\.\d+)\s*(?P<unit>[A-Za-z]*)\s*(?P<plus>\+?)")
_MEMORY_UNITS = {"": 1.0, "gb": 1.0, "gib": 1.0, "g": 1.0, "tb": 1024.0, "tib": 1024.0, "t": 1024.0,
                 "mb": 1 / 1024, "mib": 1 / 1024, "m": 1 / 1024}
# Clouds SkyPilot knows that sky-lite does not offer: named in the refusal instead of "unknown value".
_OTHER_CLOUDS = ("azure", "kubernetes", "k8s", "lambda", "runpod", "oci", "ibm", "scp", "fluidstack",
                 "paperspace", "cudo", "vsphere", "do", "nebius", "vast", "hyperbolic", "ssh")
# `$NAME` and `${NAME}`: references to the task's envs and secrets in the fields SkyPilot fills them into.
REFERENCE_RE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")
# An HTTP header name: RFC 9110's token (`$` is one of its characters, so `X-$NAME` is a name too).
HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# What `export NAME=...` accepts as NAME: a name is written into boot scripts as is, only values are quoted.
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_TOP_KEYS = ("name", "resources", "envs", "secrets", "workdir", "file_mounts", "setup", "run", "service",
             "num_nodes")
# What a candidate of `any_of`/`ordered` may set; the rest is shared by every candidate.
_CANDIDATE_KEYS = (
    "infra", "cloud", "region", "zone", "instance_type", "cpus", "memory", "accelerators", "image_id",
    "disk_size", "disk_tier",
)
_RESOURCE_KEYS = (*_CANDIDATE_KEYS, "use_spot", "ports", "labels", "run_as_root", "any_of", "ordered")
_SERVICE_KEYS = ("readiness_probe", "replicas", "replica_policy", "ports", "load_balancing_policy", "tls", "auth",
                 "rate_limits", "canary")
_CANARY_KEYS = ("steps", "bake_seconds", "max_error_rate", "min_requests", "max_extensions")
_TLS_KEYS = ("keyfile", "certfile")
_AUTH_KEYS = ("type", "api_keys")
# dstack's names; `key` also takes the short strings `ip` and `header NAME`.
_RATE_LIMIT_KEYS = ("prefix", "rps", "burst", "key")
_RATE_KEY_KEYS = ("type", "header")
# dstack's lowest rate (nginx counts in requests a minute): one request a minute.
MIN_RPS = 1 / 60
# What a rate limit's `prefix` may not hold. The load balancer matches paths decoded and normalized
# (``lb.guard.normalize_path``): a %-escape, '//' or a '.' or '..' segment in a prefix would not match the
# paths it seems to name.
# Whitespace and backslashes are refused as dstack refuses them, '?' and '#' because they read as a query.
_PREFIX_FORBIDDEN_RE = re.compile(r"[\s%\\?#]|//|/\.\.?(/|$)")
_PROBE_KEYS = ("path", "post_data", "initial_delay_seconds", "timeout_seconds", "headers")
_POLICY_KEYS = (
    "min_replicas", "max_replicas", "target_qps_per_replica", "target_ongoing_requests_per_replica",
    "upscale_delay_seconds", "downscale_delay_seconds", "base_ondemand_fallback_replicas",
    "dynamic_ondemand_fallback", "num_overprovision", "spot_placer",
)


def is_valid_service_name(name: str) -> bool:
    """A DNS-style label: lowercase letters, digits and '-', starting with a letter, at most 63 chars."""
    # fullmatch, not match with "$": "$" also matches before a trailing newline ("svc\n").
    return _NAME_RE.fullmatch(name) is not None


def is_valid_task_name(name: str) -> bool:
    """SkyPilot's rule for a task's `name`: letters, digits, '-', '_' and '.', starting with a letter and
    ending with a letter or digit."""
    return _TASK_NAME_RE.fullmatch(name) is not None


def to_service_name(text: str) -> str:
    """A DNS label made of ``text`` (a task name, a file stem): lowercased, every run of characters a label
    does not allow turned into one '-', cut to 63 characters. May still be invalid (``1ok``, ``""``)."""
    label = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return label[:63].rstrip("-")


def load_task_file(path: Path) -> SubmittedTask:
    """Read and parse a task file; an unreadable file is a ``SpecError`` on the file itself."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        # The message names the file already: an OSError's own text would name it again, with its errno.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError(str(path), "", f"cannot read the file: {reason}") from exc
    return read_task(text, str(path))


def read_task(text: str, source: str = "<string>") -> SubmittedTask:
    """A submitted task from YAML text: secret values written in the file are cut out of the text (which
    is what gets stored) and carried in ``inputs``, as if given with ``--secret``."""
    # A byte-order mark (Windows editors write one) is no part of the document, and libyaml's marks do not
    # count it: the secret values' positions would be one character off.
    text = text.removeprefix("\ufeff")
    document = _load_yaml(text, source)
    kept_text, inline = split_secret_values(text, document, source)
    spec = parse_document(_load_yaml(kept_text, source) if inline else document, source)
    inputs = TaskInputs(secrets=tuple((name, Secret(value)) for name, value in sorted(inline.items())))
    return SubmittedTask(text=kept_text, source=source, spec=spec, inputs=inputs)


def parse_task(text: str, source: str = "<string>", *, strict: bool = True) -> TaskSpec:
    """Parse task YAML text. Pure: raises ``SpecError`` on the first problem found.

    A secret written with its value is read as not given (``read_task`` is what keeps such values).
    ``strict`` False reads a text an earlier sky-lite stored (``parse_document``).
    """
    return parse_document(_load_yaml(text, source), source, strict=strict)


def parse_document(document: object, source: str, *, strict: bool = True) -> TaskSpec:
    """The task of a YAML document. ``strict`` (every submission) applies every rule; without it (a version
    stored by an earlier sky-lite, read again to run it or roll back to it) the rules added since texts were
    first stored are not applied, and what they refuse gets its earlier reading: a stored service keeps
    running after an upgrade whatever a new submission of its text would be told (``_Parser.refuse``)."""
    parser = _Parser(source, strict=strict)
    spec = parser.task(document)
    validate_cross_fields(spec, source, parser.rate_keys, strict=strict)
    return spec


def _load_yaml(text: str, source: str) -> object:
    from skyserve_lite.spec.yaml_doc import load_document  # what reads parsed versions only needs no YAML

    return load_document(text, source)


def split_secret_values(text: str, document: object, source: str) -> tuple[str, dict[str, str]]:
    """``text`` with the value of every ``secrets`` entry written in it replaced by ``null``, and those
    values by name. The text is edited where the values stand (by the YAML parser's marks), so comments and
    layout survive; a file without inline secrets comes back unchanged.

    A value is taken as written: ``PIN: 0123`` is the text ``0123``, not the number YAML 1.1 reads. A value
    with an anchor, or an alias, is refused: cutting it out would break, or leave, the other use.
    """
    if not isinstance(document, dict) or not isinstance(document.get("secrets"), dict):
        return text, {}
    import yaml

    from skyserve_lite.spec.yaml_doc import StrictLoader

    values: dict[str, str] = {}
    spans: list[tuple[int, int]] = []
    root = yaml.compose(text, Loader=StrictLoader)
    secrets_node = next((value for key, value in root.value if key.value == "secrets"), None) if root else None
    if not isinstance(secrets_node, yaml.MappingNode):
        raise SpecError(source, "secrets", "write the secrets as a block or flow mapping of names to values")
    uses = _count_uses(root) if root is not None else {}
    for key_node, value_node in secrets_node.value:
        path = f"secrets.{key_node.value}"
        value = document["secrets"].get(key_node.value)
        if value is None:
            continue
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise SpecError(source, path, f"must be a string, got {_kind(value)}")
        start, end = value_node.start_mark.index, value_node.end_mark.index
        if (start < key_node.end_mark.index or uses[id(value_node)] > 1 or text[start:start + 1] in ("&", "*")
                or start == end):
            raise SpecError(source, path, "write the value itself, without a YAML anchor or alias")
        raw = text[start:end].strip()
        values[str(key_node.value)] = value if isinstance(value, str) else raw
        spans.append((start, end))
    if not spans:
        return text, {}
    out, last = [], 0
    for start, end in sorted(spans):
        out.append(text[last:start])
        out.append("null" + ("\n" if text[start:end].endswith("\n") else ""))
        last = end
    out.append(text[last:])
    return "".join(out), values


def _count_uses(root: yaml.Node) -> dict[int, int]:
    """How many places of the document each node stands in (more than one: it is anchored and aliased)."""
    import yaml

    uses: dict[int, int] = {}
    stack: list[yaml.Node] = [root]
    while stack:
        node = stack.pop()
        uses[id(node)] = uses.get(id(node), 0) + 1
        if uses[id(node)] > 1:
            continue
        if isinstance(node, yaml.MappingNode):
            stack.extend(item for pair in node.value for item in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return uses


class _Parser:
    def __init__(self, source: str, *, strict: bool = True) -> None:
        self.source = source
        self.strict = strict
        # `target_qps_per_replica` keys as written (`"A100:1"`), by accelerator name in lower case: errors
        # found across sections name the key the file has.
        self.rate_keys: dict[str, str] = {}

    def fail(self, path: str, problem: str) -> SpecError:
        return SpecError(self.source, path, problem)

    def refuse(self, path: str, problem: str) -> None:
        """A rule added after texts were first stored (SkyServe's stricter readings): raised for a submission,
        passed over for a stored text, which then gets the reading it had when it was stored."""
        if self.strict:
            raise self.fail(path, problem)

    # --- generic readers -------------------------------------------------------------------------
    def mapping(self, value: object, path: str, allowed: tuple[str, ...] | None) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            what = "the document" if not path else "this field"
            raise self.fail(path, f"{what} must be a mapping, got {_kind(value)}")
        for key in value:
            if not isinstance(key, str):
                raise self.fail(path, f"keys must be strings, got {key!r}")
            if allowed is not None and key not in allowed:
                raise self.fail(_join(path, key), f"unknown field; expected one of: {', '.join(allowed)}")
        return value

    def optional(self, doc: Mapping[str, Any], key: str, path: str,
                 read: Callable[[object, str], _T], default: _T) -> _T:
        value = doc.get(key)
        if value is None:
            return default
        return read(value, _join(path, key))

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            raise self.fail(path, f"must be a string, got {_kind(value)}")
        return value

    def command(self, value: object, path: str) -> str:
        text = self.string(value, path)
        if not text.strip():
            raise self.fail(path, "must not be empty")
        return text

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"must be true or false, got {_kind(value)}")
        return value

    def integer(self, value: object, path: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer, got {_kind(value)}")
        if value < minimum:
            raise self.fail(path, f"must be at least {minimum}, got {value}")
        return value

    def number(self, value: object, path: str, positive: bool) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"must be a number, got {_kind(value)}")
        if not math.isfinite(value):
            raise self.fail(path, f"must be a finite number, got {value}")
        if value < 0 or (positive and value == 0):
            raise self.fail(path, f"must be {'greater than 0' if positive else 'at least 0'}, got {value}")
        return float(value)

    def port(self, value: object, path: str) -> int:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be a port number, got {_kind(value)}")
        if not 1 <= value <= 65535:
            raise self.fail(path, f"port must be between 1 and 65535, got {value}")
        return value

    def ports(self, value: object, path: str) -> tuple[int, ...]:
        """A port, a ``"8000-8010"`` range, or a list of either."""
        items = value if isinstance(value, list) else [value]
        ports: list[int] = []
        for index, item in enumerate(items):
            item_path = f"{path}[{index}]" if isinstance(value, list) else path
            if isinstance(item, str) and "-" in item:
                low_text, _, high_text = (part.strip() for part in item.partition("-"))
                if not (low_text.isdigit() and high_text.isdigit()):
                    raise self.fail(item_path, f"port range must look like '8000-8010', got {item!r}")
                low, high = self.port(low_text, item_path), self.port(high_text, item_path)
                if high < low:
                    raise self.fail(item_path, f"port range {item!r} ends before it starts")
                ports.extend(range(low, high + 1))
            else:
                ports.append(self.port(item, item_path))
        return tuple(sorted(set(ports)))

    def string_map(self, value: object, path: str) -> Pairs:
        """A mapping of names to scalars; numbers and booleans become their YAML text."""
        doc = self.mapping(value, path, None)
        pairs: list[tuple[str, str]] = []
        for key, item in doc.items():
            if isinstance(item, bool):
                pairs.append((key, "true" if item else "false"))
            elif isinstance(item, (str, int, float)):
                pairs.append((key, str(item)))
            else:
                raise self.fail(_join(path, key), f"must be a string, got {_kind(item)}")
        return tuple(sorted(pairs))

    def envs(self, value: object, path: str) -> tuple[tuple[str, str | None], ...]:
        """Environment variables: names a shell can export, values as ``string_map`` reads them, or None
        for `X: null`, a value to be given when the task is submitted.

        A name is checked here, not where it is used, because some uses put it into shell text unquoted
        (`export NAME=...` in a boot script): `K$(touch /x)` would run as a command there. A NUL cannot be
        part of any environment variable (the kernel's environment is NUL-separated strings).
        """
        doc = self.mapping(value, path, None)
        for name in doc:
            check_env_name(name, _join(path, name), self.source)
        given = self.string_map({key: item for key, item in doc.items() if item is not None}, path)
        for name, text in given:
            check_env_value(text, _join(path, name), self.source)
        unset = [(key, None) for key, item in doc.items() if item is None]
        return tuple(sorted([*given, *unset], key=lambda pair: pair[0]))

    def secrets(self, value: object, path: str) -> tuple[tuple[str, str | None], ...]:
        """`secrets`: environment variables whose values are kept apart from the task (see ``read_task``)."""
        return self.envs(value, path)

    def enum(self, value: object, path: str, enum_type: type[Any]) -> Any:
        text = self.string(value, path)
        try:
            return enum_type(text.lower())
        except ValueError:
            choices = ", ".join(member.value for member in enum_type)
            raise self.fail(path, f"unknown value {text!r}; expected one of: {choices}") from None

    # --- sections --------------------------------------------------------------------------------
    def task(self, document: object) -> TaskSpec:
        if document is None:
            raise self.fail("", "the file is empty; a task needs at least `run` and `service`")
        doc = self.mapping(document, "", _TOP_KEYS)
        name = self.optional(doc, "name", "", self.string, None)
        if name is not None and not is_valid_task_name(name):
            raise self.fail("name", f"{name!r} is not a valid task name: use letters, digits, '-', '_' and "
                                    "'.', starting with a letter and ending with a letter or digit")
        nodes = self.optional(doc, "num_nodes", "", lambda v, p: self.integer(v, p, 1), 1)
        if nodes != 1:
            raise self.fail("num_nodes", f"{nodes} nodes per replica: multi-node replicas are not supported; "
                                         "each replica is one machine (num_nodes: 1)")
        if doc.get("service") is None:
            raise self.fail("service", "missing; a service needs a `service` section (readiness probe, "
                                       "replicas)")
        if doc.get("run") is None:
            raise self.fail("run", "missing; the command that starts the server listening on $PORT")
        no_candidates: tuple[Resources, tuple[Resources, ...], CandidateOrder] = (
            Resources(), (), CandidateOrder.ANY_OF)
        resources, candidates, order = self.optional(doc, "resources", "", self.resources, no_candidates)
        no_envs: tuple[tuple[str, str | None], ...] = ()
        envs = self.optional(doc, "envs", "", self.envs, no_envs)
        secrets = self.optional(doc, "secrets", "", self.secrets, no_envs)
        for secret, _ in secrets:
            if any(secret == env for env, _ in envs):
                raise self.fail(f"secrets.{secret}", "also given in envs: name a variable in one of the two")
        return TaskSpec(
            name=name,
            resources=resources,
            candidates=candidates,
            candidate_order=order,
            envs=tuple((key, value) for key, value in envs if value is not None),
            unset_envs=tuple(key for key, value in envs if value is None),
            secrets=tuple((key, "") for key, _ in secrets),
            workdir=self.optional(doc, "workdir", "", self.command, None),
            file_mounts=self.optional(doc, "file_mounts", "", self.file_mounts, ()),
            setup=self.optional(doc, "setup", "", self.string, None),
            run=self.command(doc["run"], "run"),
            service=self.service(doc["service"], "service"),
        )

    def file_mounts(self, value: object, path: str) -> Pairs:
        doc = self.mapping(value, path, None)
        pairs = []
        for destination, source in doc.items():
            if isinstance(source, dict):
                raise self.fail(_join(path, destination),
                                "storage mounts (a mapping of source, store, mode or name) are not supported: give "
                                "the source as a path or URL string (./data, s3://bucket/data, gs://bucket/data)")
            if not isinstance(source, str) or not source:
                raise self.fail(_join(path, destination),
                                f"must be a source path or URL string, got {_kind(source)}")
            problem = find_destination_problem(str(destination))
            if problem:
                raise self.fail(_join(path, destination), problem)
            pairs.append((destination, source))
        return tuple(sorted(pairs))

    def resources(self, value: object, path: str) -> tuple[Resources, tuple[Resources, ...], CandidateOrder]:
        """The section, its candidates in full (each `any_of`/`ordered` entry over the section, times the
        accelerators when several are named) and how to try them."""
        doc = self.mapping(value, path, _RESOURCE_KEYS)
        if doc.get("any_of") is not None and doc.get("ordered") is not None:
            raise self.fail(_join(path, "ordered"), "give either any_of or ordered, not both")
        base, base_accelerators, base_ordered = self.candidate(doc, path)
        base = dataclasses.replace(
            base,
            use_spot=self.optional(doc, "use_spot", path, self.boolean, False),
            ports=self.optional(doc, "ports", path, self.ports, ()),
            labels=self.optional(doc, "labels", path, self.labels, ()),
            run_as_root=self.optional(doc, "run_as_root", path, self.boolean, False),
        )
        order_key = "ordered" if doc.get("ordered") is not None else "any_of"
        entries = doc.get(order_key)
        overrides: list[tuple[Resources, tuple[Accelerator, ...]]] = []
        if entries is not None:
            entries_path = _join(path, order_key)
            if not isinstance(entries, list) or not entries:
                raise self.fail(entries_path, "must be a non-empty list of candidate resources")
            for index, entry in enumerate(entries):
                entry_path = f"{entries_path}[{index}]"
                if isinstance(entry, dict) and "use_spot" in entry:
                    raise self.fail(_join(entry_path, "use_spot"), "candidates may not differ in use_spot: for spot "
                                    "with on-demand fallback set resources.use_spot: true and "
                                    "service.replica_policy.dynamic_ondemand_fallback: true")
                entry_doc = self.mapping(entry, entry_path, _CANDIDATE_KEYS)
                merged = {**{k: v for k, v in doc.items() if k in _CANDIDATE_KEYS}, **entry_doc}
                if "infra" in entry_doc or "cloud" in entry_doc:
                    # a candidate's own placement replaces the section's, it does not merge with it
                    for key in ("infra", "cloud", "region", "zone"):
                        if key not in entry_doc:
                            merged.pop(key, None)
                resources, accelerators, _ = self.candidate(merged, entry_path)
                overrides.append((dataclasses.replace(resources, use_spot=base.use_spot, ports=base.ports,
                                                      labels=base.labels, run_as_root=base.run_as_root),
                                  accelerators))
        else:
            overrides.append((base, base_accelerators))
        candidates = tuple(
            dataclasses.replace(resources, accelerator=accelerator) if accelerators else resources
            for resources, accelerators in overrides
            for accelerator in (accelerators or (None,))
        )
        ordered = order_key == "ordered" if entries is not None else base_ordered
        order = CandidateOrder.ORDERED if ordered else CandidateOrder.ANY_OF
        clouds = sorted({c.cloud.value for c in candidates if c.cloud is not None})
        if len(clouds) > 1:
            raise self.fail(_join(path, order_key if entries is not None else "cloud"),
                            f"candidates on more than one cloud ({', '.join(clouds)}): a service's replicas "
                            "run on one cloud; keep the candidates of one")
        if len(candidates) == 1:
            return candidates[0], (), order
        section = dataclasses.replace(base, accelerator=None) if len(base_accelerators) > 1 else base
        return section, candidates, order

    def candidate(self, doc: Mapping[str, Any], path: str) -> tuple[Resources, tuple[Accelerator, ...], bool]:
        """The placement and shape fields of one candidate (or of the section), with its accelerators
        (several: each is a candidate of its own) and whether those are ordered (a list) or not."""
        cloud = self.optional(doc, "cloud", path, self.cloud, None)
        region = self.optional(doc, "region", path, self.string, None)
        zone = self.optional(doc, "zone", path, self.string, None)
        if doc.get("infra") is not None:
            infra_path = _join(path, "infra")
            infra = parse_infra(self.string(doc["infra"], infra_path), infra_path, self.source)
            for key, written, given in (("cloud", cloud, infra.cloud), ("region", region, infra.region),
                                        ("zone", zone, infra.zone)):
                if written is not None and given is not None and written != given:
                    said, wrote = (v.value if isinstance(v, Cloud) else v for v in (given, written))
                    raise self.fail(infra_path, f"says {key} {said!r} but resources.{key} says {wrote!r}: "
                                                "write one of the two")
            cloud, region, zone = cloud or infra.cloud, region or infra.region, zone or infra.zone
        if zone is not None and region is None and cloud is not None:
            region = find_region_of_zone(cloud, zone)  # `zone: us-east-1a` alone: its region is us-east-1
        no_accelerators: tuple[tuple[Accelerator, ...], bool] = ((), False)
        accelerators, ordered = self.optional(doc, "accelerators", path, self.accelerators, no_accelerators)
        resources = Resources(
            cloud=cloud, region=region, zone=zone,
            instance_type=self.optional(doc, "instance_type", path, self.string, None),
            image_id=self.optional(doc, "image_id", path, self.image_id, None),
            disk_size=self.optional(doc, "disk_size", path, lambda v, p: self.integer(v, p, 1), None),
            disk_tier=self.optional(doc, "disk_tier", path, lambda v, p: self.enum(v, p, DiskTier), None),
            cpus=self.optional(doc, "cpus", path, lambda v, p: self.amount(v, p, {"": 1.0}), None),
            memory=self.optional(doc, "memory", path, lambda v, p: self.amount(v, p, _MEMORY_UNITS), None),
            accelerator=accelerators[0] if len(accelerators) == 1 else None,
        )
        return resources, accelerators if len(accelerators) > 1 else (), ordered

    def cloud(self, value: object, path: str) -> Cloud:
        return cloud_named(self.string(value, path), path, self.source)

    def image_id(self, value: object, path: str) -> str:
        if isinstance(value, dict):
            raise self.fail(path, "a mapping of region to image is not supported: name one image (and one "
                                  "region), or one candidate per region under any_of")
        text = self.string(value, path)
        if text.startswith("docker:"):
            raise self.fail(path, f"{text!r}: container images are not supported; replicas boot a machine "
                                  "image (AMI, GCE image) and run `setup`/`run` on it")
        return text

    def amount(self, value: object, path: str, units: Mapping[str, float]) -> Amount:
        """``4``, ``4+``, ``0.5``; for memory also ``8GB``, ``32GB+``, ``1TB`` (GB counted as GiB, as SkyPilot
        does)."""
        if isinstance(value, bool):
            raise self.fail(path, f"must be a number, optionally with '+' (at least), got {_kind(value)}")
        if isinstance(value, (int, float)):
            if not math.isfinite(value) or value <= 0:
                raise self.fail(path, f"must be greater than 0, got {value}")
            return Amount(float(value))
        text = self.string(value, path).strip()
        match = _AMOUNT_RE.fullmatch(text)
        unit = match.group("unit").lower() if match else ""
        if match is None or unit not in units:
            example = "'4' or '4+'" if len(units) == 1 else "'16', '32+', '8GB' or '1TB+'"
            raise self.fail(path, f"must look like {example}, got {text!r}")
        number = float(match.group("value")) * units[unit]
        if number <= 0:
            raise self.fail(path, f"must be greater than 0, got {text!r}")
        return Amount(number, at_least=bool(match.group("plus")))

    def accelerators(self, value: object, path: str) -> tuple[tuple[Accelerator, ...], bool]:
        """``A100``, ``A100:8``, ``{A100: 8}``, ``{L4: 1, A10G: 1}`` and SkyPilot's set form
        ``{L4:8, A10g:8, A100:4}`` (YAML reads each ``NAME:COUNT`` as a key without a value): any of them;
        ``[A100:8, H100:8]``: in that order. With whether they are ordered."""
        if isinstance(value, str):
            return (self.accelerator(value, path),), False
        if isinstance(value, dict):
            items = []
            for key, count in self.mapping(value, path, None).items():
                item_path = _join(path, key)
                if count is None:  # `{L4:8}` or `{L4}`: the key says it all
                    items.append(self.accelerator(key, item_path))
                elif ":" in key:
                    raise self.fail(item_path, f"give the count once: {key!r} already names one, so write "
                                               f"`{key}` without a value, or `{key.partition(':')[0]}: {count}`")
                else:
                    items.append(self.accelerator_count(key, count, item_path))
            if not items:
                raise self.fail(path, "names no accelerator")
            return self.distinct_accelerators(items, path), False
        if isinstance(value, list):
            if not value:
                raise self.fail(path, "names no accelerator")
            return self.distinct_accelerators(
                [self.accelerator(self.string(item, f"{path}[{i}]"), f"{path}[{i}]") for i, item in enumerate(value)],
                path), True
        raise self.fail(path, f"must be NAME:COUNT (A100:8), a mapping or a list of them, got {_kind(value)}")

    def distinct_accelerators(self, items: list[Accelerator], path: str) -> tuple[Accelerator, ...]:
        """``items``, each named once: names are matched without regard to case (``A10g`` is ``A10G``)."""
        seen: set[tuple[str, int]] = set()
        for item in items:
            key = (item.name.lower(), item.count)
            if key in seen:
                self.refuse(path, f"{item.describe()} is named twice")
            seen.add(key)
        return tuple(items)

    def accelerator(self, text: str, path: str) -> Accelerator:
        name, colon, count_text = text.strip().partition(":")
        count: object = 1
        if colon:
            try:
                count = float(count_text) if "." in count_text else int(count_text)
            except ValueError:
                raise self.fail(path, f"must look like NAME:COUNT (A100:8), got {text!r}") from None
        return self.accelerator_count(name.strip(), count, path)

    def accelerator_count(self, name: str, count: object, path: str) -> Accelerator:
        if not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]*", name):
            raise self.fail(path, f"{name!r} is not an accelerator name (A100, L4, H100, A100-80GB)")
        if isinstance(count, float) and not count.is_integer():
            raise self.fail(path, f"fractional accelerators ({name}:{count:g}) are not supported: a replica "
                                  "has whole accelerators")
        if isinstance(count, bool) or not isinstance(count, (int, float)) or count < 1:
            raise self.fail(path, f"the count must be a whole number of at least 1, got {_kind(count)}")
        return Accelerator(name, int(count))

    def labels(self, value: object, path: str) -> Pairs:
        return self.string_map(value, path)

    def service(self, value: object, path: str) -> ServiceSpec:
        doc = self.mapping(value, path, _SERVICE_KEYS)
        if doc.get("replicas") is not None and doc.get("replica_policy") is not None:
            raise self.fail(_join(path, "replicas"), "give either `replicas` or `replica_policy`, not both")
        if doc.get("replicas") is not None:
            count = self.integer(doc["replicas"], _join(path, "replicas"), 1)
            policy = ReplicaPolicy(min_replicas=count, max_replicas=count)
        else:
            policy = self.optional(doc, "replica_policy", path, self.replica_policy, ReplicaPolicy())
        return ServiceSpec(
            readiness_probe=self.optional(doc, "readiness_probe", path, self.probe, ReadinessProbe()),
            replica_policy=policy,
            port=self.optional(doc, "ports", path, self.service_port, None),
            load_balancing_policy=self.optional(
                doc, "load_balancing_policy", path, lambda v, p: self.enum(v, p, LoadBalancingPolicy),
                LoadBalancingPolicy.LEAST_LOAD),
            tls=self.optional(doc, "tls", path, self.tls, None),
            auth=self.optional(doc, "auth", path, self.auth, None),
            rate_limits=self.optional(doc, "rate_limits", path, self.rate_limits, ()),
            canary=self.optional(doc, "canary", path, self.canary, None),
        )

    def canary(self, value: object, path: str) -> CanarySettings:
        """``{steps: [10, 50], bake_seconds, max_error_rate, min_requests, max_extensions}``, each optional."""
        doc = self.mapping(value, path, _CANARY_KEYS)
        defaults = CanarySettings()
        steps = defaults.steps
        if doc.get("steps") is not None:
            raw = doc["steps"]
            if not isinstance(raw, list):
                raise self.fail(_join(path, "steps"), f"must be a list of percentages ([10, 50]), got {_kind(raw)}")
            steps = tuple(self.integer(item, f"{_join(path, 'steps')}[{i}]", 1) for i, item in enumerate(raw))
        settings = CanarySettings(
            steps=steps,
            bake_seconds=self.optional(doc, "bake_seconds", path, lambda v, p: self.number(v, p, positive=True),
                                       defaults.bake_seconds),
            max_error_rate=self.optional(doc, "max_error_rate", path, lambda v, p: self.number(v, p, positive=False),
                                         defaults.max_error_rate),
            min_requests=self.optional(doc, "min_requests", path, lambda v, p: self.integer(v, p, 1),
                                       defaults.min_requests),
            max_extensions=self.optional(doc, "max_extensions", path, lambda v, p: self.integer(v, p, 0),
                                         defaults.max_extensions),
        )
        problem = find_settings_problem(settings)
        if problem is not None:
            field_name, text = problem
            raise self.fail(_join(path, "bake_seconds" if field_name == "bake" else field_name), text)
        return settings

    def auth(self, value: object, path: str) -> ServiceAuth | None:
        """``{api_keys: [NAME, ...]}`` (``type: bearer``, the only type, may be written); dstack's ``auth:
        false`` is no auth. Each name must be a secret of the task (``validate_cross_fields``)."""
        if value is False:
            return None
        if value is True:
            raise self.fail(path, "name the keys the endpoint accepts: auth: {api_keys: [API_KEY]}, each a "
                                  "secret of the task (secrets: {API_KEY: null}, given with --secret API_KEY)")
        doc = self.mapping(value, path, _AUTH_KEYS)
        auth_type = self.optional(doc, "type", path, lambda v, p: self.enum(v, p, AuthType), AuthType.BEARER)
        keys_path = _join(path, "api_keys")
        names = doc.get("api_keys")
        if names is None:
            raise self.fail(keys_path, "missing; name the secrets that hold the keys: api_keys: [API_KEY]")
        if isinstance(names, str):
            raise self.fail(keys_path, f"must be a list of secret names, got {_kind(names)}: write [{names}]")
        if not isinstance(names, list) or not names:
            raise self.fail(keys_path, "must be a non-empty list of secret names (for an open endpoint, leave "
                                       "auth out)")
        seen: set[str] = set()
        for index, name in enumerate(names):
            item_path = f"{keys_path}[{index}]"
            check_env_name(self.string(name, item_path), item_path, self.source)
            if name in seen:
                raise self.fail(item_path, f"{name} is named twice")
            seen.add(name)
        return ServiceAuth(api_keys=tuple((name, "") for name in sorted(seen)), type=auth_type)

    def rate_limits(self, value: object, path: str) -> tuple[RateLimit, ...]:
        """dstack's ``rate_limits``: a list of ``{prefix, rps, burst, key}``, one per prefix."""
        if not isinstance(value, list):
            raise self.fail(path, f"must be a list of limits ({{prefix, rps, burst, key}}), got {_kind(value)}")
        limits: list[RateLimit] = []
        for index, item in enumerate(value):
            limit = self.rate_limit(item, f"{path}[{index}]")
            for other_index, other in enumerate(limits):
                if other.prefix == limit.prefix:
                    raise self.fail(f"{path}[{index}].prefix", f"{limit.prefix!r} is the prefix of "
                                    f"{path}[{other_index}] too: one limit per prefix")
            limits.append(limit)
        return tuple(limits)

    def rate_limit(self, value: object, path: str) -> RateLimit:
        doc = self.mapping(value, path, _RATE_LIMIT_KEYS)
        if doc.get("rps") is None:
            raise self.fail(_join(path, "rps"), "missing; the most requests a second each client may send")
        rps = self.number(doc["rps"], _join(path, "rps"), positive=True)
        if rps < MIN_RPS:
            raise self.fail(_join(path, "rps"), f"must be at least 1/60 (one request a minute), got {rps:g}")
        return RateLimit(
            rps=rps,
            prefix=self.optional(doc, "prefix", path, self.rate_prefix, "/"),
            burst=self.optional(doc, "burst", path, lambda v, p: self.integer(v, p, 0), 0),
            key=self.optional(doc, "key", path, self.rate_key, RateLimitKey()),
        )

    def rate_prefix(self, value: object, path: str) -> str:
        text = self.string(value, path)
        if not text.startswith("/"):
            raise self.fail(path, f"must start with '/', got {text!r}")
        if _PREFIX_FORBIDDEN_RE.search(text) or not text.isprintable():
            raise self.fail(path, f"{text!r} is not a path as the load balancer matches it: no query, spaces, "
                                  "control characters, %-escapes, backslashes, '//', '.' or '..' segments")
        return text

    def rate_key(self, value: object, path: str) -> RateLimitKey:
        """``ip`` (or ``ip_address``), ``header NAME``, or dstack's ``{type: ip_address}`` and ``{type: header,
        header: NAME}``."""
        if isinstance(value, str):
            kind, _, header = value.strip().partition(" ")
            header = header.strip()
            if kind in ("ip", "ip_address") and not header:
                return RateLimitKey()
            if kind == "header" and header:
                return RateLimitKey(RateLimitKeyType.HEADER, self.header_name(header, path))
            raise self.fail(path, f"must be 'ip' or 'header NAME' (or dstack's {{type: ip_address}}, {{type: "
                                  f"header, header: NAME}}), got {value!r}")
        doc = self.mapping(value, path, _RATE_KEY_KEYS)
        if doc.get("type") is None:
            raise self.fail(_join(path, "type"), "missing; ip_address or header")
        kind_path = _join(path, "type")
        kind = RateLimitKeyType.IP_ADDRESS if doc["type"] == "ip" else self.enum(doc["type"], kind_path,
                                                                                  RateLimitKeyType)
        header_path = _join(path, "header")
        if kind is RateLimitKeyType.IP_ADDRESS:
            if doc.get("header") is not None:
                raise self.fail(header_path, "only with type: header")
            return RateLimitKey()
        if doc.get("header") is None:
            raise self.fail(header_path, "missing; the header whose value tells clients apart (X-API-Key)")
        return RateLimitKey(RateLimitKeyType.HEADER, self.header_name(self.string(doc["header"], header_path),
                                                                      header_path))

    def header_name(self, text: str, path: str) -> str:
        if not HEADER_NAME_RE.fullmatch(text):
            raise self.fail(path, f"{text!r} is not a valid HTTP header name")
        return text

    def service_port(self, value: object, path: str) -> int:
        """`service.ports`: one port number, as SkyServe's schema takes it (not a string, not a range)."""
        if isinstance(value, str):
            self.refuse(path, f"must be a port number, got {_kind(value)}: write it without quotes (ports: 8080), "
                              "as SkyServe requires")
        return self.port(value, path)

    def tls(self, value: object, path: str) -> TlsFiles:
        doc = self.mapping(value, path, _TLS_KEYS)
        for key in _TLS_KEYS:
            if doc.get(key) is None:
                raise self.fail(_join(path, key), "missing; service.tls needs both keyfile and certfile")
        return TlsFiles(keyfile=self.command(doc["keyfile"], _join(path, "keyfile")),
                        certfile=self.command(doc["certfile"], _join(path, "certfile")))

    def probe(self, value: object, path: str) -> ReadinessProbe:
        if isinstance(value, str):
            return ReadinessProbe(path=self.probe_path(value, path))
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a path string or a mapping, got {_kind(value)}")
        doc = self.mapping(value, path, _PROBE_KEYS)
        if doc.get("path") is None:
            self.refuse(_join(path, "path"), "missing; a readiness_probe mapping names the path to probe "
                                             f"(path: {DEFAULT_PROBE_PATH}), as SkyServe requires")
        return ReadinessProbe(
            path=self.optional(doc, "path", path, self.probe_path, DEFAULT_PROBE_PATH),
            post_data=self.optional(doc, "post_data", path, self.post_data, None),
            initial_delay_seconds=self.optional(
                doc, "initial_delay_seconds", path, lambda v, p: self.integer(v, p, 0),
                DEFAULT_INITIAL_DELAY_SECONDS),
            timeout_seconds=self.optional(
                doc, "timeout_seconds", path, lambda v, p: self.number(v, p, positive=True),
                float(DEFAULT_PROBE_TIMEOUT_SECONDS)),
            headers=self.optional(doc, "headers", path, self.headers, ()),
        )

    def headers(self, value: object, path: str) -> Pairs:
        """Probe headers: names to string values, as SkyServe's schema takes them (``5`` or ``true`` would be
        sent as text YAML did not write: quote them). A line break in a name or value would end the header
        and start another: refused."""
        doc = self.mapping(value, path, None)
        for key, item in doc.items():
            item_path = _join(path, key)
            if not isinstance(item, str):
                self.refuse(item_path, f"must be a string, got {_kind(item)}: quote it")
            if not HEADER_NAME_RE.fullmatch(key):
                raise self.fail(item_path, "not a valid HTTP header name")
            if isinstance(item, str) and any(char in item for char in "\r\n\0"):
                raise self.fail(item_path, "the value holds a line break or NUL, which no header can carry")
        return self.string_map(doc, path)  # a stored number or boolean as the text it was sent as

    def probe_path(self, value: object, path: str) -> str:
        text = self.string(value, path)
        if not text.startswith("/") and not REFERENCE_RE.match(text):
            raise self.fail(path, f"the probe path must start with '/', got {text!r}")
        return text

    def post_data(self, value: object, path: str) -> str:
        """A mapping/list, or a string holding JSON; kept as canonical JSON text."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise self.fail(path, f"must be valid JSON: {exc.msg} at position {exc.pos}") from exc
        try:
            # NaN and Infinity are not JSON, though Python's json module reads and writes them.
            return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise self.fail(path, f"cannot be sent as JSON: {exc}") from exc

    def replica_policy(self, value: object, path: str) -> ReplicaPolicy:
        doc = self.mapping(value, path, _POLICY_KEYS)

        def count(key: str, minimum: int, default: int) -> int:
            return self.optional(doc, key, path, lambda v, p: self.integer(v, p, minimum), default)

        def seconds(key: str, default: int) -> float:
            return self.optional(doc, key, path, lambda v, p: self.number(v, p, positive=False), float(default))

        if doc.get("min_replicas") is None:
            self.refuse(_join(path, "min_replicas"), "missing; a replica_policy names its min_replicas, as SkyServe "
                                                     "requires (or write `replicas: N` instead)")
        min_replicas = count("min_replicas", 0, 1)
        per_accelerator: tuple[tuple[str, float], ...] = ()
        if isinstance(doc.get("target_qps_per_replica"), dict):
            per_accelerator = self.qps_per_accelerator(doc["target_qps_per_replica"],
                                                       _join(path, "target_qps_per_replica"))
        targets = {
            key: (min(q for _, q in per_accelerator) if key == "target_qps_per_replica" and per_accelerator
                  else self.optional(doc, key, path, lambda v, p: self.number(v, p, positive=True), None))
            for key in ("target_qps_per_replica", "target_ongoing_requests_per_replica")
        }
        given = [key for key, value in targets.items() if value is not None]
        if len(given) > 1:
            raise self.fail(_join(path, given[1]), f"give one target kind per policy, not both {given[0]} and "
                                                   f"{given[1]}")
        target_key = given[0] if given else None
        max_given = doc.get("max_replicas") is not None
        max_replicas = count("max_replicas", 1, max(min_replicas, 1))
        if max_replicas < min_replicas:
            raise self.fail(_join(path, "max_replicas"),
                            f"must be at least min_replicas ({min_replicas}), got {max_replicas}")
        if target_key is not None and not max_given:
            raise self.fail(_join(path, "max_replicas"), f"required when {target_key} is set")
        # Checked before the min/max rule below: `min_replicas: 0` alone defaults max to 1, and "0 and 1
        # differ" would blame a max_replicas the user never wrote.
        if target_key is None and min_replicas == 0:
            raise self.fail(_join(path, "min_replicas"),
                            "0 needs target_qps_per_replica (or target_ongoing_requests_per_replica), "
                            "or the service would never start a replica")
        if target_key is None and max_replicas != min_replicas:
            raise self.fail(_join(path, "target_qps_per_replica"),
                            f"required when min_replicas ({min_replicas}) and max_replicas ({max_replicas}) "
                            "differ: it is what decides between them")
        base_fallback = count("base_ondemand_fallback_replicas", 0, 0)
        dynamic_fallback = self.optional(doc, "dynamic_ondemand_fallback", path, self.boolean, False)
        spot_placer = self.optional(doc, "spot_placer", path, lambda v, p: self.enum(v, p, SpotPlacer), None)
        return ReplicaPolicy(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_qps_per_replica=targets["target_qps_per_replica"],
            target_ongoing_requests_per_replica=targets["target_ongoing_requests_per_replica"],
            upscale_delay_seconds=seconds("upscale_delay_seconds", DEFAULT_UPSCALE_DELAY_SECONDS),
            downscale_delay_seconds=seconds("downscale_delay_seconds", DEFAULT_DOWNSCALE_DELAY_SECONDS),
            base_ondemand_fallback_replicas=base_fallback,
            dynamic_ondemand_fallback=dynamic_fallback,
            num_overprovision=count("num_overprovision", 0, 0),
            qps_per_accelerator=per_accelerator,
            spot_placer=spot_placer,
        )

    def qps_per_accelerator(self, value: object, path: str) -> tuple[tuple[str, float], ...]:
        """``{A100: 5, L4: 2}`` or SkyServe's ``{"A100:1": 5, "L4:1": 2}``: each accelerator's rate, by its
        name (a count in the key says how many a replica has, which its accelerator name already tells)."""
        rates: dict[str, tuple[str, float]] = {}
        for key, item in self.mapping(value, path, None).items():
            item_path = _join(path, key)
            accelerator = self.accelerator(key, item_path)
            if accelerator.name.lower() in rates:
                self.refuse(item_path, f"{accelerator.name} is given a rate twice: one rate per accelerator")
            rates[accelerator.name.lower()] = (accelerator.name, self.number(item, item_path, positive=True))
            self.rate_keys[accelerator.name.lower()] = key
        if not rates:
            raise self.fail(path, "names no accelerator")
        return tuple(sorted(rates.values()))


def validate_cross_fields(spec: TaskSpec, source: str, rate_keys: Mapping[str, str] | None = None, *,
                          strict: bool = True) -> None:
    """Rules that span sections (checked after each section parsed on its own); ``rate_keys`` gives the
    `target_qps_per_replica` keys as written, by accelerator name in lower case; ``strict`` as
    ``parse_document`` says."""
    policy = spec.service.replica_policy
    if policy.qps_per_accelerator:
        named = {c.accelerator.name.lower() for c in spec.resource_candidates if c.accelerator is not None}
        for name, _ in policy.qps_per_accelerator:
            if name.lower() not in named:
                key = (rate_keys or {}).get(name.lower(), name)
                raise SpecError(source, f"service.replica_policy.target_qps_per_replica.{key}",
                                "not an accelerator of resources.accelerators (or any_of/ordered): "
                                + (", ".join(sorted(named)) or "the task names none"))
    instance_aware = spec.service.load_balancing_policy is LoadBalancingPolicy.INSTANCE_AWARE_LEAST_LOAD
    if not strict:  # the two rules below came with SkyServe's readings: stored texts keep their own
        instance_aware = bool(policy.qps_per_accelerator)
    if policy.qps_per_accelerator and not instance_aware:
        raise SpecError(source, "service.load_balancing_policy",
                        "a target_qps_per_replica per accelerator needs load_balancing_policy: "
                        "instance_aware_least_load (it is what sends each replica its share), as SkyServe requires")
    if instance_aware and not policy.qps_per_accelerator:
        raise SpecError(source, "service.replica_policy.target_qps_per_replica",
                        "load_balancing_policy instance_aware_least_load needs a rate per accelerator "
                        "(target_qps_per_replica: {A100: 5, L4: 2}), as SkyServe requires")
    _validate_auth(spec, source)
    uses_fallback = policy.base_ondemand_fallback_replicas > 0 or policy.dynamic_ondemand_fallback
    if (uses_fallback or policy.spot_placer is not None) and not spec.resources.use_spot:
        key = ("spot_placer" if not uses_fallback else "base_ondemand_fallback_replicas"
               if policy.base_ondemand_fallback_replicas > 0 else "dynamic_ondemand_fallback")
        what = "a spot placer" if key == "spot_placer" else "on-demand fallback"
        raise SpecError(source, f"service.replica_policy.{key}", f"{what} needs resources.use_spot: true")


def _validate_auth(spec: TaskSpec, source: str) -> None:
    """Each key of ``service.auth`` is a secret of the task, and the readiness probe names none: the probe
    goes to the replicas directly, not through the load balancer, and the keys never reach a replica."""
    auth = spec.service.auth
    if auth is None:
        return
    secrets = {name for name, _ in spec.secrets}
    for index, (name, _) in enumerate(auth.api_keys):
        if name not in secrets:
            raise SpecError(source, f"service.auth.api_keys[{index}]",
                            f"{name} is not a secret of the task: declare it (secrets: {{{name}: null}}) and give "
                            f"it with --secret {name}")
    probe = spec.service.readiness_probe
    texts = [("path", probe.path), ("post_data", probe.post_data or ""),
             *((f"headers.{name}", f"{name} {value}") for name, value in probe.headers)]
    for field, text in texts:
        for match in REFERENCE_RE.finditer(text):
            name = match.group("braced") or match.group("bare")
            if name in auth.key_names:
                raise SpecError(source, f"service.readiness_probe.{field}",
                                f"refers to {name}, a key of service.auth: the probe goes to the replicas "
                                "directly, not through the load balancer, so it needs no key, and the keys never "
                                "reach a replica; give the replica its own secret if it checks one")


@dataclasses.dataclass(frozen=True)
class Infra:
    """``aws``, ``aws/us-east-1``, ``gcp/us-central1/us-central1-a``: SkyPilot's spelling of cloud/region/zone.
    ``*`` stands for any (``*``, ``*/us-east-1``, ``gcp/*/us-central1-a``): ``cloud`` None lets the submission
    choose among the clouds sky-lite offers, a region None any region (that holds ``zone``)."""

    cloud: Cloud | None
    region: str | None = None
    zone: str | None = None

    def describe(self) -> str:
        parts = [self.cloud.value if self.cloud else "*", self.region or "*", self.zone or "*"]
        while len(parts) > 1 and parts[-1] == "*":
            parts.pop()
        return "/".join(parts)


def parse_infra(text: str, path: str, source: str) -> Infra:
    """Read ``CLOUD[/REGION[/ZONE]]``, each part of which may be ``*`` (any); ``path`` and ``source`` name where
    it was written (a field, or the ``--infra`` option) in the ``SpecError``. A zone without its region
    (``gcp/*/us-central1-a``) gets the region the zone's name says, on a named cloud."""
    parts = [part.strip() for part in text.strip().split("/")]
    if not 1 <= len(parts) <= 3 or not all(parts):
        raise SpecError(source, path, f"must look like CLOUD, CLOUD/REGION or CLOUD/REGION/ZONE (any part may be "
                                      f"*), got {text!r}")
    cloud = None if parts[0] == "*" else cloud_named(parts[0], path, source)
    region = parts[1] if len(parts) > 1 and parts[1] != "*" else None
    zone = parts[2] if len(parts) > 2 and parts[2] != "*" else None
    if cloud is Cloud.LOCAL and (region or zone):
        raise SpecError(source, path, f"{text!r}: the local cloud has no regions or zones")
    if zone is not None and region is not None and not zone.startswith(region):
        raise SpecError(source, path, f"zone {zone!r} is not in region {region!r}")
    if zone is not None and region is None and cloud is not None:
        region = find_region_of_zone(cloud, zone)
        if region is None:
            raise SpecError(source, path, f"{zone!r} is not named like a zone of {cloud.value} (like "
                                          f"{_ZONE_EXAMPLES[cloud]})")
    return Infra(cloud, region, zone)


# A zone's name is its region's and a suffix: AWS `us-east-1a` (and local zones, `us-west-2-lax-1a`), GCP
# `us-central1-a`.
_ZONE_RES = {Cloud.AWS: re.compile(r"(?P<region>[a-z]{2}(-gov)?-[a-z]+-\d+)(-[a-z]+-\d+)?[a-z]"),
             Cloud.GCP: re.compile(r"(?P<region>[a-z]+-[a-z]+\d{1,2})-[a-z]")}
_ZONE_EXAMPLES = {Cloud.AWS: "us-east-1a", Cloud.GCP: "us-central1-a", Cloud.LOCAL: "none"}


def find_region_of_zone(cloud: Cloud, zone: str) -> str | None:
    """The region a zone's name says it is in; None when ``zone`` is not named like a zone of ``cloud``."""
    pattern = _ZONE_RES.get(cloud)
    match = pattern.fullmatch(zone) if pattern else None
    return match.group("region") if match else None


def cloud_named(text: str, path: str, source: str) -> Cloud:
    try:
        return Cloud(text.strip().lower())
    except ValueError:
        offered = ", ".join(cloud.value for cloud in Cloud)
        if text.strip().lower() in _OTHER_CLOUDS:
            raise SpecError(source, path, f"cloud {text!r} is not offered by sky-lite; it runs replicas on: "
                                          f"{offered}") from None
        raise SpecError(source, path, f"unknown cloud {text!r}; expected one of: {offered}") from None


def check_env_name(name: str, path: str, source: str) -> None:
    if _ENV_NAME_RE.fullmatch(name) is None:
        raise SpecError(source, path, "not a valid environment variable name: use letters, digits and _, not "
                                      "starting with a digit")


def check_env_value(text: str, path: str, source: str) -> None:
    if "\0" in text:
        raise SpecError(source, path, "the value holds a NUL character, which no environment variable can "
                                      "carry")


def find_destination_problem(destination: str) -> str | None:
    """Why a ``file_mounts`` destination is refused, or None. Absolute paths and ``~/...`` are allowed (a
    relative one lands below the workdir); a ``..`` component could climb out of where mounts land."""
    if not destination.strip():
        return "the destination path is empty"
    if any(ord(char) < 32 for char in destination):
        return "the destination path holds a control character"
    if ".." in destination.split("/"):
        return "the destination may not contain '..': name the path it should land at"
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
