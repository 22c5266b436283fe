"""What a submission adds to a task's YAML: where it runs (``--infra``), the values of ``envs: {X: null}`` and
of secrets.

Two shapes of the same thing:

- ``TaskInputs`` (``spec.model``) travels from the user to the controller with the values, secrets included;
- ``BoundInputs`` is what a version stores beside its text: the chosen infra, env values, and each secret's
  digest only (the value lives in the secret store, ``state.secrets``).

``bind`` applies ``BoundInputs`` to a parsed task; every reader of a version's spec goes through it, so the
spec a replica is launched from is the spec the plan showed. Pure, but for ``read_env_file``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyserve_lite.errors import SpecError, UsageError
from skyserve_lite.spec.model import Cloud, Pairs, Resources, Secret, SubmittedTask, TaskInputs, TaskSpec
from skyserve_lite.spec.parse import check_env_name, check_env_value, find_destination_problem, parse_infra
from skyserve_lite.spec.placement import Resolution

_GIVE_ENV = "give it when submitting: --env {name}=VALUE, --env {name} (from your environment) or --env-file FILE"
_GIVE_SECRET = "give it when submitting: --secret {name}=VALUE or --secret {name} (from your environment)"


@dataclass(frozen=True)
class BoundInputs:
    """A version's inputs as stored: nothing secret (a secret is its digest)."""

    infra: str | None = None
    envs: Pairs = ()
    secrets: Pairs = ()  # (name, digest)
    resolution: Resolution | None = None  # the placements resolved at submission

    def to_json(self) -> str:
        doc: dict[str, Any] = {"infra": self.infra, "envs": dict(self.envs), "secrets": dict(self.secrets)}
        if self.resolution is not None:
            doc["resolution"] = self.resolution.to_json()
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> BoundInputs:
        if not text:
            return cls()
        doc = json.loads(text)
        resolution = doc.get("resolution")
        return cls(infra=doc.get("infra"), envs=tuple(sorted(doc.get("envs", {}).items())),
                   secrets=tuple(sorted(doc.get("secrets", {}).items())),
                   resolution=Resolution.from_json(resolution) if resolution is not None else None)


def bind(spec: TaskSpec, bound: BoundInputs, source: str, *, fill_mounts: bool = True) -> TaskSpec:
    """``spec`` with ``bound`` applied: the infra on every candidate that names no cloud (and the region and
    zone where the candidate names none), env values over the file's, secrets by digest, envs filled into
    ``file_mounts`` (not with ``fill_mounts`` False: a version stored before they were, whose snapshot
    names the mounts as written). Raises ``SpecError`` when the infra contradicts the file."""
    if bound.infra:
        infra = parse_infra(bound.infra, "--infra", source)
        spec = dataclasses.replace(
            spec, resources=_place(spec.resources, infra.cloud, infra.region, infra.zone, source),
            candidates=tuple(_place(c, infra.cloud, infra.region, infra.zone, source) for c in spec.candidates))
    envs = dict(spec.envs)
    envs.update(bound.envs)
    digests = dict(spec.secrets)
    digests.update(bound.secrets)
    for name in digests:
        if name in envs:
            raise SpecError(source, f"secrets.{name}", "also given in envs: name a variable in one of the two")
    return dataclasses.replace(
        spec, envs=tuple(sorted(envs.items())), unset_envs=tuple(n for n in spec.unset_envs if n not in envs),
        secrets=tuple(sorted(digests.items())), resolution=bound.resolution or spec.resolution,
        file_mounts=fill_file_mounts(spec.file_mounts, envs, source) if fill_mounts else spec.file_mounts)


_REFERENCE_RE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


def fill_file_mounts(mounts: Pairs, envs: Mapping[str, str], source: str) -> Pairs:
    """``file_mounts`` with ``$NAME`` and ``${NAME}`` of ``envs`` replaced in destinations and sources, as
    SkyPilot fills them (secrets are not filled: they are for `setup` and `run` only). A reference to a name
    ``envs`` lacks is left as written. Raises ``SpecError`` when a filled destination is refused or two
    become one."""
    def fill(text: str) -> str:
        return _REFERENCE_RE.sub(lambda m: envs.get(m.group("braced") or m.group("bare"), m.group(0)), text)

    filled: dict[str, str] = {}
    for destination, mount_source in mounts:
        target = fill(destination)
        problem = find_destination_problem(target) if target != destination else None
        if problem is not None:
            raise SpecError(source, f"file_mounts.{destination}", f"{problem} (after filling in envs: {target!r})")
        if target in filled:
            raise SpecError(source, f"file_mounts.{destination}", f"becomes {target!r} once envs are filled in, "
                                                                 "the destination of another mount")
        filled[target] = fill(mount_source)
    return tuple(sorted(filled.items()))


