"""The one definition of "the same replica config".

A replica's config is the whole task except the ``service`` section (probe, policy and load balancing
can change under a running replica) and ``name``. Update, rollback and status all ask this module, so
they cannot disagree about whether a replica can be kept.

The secrets ``service.auth`` names are keys of the load balancer, not variables of a replica: they are no
part of the replica config, and a rotated key is a service change (``service.auth.api_keys.NAME: changed``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from skyserve_lite.files.manifest import Manifest, compare_manifests
from skyserve_lite.spec.model import Resources, TaskSpec

ConfigValue = str | int | float | bool | None


@dataclass(frozen=True)
class FieldChange:
    """One reason a replica cannot be reused: a field path with its old and new value.

    ``note`` explains changes that are not in the value itself: what the snapshots of ``workdir`` or a
    ``file_mounts`` source show (``contents changed (2 files: app.py, +new.py)``), or why they count as a
    change although identical.
    """

    path: str
    old: ConfigValue
    new: ConfigValue
    note: str | None = None

    def describe(self) -> str:
        old, new = self.old, self.new
        if old == new and self.note:
            # the value did not change (or is not shown: a secret's); what is behind it did
            return f"{self.path}: {self.note}"
        if isinstance(old, str) and isinstance(new, str) and ("\n" in old or "\n" in new):
            # Scripts: show the first line that differs, not two equal-looking prefixes.
            number, old, new = _first_different_line(old, new)
            text = f"{self.path} line {number}: {_show(old)} -> {_show(new)}"
        else:
            text = f"{self.path}: {_show(old)} -> {_show(new)}"
        return f"{text} ({self.note})" if self.note else text


def _first_different_line(old: str, new: str) -> tuple[int, str | None, str | None]:
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for number in range(1, max(len(old_lines), len(new_lines)) + 1):
        before = old_lines[number - 1].strip() if number <= len(old_lines) else None
        after = new_lines[number - 1].strip() if number <= len(new_lines) else None
        if before != after:
            return number, before, after
    return 1, old, new  # differ only in trailing whitespace


def compute_replica_config(spec: TaskSpec) -> dict[str, ConfigValue]:
    """Flatten the replica-relevant part of a task into ``{field path: value}``.

    Unset optional fields are absent, so adding ``region: null`` to a file changes nothing.
    """
    res = spec.resources
    flat: dict[str, ConfigValue] = {
        "resources.cloud": spec.cloud.value,
        **(_candidate_fields(res) if not spec.candidates else {
            # A replica may have landed on any candidate: the set is its config, whichever it took.
            "resources.candidates": f"{spec.candidate_order.value}("
                                    + "; ".join(describe_candidate(c) for c in spec.candidates) + ")"}),
        "resources.use_spot": res.use_spot,
        "resources.ports": ",".join(str(port) for port in res.ports) or None,
        # Only when asked: the configs (and fingerprints) of tasks that never name it stay as they were.
        "resources.run_as_root": True if res.run_as_root else None,
        "setup": spec.setup,
        "run": spec.run,
        "workdir": spec.workdir,
        # The port the workload listens on is part of how a replica is built, although it sits in `service`.
        "service.ports": spec.service.port,
    }
    flat.update({f"resources.labels.{key}": value for key, value in res.labels})
    flat.update({f"envs.{key}": value for key, value in spec.envs})
    # A secret's digest (never its value): a changed value replaces replicas, shown as "changed". The keys
    # of `service.auth` are not here (``bind`` moves them out of `secrets`; an unbound spec still lists them).
    auth_keys = spec.service.auth.key_names if spec.service.auth is not None else frozenset()
    flat.update({f"{SECRETS_PREFIX}{key}": digest or None for key, digest in spec.secrets if key not in auth_keys})
    flat.update({f"file_mounts.{dst}": src for dst, src in spec.file_mounts})
    return {key: value for key, value in flat.items() if value is not None}


SECRETS_PREFIX = "secrets."
API_KEYS_PREFIX = "service.auth.api_keys."
# Paths whose values are digests of secrets: a change is shown as added, changed or removed, never a digest.
_SECRET_PREFIXES = (SECRETS_PREFIX, API_KEYS_PREFIX)


def _candidate_fields(res: Resources) -> dict[str, ConfigValue]:
    return {
        "resources.region": res.region,
        "resources.zone": res.zone,
        "resources.instance_type": res.instance_type,
        "resources.cpus": res.cpus.describe() if res.cpus else None,
        "resources.memory": res.memory.describe() if res.memory else None,
        "resources.accelerators": res.accelerator.describe() if res.accelerator else None,
        "resources.image_id": res.image_id,
        "resources.disk_size": res.disk_size,
        "resources.disk_tier": res.disk_tier.value if res.disk_tier else None,
    }


def describe_candidate(res: Resources) -> str:
    """One candidate in one line, its fields as written: ``region=us-east-1 accelerators=A100:8``."""
    fields = {key.removeprefix("resources."): value for key, value in _candidate_fields(res).items()
              if value is not None}
    return " ".join(f"{key}={value}" for key, value in fields.items()) or "default"


def compute_config_fingerprint(spec: TaskSpec) -> str:
    """A short stable hash of ``compute_replica_config``; equal configs give equal fingerprints.

    The hash sees the paths of ``workdir`` and ``file_mounts``, not the files behind them: two tasks with
    equal fingerprints may still need new replicas. Decide reuse with ``is_same_replica_config``.
    """
    canonical = json.dumps(compute_replica_config(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def find_config_changes(old: TaskSpec, new: TaskSpec, *, reuse_identical_files: bool = False
                        ) -> tuple[FieldChange, ...]:
    """Why a replica built from ``old`` cannot serve as one built from ``new``; empty means reusable.

    Pure. Besides the differing fields, a non-empty ``workdir`` or ``file_mounts`` in either task forces a
    change by default, and the change says what its snapshots show: ``workdir: contents changed (3 files:
    app.py, lib/x.py, +new.py)`` or ``workdir: contents identical (sha256 9f2c1a0b...)``. With
    ``reuse_identical_files`` identical snapshots are no change, so a replica whose whole config, file
    digests included, is equal is reused.
    """
    changes = [_hide_secret(change) for change in _diff(compute_replica_config(old), compute_replica_config(new))]
    changed_paths = {change.path for change in changes}
    if (old.workdir or new.workdir) and "workdir" not in changed_paths:
        change = _files_change("workdir", old.workdir, _workdir_manifest(old), _workdir_manifest(new),
                               reuse_identical_files)
        if change:
            changes.append(change)
    old_mounts, new_mounts = dict(old.file_mounts), dict(new.file_mounts)
    for destination in sorted(old_mounts.keys() & new_mounts.keys()):
        path = f"file_mounts.{destination}"
        if path in changed_paths:
            continue  # the source itself changed: already named with both values
        change = _files_change(path, old_mounts[destination], _mount_manifest(old, destination),
                               _mount_manifest(new, destination), reuse_identical_files)
        if change:
            changes.append(change)
    return tuple(sorted(changes, key=lambda c: c.path))


def _hide_secret(change: FieldChange) -> FieldChange:
    """A secret's change without its digests: ``secrets.HF_TOKEN: changed`` (or added, removed)."""
    if not change.path.startswith(_SECRET_PREFIXES):
        return change
    what = "added" if change.old is None else "removed" if change.new is None else "changed"
    return FieldChange(change.path, None, None, note=what)


