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
from skyserve_lite.spec.model import (
    Cloud,
    Pairs,
    ReadinessProbe,
    Resources,
    Secret,
    SubmittedTask,
    TaskInputs,
    TaskSpec,
    TlsFiles,
)
from skyserve_lite.spec.parse import (
    HEADER_NAME_RE,
    REFERENCE_RE,
    Infra,
    check_env_name,
    check_env_value,
    find_destination_problem,
    find_region_of_zone,
    parse_infra,
)
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
    # Stored by a sky-lite whose cloud replicas run `setup` and `run` as the user sky unless the task says
    # `run_as_root: true`. False for a version stored before: its replicas ran them as root, and still do
    # (``with_legacy_user``), so an upgrade does not take root from a workload that relies on it.
    runs_as_user: bool = False

    def to_json(self) -> str:
        doc: dict[str, Any] = {"infra": self.infra, "envs": dict(self.envs), "secrets": dict(self.secrets)}
        if self.resolution is not None:
            doc["resolution"] = self.resolution.to_json()
        if self.runs_as_user:
            doc["runs_as_user"] = True
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> BoundInputs:
        if not text:
            return cls()
        doc = json.loads(text)
        resolution = doc.get("resolution")
        return cls(infra=doc.get("infra"), envs=tuple(sorted(doc.get("envs", {}).items())),
                   secrets=tuple(sorted(doc.get("secrets", {}).items())),
                   resolution=Resolution.from_json(resolution) if resolution is not None else None,
                   runs_as_user=bool(doc.get("runs_as_user", False)))


def bind(spec: TaskSpec, bound: BoundInputs, source: str, *, fill_mounts: bool = True,
         strict: bool = True) -> TaskSpec:
    """``spec`` with ``bound`` applied: the infra on every candidate that names no cloud (and the region and
    zone where the candidate names none), env values over the file's, secrets by digest, and ``$NAME``
    references filled in (``fill_references``; not with ``fill_mounts`` False: a version stored before they
    were, whose snapshot names the paths as written). Raises ``SpecError`` when the infra contradicts the
    file or a filled field is refused; ``strict`` False (a stored version read again, as
    ``parse.parse_document`` says) passes over the rules added since versions were first stored."""
    if bound.infra:
        spec = place_task(spec, parse_infra(bound.infra, "--infra", source), source, strict=strict)
    envs = dict(spec.envs)
    envs.update(bound.envs)
    digests = dict(spec.secrets)
    digests.update(bound.secrets)
    auth = spec.service.auth
    if auth is not None:  # a spec bound before: its keys' digests are in the section, not in `secrets`
        digests = {**{name: digest for name, digest in auth.api_keys if digest}, **digests}
    for name in digests:
        if name in envs:
            raise SpecError(source, f"secrets.{name}", "also given in envs: name a variable in one of the two")
    spec = dataclasses.replace(
        spec, envs=tuple(sorted(envs.items())), unset_envs=tuple(n for n in spec.unset_envs if n not in envs),
        secrets=tuple(sorted(digests.items())), resolution=bound.resolution or spec.resolution)
    return bind_auth_keys(fill_references(spec, source, strict=strict) if fill_mounts else spec)


def with_legacy_user(spec: TaskSpec, bound: BoundInputs) -> TaskSpec:
    """``spec`` of a stored version as its replicas ran: a version stored before replicas ran as the user
    sky (``BoundInputs.runs_as_user`` False) runs them as root on a cloud, as it always did."""
    if bound.runs_as_user or spec.cloud is Cloud.LOCAL:
        return spec
    return dataclasses.replace(spec, resources=dataclasses.replace(spec.resources, run_as_root=True),
                               candidates=tuple(dataclasses.replace(c, run_as_root=True) for c in spec.candidates))