def _place(resources: Resources, cloud: Cloud, region: str | None, zone: str | None, source: str) -> Resources:
    if resources.cloud is not None and resources.cloud is not cloud:
        raise SpecError(source, "resources.cloud", f"the task runs on {resources.cloud.value}, but --infra says "
                                                   f"{cloud.value}: change one of the two")
    if resources.cloud is not None and resources.region is not None and region not in (None, resources.region):
        raise SpecError(source, "resources.region", f"the task names region {resources.region}, but --infra "
                                                    f"says {region}: change one of the two")
    return dataclasses.replace(resources, cloud=cloud, region=resources.region or region,
                               zone=resources.zone or (zone if not resources.region or resources.region == region
                                                       else None))


def find_missing(spec: TaskSpec, source: str) -> SpecError | None:
    """The first env or secret the task leaves to the submitter and nobody gave, as the error to raise."""
    if spec.unset_envs:
        name = spec.unset_envs[0]
        return SpecError(source, f"envs.{name}", "has no value in the file: " + _GIVE_ENV.format(name=name))
    for name, digest in spec.secrets:
        if not digest:
            return SpecError(source, f"secrets.{name}", "has no value: " + _GIVE_SECRET.format(name=name))
    return None


def check_given(task: SubmittedTask) -> None:
    """Before sending a task: every `envs: {X: null}` and every secret has a value (from the file, the
    command line or, on an update, the previous version is checked by the controller)."""
    given_envs = {name for name, _ in task.inputs.envs}
    given_secrets = {name for name, _ in task.inputs.secrets}
    for name in task.spec.unset_envs:
        if name not in given_envs:
            raise SpecError(task.source, f"envs.{name}", "has no value in the file: " + _GIVE_ENV.format(name=name))
    for name, _ in task.spec.secrets:
        if name not in given_secrets:
            raise SpecError(task.source, f"secrets.{name}", "has no value: " + _GIVE_SECRET.format(name=name))


def with_inputs(task: SubmittedTask, envs: Pairs, secrets: Sequence[tuple[str, Secret]], infra: str | None,
                default_infra: str | None = None) -> SubmittedTask:
    """``task`` with the command line's inputs over the file's own (a secret written in the file, say)."""
    merged_secrets = dict(task.inputs.secrets)
    merged_secrets.update(secrets)
    merged_envs = dict(task.inputs.envs)
    merged_envs.update(envs)
    for name in merged_secrets:
        if any(name == env for env, _ in task.spec.envs):
            raise UsageError(f"--secret {name}: the task's envs name {name} too; name a variable in one of the two")
    inputs = TaskInputs(infra=infra, default_infra=default_infra, envs=tuple(sorted(merged_envs.items())),
                        secrets=tuple(sorted(merged_secrets.items())))
    return dataclasses.replace(task, inputs=inputs)


def read_assignments(option: str, items: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """``--env X=v`` and ``--env X`` (X from ``environ``) into a mapping; ``option`` names the flag in errors."""
    values: dict[str, str] = {}
    for item in items:
        name, equals, value = item.partition("=")
        _check_name(option, name)
        if not equals:
            if name not in environ:
                raise UsageError(f"{option} {name}: {name} is not set in this environment; give {option} "
                                 f"{name}=VALUE")
            value = environ[name]
        _check_value(option, name, value)
        values[name] = value
    return values


def read_env_file(path: Path) -> dict[str, str]:
    """A dotenv file: ``NAME=VALUE`` lines, ``#`` comments and blank lines, optional ``export``, and values in
    single or double quotes as a shell reads them."""
    option = f"--env-file {path}"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{option}: cannot read the file: {exc}") from exc
    values: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        text = text.removeprefix("export ").strip()
        name, equals, raw = text.partition("=")
        if not equals:  # the line is not shown: it may be a value
            raise UsageError(f"{option}: line {number}: expected NAME=VALUE")
        _check_name(f"{option}: line {number}:", name)
        value = _read_value(raw.strip(), f"{option}: line {number}")
        _check_value(option, name, value)
        values[name] = value
    return values


def _read_value(raw: str, where: str) -> str:
    """A dotenv value as a shell reads it: quotes removed, ``#`` a comment only where it starts a word
    outside quotes (``A=abc#1`` is ``abc#1``, ``A=abc #1`` is ``abc``)."""
    quote: str | None = None
    for index, char in enumerate(raw):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or raw[index - 1].isspace()):
            raw = raw[:index]
            break
    try:
        return " ".join(shlex.split(raw, posix=True))
    except ValueError as exc:  # an unclosed quote; the value itself is not shown
        raise UsageError(f"{where}: {exc}") from None


def _check_name(option: str, name: str) -> None:
    # Only the name is shown, never the item: `--secret NAME=VALUE` holds a secret.
    _as_usage_error(lambda: check_env_name(name, name, option), f"{option} {name!r}: not a valid environment "
                    "variable name: use letters, digits and _, not starting with a digit")


def _check_value(option: str, name: str, value: str) -> None:
    _as_usage_error(lambda: check_env_value(value, name, option),
                    f"{option} {name}: the value holds a NUL character, which no environment variable can carry")


def _as_usage_error(check: Callable[[], None], message: str) -> None:
    """Run the parser's own ``check`` of a value given on the command line; its ``SpecError`` becomes a
    ``UsageError`` naming the option instead of a field."""
    try:
        check()
    except SpecError:
        raise UsageError(message) from None