def is_same_replica_config(old: TaskSpec, new: TaskSpec, *, reuse_identical_files: bool = False) -> bool:
    return not find_config_changes(old, new, reuse_identical_files=reuse_identical_files)


def _workdir_manifest(spec: TaskSpec) -> Manifest | None:
    return spec.files.workdir if spec.files is not None else None


def _mount_manifest(spec: TaskSpec, destination: str) -> Manifest | None:
    return spec.files.mount.get(destination) if spec.files is not None else None


def _files_change(path: str, source: str | None, old: Manifest | None, new: Manifest | None,
                  reuse_identical: bool) -> FieldChange | None:
    """The change for files at the same source path in both versions, from their snapshots."""
    if old is None or new is None:
        what = "a cloud URI" if source and "://" in source else "no snapshot of them was taken"
        return FieldChange(path, source, source, note=f"contents cannot be compared ({what})")
    if old.digest == new.digest:
        if reuse_identical:
            return None
        return FieldChange(path, source, source, note=f"contents identical (sha256 {old.digest[:8]}...), "
                                                      "replaced by default: --reuse-identical-files keeps it")
    return FieldChange(path, source, source, note=f"contents changed ({compare_manifests(old, new).describe()})")


def compute_service_settings(spec: TaskSpec) -> dict[str, ConfigValue]:
    """Flatten the ``service`` section (minus ``ports``, which belongs to the replica config).

    These settings change under running replicas; they never force a replacement.
    """
    probe, policy = spec.service.readiness_probe, spec.service.replica_policy
    flat: dict[str, ConfigValue] = {
        "service.readiness_probe.path": probe.path,
        "service.readiness_probe.post_data": probe.post_data,
        "service.readiness_probe.initial_delay_seconds": probe.initial_delay_seconds,
        "service.readiness_probe.timeout_seconds": probe.timeout_seconds,
        "service.replica_policy.min_replicas": policy.min_replicas,
        "service.replica_policy.max_replicas": policy.max_replicas,
        "service.replica_policy.target_qps_per_replica": policy.target_qps_per_replica,
        "service.replica_policy.target_ongoing_requests_per_replica": policy.target_ongoing_requests_per_replica,
        "service.replica_policy.upscale_delay_seconds": policy.upscale_delay_seconds,
        "service.replica_policy.downscale_delay_seconds": policy.downscale_delay_seconds,
        "service.replica_policy.base_ondemand_fallback_replicas": policy.base_ondemand_fallback_replicas,
        "service.replica_policy.dynamic_ondemand_fallback": policy.dynamic_ondemand_fallback,
        "service.replica_policy.num_overprovision": policy.num_overprovision or None,
        "service.replica_policy.spot_placer": policy.spot_placer.value if policy.spot_placer else None,
        "service.load_balancing_policy": spec.service.load_balancing_policy.value,
        "service.tls.keyfile": spec.service.tls.keyfile if spec.service.tls else None,
        "service.tls.certfile": spec.service.tls.certfile if spec.service.tls else None,
        "service.auth.type": spec.service.auth.type.value if spec.service.auth else None,
    }
    if not policy.is_autoscaling and policy.min_replicas == policy.max_replicas:
        # A fixed count is what `replicas: N` says: shown so (`service.replicas: 2 -> 3`), not as two bounds.
        del flat["service.replica_policy.min_replicas"], flat["service.replica_policy.max_replicas"]
        flat["service.replicas"] = policy.min_replicas
    if policy.qps_per_accelerator:
        del flat["service.replica_policy.target_qps_per_replica"]
        flat.update({f"service.replica_policy.target_qps_per_replica.{name}": qps
                     for name, qps in policy.qps_per_accelerator})
    flat.update({f"service.readiness_probe.headers.{k}": v for k, v in probe.headers})
    # Each key by its digest, which ``find_service_changes`` never shows: a rotated key reads "changed". A key
    # not bound yet ("") is there too, so that adding one to an unbound spec is a change.
    flat.update({f"{API_KEYS_PREFIX}{name}": digest or "unbound"
                 for name, digest in (spec.service.auth.api_keys if spec.service.auth else ())})
    for limit in spec.service.rate_limits:  # by prefix, which is unique: reordering the list changes nothing
        flat.update({f"service.rate_limits.{limit.prefix}.rps": limit.rps,
                     f"service.rate_limits.{limit.prefix}.burst": limit.burst,
                     f"service.rate_limits.{limit.prefix}.key": limit.key.describe()})
    return {key: value for key, value in flat.items() if value is not None}


def find_service_changes(old: TaskSpec, new: TaskSpec) -> tuple[FieldChange, ...]:
    """What changed in the ``service`` section; informational (history), never a reason to replace. A key of
    ``service.auth`` shows as added, changed or removed, never with its digest."""
    return tuple(_hide_secret(change) for change in _diff(compute_service_settings(old), compute_service_settings(new)))


def _diff(old_flat: dict[str, ConfigValue], new_flat: dict[str, ConfigValue]) -> tuple[FieldChange, ...]:
    return tuple(
        FieldChange(path, old_flat.get(path), new_flat.get(path))
        for path in sorted(old_flat.keys() | new_flat.keys())
        if old_flat.get(path) != new_flat.get(path)
    )


def _show(value: ConfigValue) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value)
    if len(text) > 60:
        text = text[:57] + "..."
    # Quoted when multi-line (a `run` script: newlines show as \n) or cut short (the quote marks the cut).
    return repr(text) if "\n" in text or text != str(value) else text