def bind_auth_keys(spec: TaskSpec) -> TaskSpec:
    """``spec`` with the secrets ``service.auth`` names moved from ``secrets`` into ``service.auth.api_keys``,
    digests and all: they are the load balancer's keys, so no replica gets them as a variable, and the replica
    config (``spec.config``), which sees ``secrets``, does not change when one is rotated. Idempotent."""
    auth = spec.service.auth
    if auth is None:
        return spec
    digests = {**dict(auth.api_keys), **dict(spec.secrets)}
    keys = tuple((name, digests.get(name, "")) for name in sorted(auth.key_names))
    service = dataclasses.replace(spec.service, auth=dataclasses.replace(auth, api_keys=keys))
    return dataclasses.replace(spec, service=service,
                               secrets=tuple(pair for pair in spec.secrets if pair[0] not in auth.key_names))


def fill_references(spec: TaskSpec, source: str, *, strict: bool = True) -> TaskSpec:
    """``spec`` with ``$NAME`` and ``${NAME}`` filled in where SkyPilot fills them: `workdir`, `file_mounts`
    (destinations and sources), `service.tls` and the readiness probe's `path`, `post_data` (its strings)
    and `headers`.

    - an env's value is filled in;
    - a secret's is filled into the probe's headers and ``post_data`` only, and only when the probe is sent
      (the prober reads it from the secret store by the digest ``ReadinessProbe.secrets`` names): the probe
      keeps ``$NAME``, so no value is stored, logged or shown. A secret named in a path (the probe's
      included: a request line is what access logs repeat) is refused;
    - any other name is left as written (``find_unfilled_references`` says where).

    Raises ``SpecError`` naming the field when a filled value is refused; without ``strict`` (a stored
    version) a secret named in a path is left as written, as it was before secrets were filled in."""
    envs = dict(spec.envs)
    secrets = dict(spec.secrets)

    def fill(text: str, path: str, *, allow_secrets: bool = False) -> str:
        def replace(match: re.Match[str]) -> str:
            name = match.group("braced") or match.group("bare")
            if name in secrets and not allow_secrets:
                if not strict:
                    return match.group(0)
                raise SpecError(source, path, f"refers to the secret {name}: a secret is not filled into paths, "
                                              "which are stored, shown and logged; give the value in envs "
                                              "instead, or send the secret in a probe header")
            return envs.get(name, match.group(0))
        return REFERENCE_RE.sub(replace, text)

    workdir = fill(spec.workdir, "workdir") if spec.workdir is not None else None
    tls = spec.service.tls
    if tls is not None:
        tls = TlsFiles(keyfile=fill(tls.keyfile, "service.tls.keyfile"),
                       certfile=fill(tls.certfile, "service.tls.certfile"))
    probe = _fill_probe(spec.service.readiness_probe, fill, secrets, source)
    service = dataclasses.replace(spec.service, tls=tls, readiness_probe=probe)
    return dataclasses.replace(spec, workdir=workdir, service=service,
                               file_mounts=fill_file_mounts(spec.file_mounts, fill, source))


_PROBE = "service.readiness_probe"


def _fill_probe(probe: ReadinessProbe, fill: Callable[..., str], secrets: Mapping[str, str],
                source: str) -> ReadinessProbe:
    """The probe with envs filled in, and the digests of the secrets it still refers to."""
    # Not a secret in the path: a request line is what access logs and error messages repeat.
    path = fill(probe.path, f"{_PROBE}.path")
    if not path.startswith("/"):
        raise SpecError(source, f"{_PROBE}.path", f"the probe path must start with '/', got {path!r} once envs "
                                                  "are filled in")
    headers: dict[str, str] = {}
    for name, value in probe.headers:
        field = f"{_PROBE}.headers.{name}"
        filled_name, filled_value = fill(name, field), fill(value, field, allow_secrets=True)
        if any(char in filled_value for char in "\r\n\0") or not HEADER_NAME_RE.fullmatch(filled_name):
            raise SpecError(source, field, "once envs are filled in, the header is no longer valid (a line break "
                                           "or NUL in its value, or a name HTTP does not allow)")
        headers[filled_name] = filled_value
    post_data = probe.post_data
    if post_data is not None:
        post_data = json.dumps(fill_json_strings(json.loads(post_data), lambda text: fill(
            text, f"{_PROBE}.post_data", allow_secrets=True)), sort_keys=True, separators=(",", ":"))
    texts = [path, post_data or "", *(item for pair in headers.items() for item in pair)]
    named = {m.group("braced") or m.group("bare") for text in texts for m in REFERENCE_RE.finditer(text)}
    return dataclasses.replace(probe, path=path, post_data=post_data, headers=tuple(sorted(headers.items())),
                               secrets=tuple(sorted((n, d) for n, d in secrets.items() if n in named)))


