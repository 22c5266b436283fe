"""Parse and validate a task YAML into a ``TaskSpec``.

Every rejection is a ``SpecError`` naming the source, the dotted field path and what is wrong; nothing
here touches state, so a rejected file changes nothing.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.model import (
    DEFAULT_DOWNSCALE_DELAY_SECONDS,
    DEFAULT_INITIAL_DELAY_SECONDS,
    DEFAULT_PROBE_PATH,
    DEFAULT_PROBE_TIMEOUT_SECONDS,
    DEFAULT_UPSCALE_DELAY_SECONDS,
    Cloud,
    LoadBalancingPolicy,
    Pairs,
    ReadinessProbe,
    ReplicaPolicy,
    Resources,
    ServiceSpec,
    SubmittedTask,
    TaskSpec,
)

_T = TypeVar("_T")

# DNS-1123 label: what a hostname part, a Kubernetes name and a cloud tag accept alike.
_NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
# What `export NAME=...` accepts as NAME: a name is written into boot scripts as is, only values are quoted.
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_TOP_KEYS = ("name", "resources", "envs", "workdir", "file_mounts", "setup", "run", "service")
_RESOURCE_KEYS = (
    "cloud", "region", "zone", "instance_type", "image_id", "use_spot", "disk_size", "ports", "labels",
)
_SERVICE_KEYS = ("readiness_probe", "replicas", "replica_policy", "ports", "load_balancing_policy")
_PROBE_KEYS = ("path", "post_data", "initial_delay_seconds", "timeout_seconds", "headers")
_POLICY_KEYS = (
    "min_replicas", "max_replicas", "target_qps_per_replica", "target_ongoing_requests_per_replica",
    "upscale_delay_seconds",
    "downscale_delay_seconds", "base_ondemand_fallback_replicas", "dynamic_ondemand_fallback",
)


class _StrictLoader(yaml.SafeLoader):
    """A ``SafeLoader`` that rejects a key given twice in one mapping.

    Plain YAML keeps the last value, so a second ``run:`` further down a file would silently replace the
    first; here it is an error with the line of the repeated key.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` may be overridden by keys written out; that is its purpose
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key is reported by the base class
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def is_valid_service_name(name: str) -> bool:
    """A DNS-style label: lowercase letters, digits and '-', starting with a letter, at most 63 chars."""
    # fullmatch, not match with "$": "$" also matches before a trailing newline ("svc\n").
    return _NAME_RE.fullmatch(name) is not None


def load_task_file(path: Path) -> SubmittedTask:
    """Read and parse a task file; an unreadable file is a ``SpecError`` on the file itself."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), "", f"cannot read the file: {exc}") from exc
    return SubmittedTask(text=text, source=str(path), spec=parse_task(text, source=str(path)))


def parse_task(text: str, source: str = "<string>") -> TaskSpec:
    """Parse task YAML text. Pure: raises ``SpecError`` on the first problem found."""
    try:
        document = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(source, "", f"invalid YAML{where}: {problem}") from exc
    spec = _Parser(source).task(document)
    validate_cross_fields(spec, source)
    return spec


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> SpecError:
        return SpecError(self.source, path, problem)

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

    def envs(self, value: object, path: str) -> Pairs:
        """Environment variables: names a shell can export, values as ``string_map`` reads them.

        A name is checked here, not where it is used, because some uses put it into shell text unquoted
        (`export NAME=...` in a boot script): `K$(touch /x)` would run as a command there. A NUL cannot be
        part of any environment variable (the kernel's environment is NUL-separated strings).
        """
        for name in self.mapping(value, path, None):
            if _ENV_NAME_RE.fullmatch(name) is None:
                raise self.fail(_join(path, name), "not a valid environment variable name: use letters, digits "
                                                   "and _, not starting with a digit")
        pairs = self.string_map(value, path)
        for name, text in pairs:
            if "\0" in text:
                raise self.fail(_join(path, name), "the value holds a NUL character, which no environment "
                                                   "variable can carry")
        return pairs

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
        if name is not None and not is_valid_service_name(name):
            raise self.fail("name", f"{name!r} is not a valid name: use lowercase letters, digits and '-', "
                                    "starting with a letter, at most 63 characters")
        if doc.get("service") is None:
            raise self.fail("service", "missing; a service needs a `service` section (readiness probe, "
                                       "replicas)")
        if doc.get("run") is None:
            raise self.fail("run", "missing; the command that starts the server listening on $PORT")
        return TaskSpec(
            name=name,
            resources=self.optional(doc, "resources", "", self.resources, Resources()),
            envs=self.optional(doc, "envs", "", self.envs, ()),
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
            if not isinstance(source, str) or not source:
                raise self.fail(_join(path, destination),
                                f"must be a source path or URL string, got {_kind(source)}")
            problem = find_destination_problem(str(destination))
            if problem:
                raise self.fail(_join(path, destination), problem)
            pairs.append((destination, source))
        return tuple(sorted(pairs))

    def resources(self, value: object, path: str) -> Resources:
        doc = self.mapping(value, path, _RESOURCE_KEYS)
        return Resources(
            cloud=self.optional(doc, "cloud", path, lambda v, p: self.enum(v, p, Cloud), Cloud.LOCAL),
            region=self.optional(doc, "region", path, self.string, None),
            zone=self.optional(doc, "zone", path, self.string, None),
            instance_type=self.optional(doc, "instance_type", path, self.string, None),
            image_id=self.optional(doc, "image_id", path, self.string, None),
            use_spot=self.optional(doc, "use_spot", path, self.boolean, False),
            disk_size=self.optional(doc, "disk_size", path, lambda v, p: self.integer(v, p, 1), None),
            ports=self.optional(doc, "ports", path, self.ports, ()),
            labels=self.optional(doc, "labels", path, self.string_map, ()),
        )

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
            port=self.optional(doc, "ports", path, self.port, None),
            load_balancing_policy=self.optional(
                doc, "load_balancing_policy", path, lambda v, p: self.enum(v, p, LoadBalancingPolicy),
                LoadBalancingPolicy.LEAST_LOAD),
        )

    def probe(self, value: object, path: str) -> ReadinessProbe:
        if isinstance(value, str):
            return ReadinessProbe(path=self.probe_path(value, path))
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a path string or a mapping, got {_kind(value)}")
        doc = self.mapping(value, path, _PROBE_KEYS)
        return ReadinessProbe(
            path=self.optional(doc, "path", path, self.probe_path, DEFAULT_PROBE_PATH),
            post_data=self.optional(doc, "post_data", path, self.post_data, None),
            initial_delay_seconds=self.optional(
                doc, "initial_delay_seconds", path, lambda v, p: self.integer(v, p, 0),
                DEFAULT_INITIAL_DELAY_SECONDS),
            timeout_seconds=self.optional(
                doc, "timeout_seconds", path, lambda v, p: self.number(v, p, positive=True),
                float(DEFAULT_PROBE_TIMEOUT_SECONDS)),
            headers=self.optional(doc, "headers", path, self.string_map, ()),
        )

    def probe_path(self, value: object, path: str) -> str:
        text = self.string(value, path)
        if not text.startswith("/"):
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

        min_replicas = count("min_replicas", 0, 1)
        targets = {
            key: self.optional(doc, key, path, lambda v, p: self.number(v, p, positive=True), None)
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
        return ReplicaPolicy(
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_qps_per_replica=targets["target_qps_per_replica"],
            target_ongoing_requests_per_replica=targets["target_ongoing_requests_per_replica"],
            upscale_delay_seconds=count("upscale_delay_seconds", 0, DEFAULT_UPSCALE_DELAY_SECONDS),
            downscale_delay_seconds=count("downscale_delay_seconds", 0, DEFAULT_DOWNSCALE_DELAY_SECONDS),
            base_ondemand_fallback_replicas=base_fallback,
            dynamic_ondemand_fallback=dynamic_fallback,
        )


def validate_cross_fields(spec: TaskSpec, source: str) -> None:
    """Rules that span sections (checked after each section parsed on its own)."""
    policy = spec.service.replica_policy
    uses_fallback = policy.base_ondemand_fallback_replicas > 0 or policy.dynamic_ondemand_fallback
    if uses_fallback and not spec.resources.use_spot:
        key = ("base_ondemand_fallback_replicas" if policy.base_ondemand_fallback_replicas > 0
               else "dynamic_ondemand_fallback")
        raise SpecError(source, f"service.replica_policy.{key}",
                        "on-demand fallback needs resources.use_spot: true")


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