def fill_json_strings(value: Any, fill: Callable[[str], str]) -> Any:
    """A JSON value with ``fill`` applied to every string in it, keys included (a filled value stays one
    string, whatever it holds: quotes in it cannot change the document's shape)."""
    if isinstance(value, str):
        return fill(value)
    if isinstance(value, list):
        return [fill_json_strings(item, fill) for item in value]
    if isinstance(value, dict):
        return {fill(key): fill_json_strings(item, fill) for key, item in value.items()}
    return value


def merge_envs(spec: TaskSpec, inherited: Pairs, given: Pairs) -> dict[str, str]:
    """The env values a submission binds over the file's own: those given now, over the previous version's
    (``inherited``) for the names the file declares without a value. A variable only ever given on the
    command line must be given again."""
    envs = {name: value for name, value in inherited if name in spec.unset_envs}
    envs.update(given)
    return envs


def fill_paths(task: SubmittedTask, inherited: Pairs = ()) -> TaskSpec:
    """``task``'s spec with envs filled in as the controller fills them when it binds the task (the file's,
    and ``merge_envs`` of ``inherited``, the current version's, and those given now): the paths a client
    reads its files from before sending it."""
    envs = {**dict(task.spec.envs), **merge_envs(task.spec, inherited, task.inputs.envs)}
    return fill_references(dataclasses.replace(task.spec, envs=tuple(sorted(envs.items()))), task.source)


def find_unfilled_references(spec: TaskSpec) -> list[str]:
    """Where a bound ``spec`` still refers to a name that is neither an env nor a secret: such a reference is
    kept as written (as SkyPilot does), which is rarely what was meant. One line each, for plans."""
    known = {name for name, _ in spec.envs} | {name for name, _ in spec.secrets}
    known |= spec.service.auth.key_names if spec.service.auth is not None else frozenset()
    probe, tls = spec.service.readiness_probe, spec.service.tls
    fields = [("workdir", spec.workdir or ""), (f"{_PROBE}.path", probe.path),
              (f"{_PROBE}.post_data", probe.post_data or ""),
              *((f"{_PROBE}.headers.{name}", f"{name} {value}") for name, value in probe.headers),
              *((f"file_mounts.{dst}", f"{dst} {src}") for dst, src in spec.file_mounts),
              *((f"service.tls.{key}", getattr(tls, key)) for key in ("keyfile", "certfile") if tls)]
    notes = []
    for field, text in fields:
        for match in REFERENCE_RE.finditer(text):
            name = match.group("braced") or match.group("bare")
            if name not in known:
                notes.append(f"{field}: {match.group(0)} is neither in envs nor in secrets, so it is used as "
                             "written")
    return notes


def fill_file_mounts(mounts: Pairs, fill: Callable[..., str], source: str) -> Pairs:
    """``file_mounts`` with ``fill`` (``fill_references``'s) applied to destinations and sources. Raises
    ``SpecError`` when a filled destination is refused or two become one."""
    filled: dict[str, str] = {}
    for destination, mount_source in mounts:
        field = f"file_mounts.{destination}"
        target = fill(destination, field)
        problem = find_destination_problem(target) if target != destination else None
        if problem is not None:
            raise SpecError(source, field, f"{problem} (after filling in envs: {target!r})")
        if target in filled:
            raise SpecError(source, field, f"becomes {target!r} once envs are filled in, the destination of "
                                           "another mount")
        filled[target] = fill(mount_source, field)
    return tuple(sorted(filled.items()))


def place_task(spec: TaskSpec, infra: Infra, source: str, *, strict: bool = True) -> TaskSpec:
    """``spec`` with ``infra`` (``--infra``, or the cloud chosen for it) on every candidate: its cloud where
    the candidate names none, and its region and zone where the candidate names none. Raises ``SpecError``
    when the two contradict each other. An infra of any cloud (``*``) places nothing."""
    if infra.cloud is None:
        return spec
    cloud = infra.cloud
    return dataclasses.replace(
        spec, resources=_place(spec.resources, cloud, infra.region, infra.zone, source, strict),
        candidates=tuple(_place(c, cloud, infra.region, infra.zone, source, strict) for c in spec.candidates))


def _place(resources: Resources, cloud: Cloud, region: str | None, zone: str | None, source: str,
           strict: bool = True) -> Resources:
    if resources.cloud is not None and resources.cloud is not cloud:
        raise SpecError(source, "resources.cloud", f"the task runs on {resources.cloud.value}, but --infra says "
                                                   f"{cloud.value}: change one of the two")
    if resources.cloud is not None and resources.region is not None and region not in (None, resources.region):
        raise SpecError(source, "resources.region", f"the task names region {resources.region}, but --infra "
                                                    f"says {region}: change one of the two")
    placed_zone = resources.zone or (zone if not resources.region or resources.region == region else None)
    # `infra: */*/us-central1-a` placed on gcp: the zone's name says its region
    zone_region = find_region_of_zone(cloud, placed_zone) if placed_zone and cloud is not Cloud.LOCAL else None
    # Both rules below came with zone wildcards: a stored version keeps the placement it had.
    if strict and placed_zone and cloud is not Cloud.LOCAL and not (resources.region or region or zone_region):
        raise SpecError(source, "resources.zone", f"{placed_zone!r} is not named like a zone of {cloud.value}")
    if strict and cloud is Cloud.LOCAL and (resources.region or resources.zone):
        raise SpecError(source, "resources.region" if resources.region else "resources.zone",
                        "the local cloud has no regions or zones: name a cloud with --infra or resources.infra")
    return dataclasses.replace(resources, cloud=cloud, region=resources.region or region or zone_region,
                               zone=placed_zone)


def find_missing(spec: TaskSpec, source: str) -> SpecError | None:
    """The first env or secret the task leaves to the submitter and nobody gave, as the error to raise."""
    if spec.unset_envs:
        name = spec.unset_envs[0]
        return SpecError(source, f"envs.{name}", "has no value in the file: " + _GIVE_ENV.format(name=name))
    keys = spec.service.auth.api_keys if spec.service.auth is not None else ()
    for name, digest in sorted((*spec.secrets, *keys)):
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
    keys = task.spec.service.auth.key_names if task.spec.service.auth is not None else frozenset()
    for name, secret in sorted(merged_secrets.items()):
        problem = find_api_key_problem(secret.value) if name in keys else None
        if problem is not None:  # the value itself is never shown
            raise UsageError(f"--secret {name}: a key of service.auth {problem}")
    inputs = TaskInputs(infra=infra, default_infra=default_infra, envs=tuple(sorted(merged_envs.items())),
                        secrets=tuple(sorted(merged_secrets.items())))
    return dataclasses.replace(task, inputs=inputs)


# A key short enough to guess is no key: 16 characters of hex are 64 bits (`openssl rand -hex 32` gives 64).
MIN_API_KEY_LENGTH = 16


def find_api_key_problem(value: str) -> str | None:
    """Why ``value`` cannot be a key of ``service.auth``, or None; the reason never repeats the value.

    A client sends the key as ``Authorization: Bearer KEY``: visible ASCII only (no space, which would end
    the token, nor anything a header may not carry), at least ``MIN_API_KEY_LENGTH`` characters."""
    if len(value) < MIN_API_KEY_LENGTH:
        return f"must be at least {MIN_API_KEY_LENGTH} characters: `openssl rand -hex 32` makes a good one"
    if not all("!" <= char <= "~" for char in value):
        return "may hold visible ASCII characters only (no spaces, line breaks or accented letters): a client " \
               "sends it in a header"
    return None


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
