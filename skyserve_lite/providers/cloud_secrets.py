"""A task's secrets in the cloud's secret store, the same way on every cloud (the twin of ``staging``).

A cloud replica reads each secret of its task at boot, with the instance's own identity, from the cloud's
secret store (AWS Secrets Manager, GCP Secret Manager): the boot script names the secrets and never holds a
value, so neither EC2 user data nor GCE metadata carries one.

Each value is one secret per controller and service, named ``sky-lite_<controller id>_<service>_<digest>``
(``compute_secret_name``). The digest is the one the version stores (``TaskSpec.secrets``): an HMAC under a
random key of the controller's home, which says nothing about the value to whoever lacks that key, not even
by guessing. So equal values of a service share a secret, a changed value is a new secret, and a name is
never the value. ``_`` separates the parts because neither a controller id (12 hex digits) nor a service name
(a DNS label) holds one: ``sky-lite_<id>_web_`` starts the names of service ``web`` and of no other, and
``sky-lite_<id>_`` those of one controller (the prefix its replicas' identity is granted).

A prefix ends up in IAM policies (an AWS resource ARN, where ``*`` and ``?`` are wildcards) and in GCP IAM
conditions (a CEL string literal), so ``compute_secret_prefix`` refuses a part holding anything but letters,
digits and ``-``: a controller id ``*`` would otherwise make ``sky-lite_*_`` (every controller's secrets).
Where a controller id comes from a controller VM (which could be compromised), ``check_controller_id`` holds it
to the exact form a store makes.

A version is forgotten only with its service (the store deletes versions with the service and never
before), so the secrets some version of a service names are all of that service's secrets until the service
goes: ``release_service`` deletes them then (`serve down`; the controller retries it until it succeeds,
before forgetting the service), as it deletes the service's bucket.

A cloud gives a ``SecretBackend``: its secret store's calls, translated to ``ProviderError`` by its provider.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from skyserve_lite.providers.base import LaunchRequest
from skyserve_lite.spec.model import Pairs, Secret

SECRET_PREFIX = "sky-lite_"
# What ``Store`` makes once per state directory (``uuid4().hex[:12]``) and no other form: 48 random bits.
CONTROLLER_ID = re.compile(r"[0-9a-f]{12}")
# What a prefix may hold at all: no wildcard of an IAM policy (``*``, ``?``), no ``_`` (the separator), no quote.
_NAME_PART = re.compile(r"[A-Za-z0-9-]{1,64}")


def check_controller_id(controller_id: str) -> str:
    """``controller_id`` if it has the form a store makes (``CONTROLLER_ID``: 12 lowercase hex digits). Raises
    ``ValueError`` otherwise: what a controller's permissions are scoped to must never be a pattern."""
    if not CONTROLLER_ID.fullmatch(controller_id):
        raise ValueError(f"controller id {controller_id[:40]!r} is not one a sky-lite store makes (12 lowercase "
                         "hex digits)")
    return controller_id


def compute_secret_prefix(controller_id: str, service: str | None = None) -> str:
    """What the name of every secret of ``controller_id`` (of its ``service``, when given) starts with. Raises
    ``ValueError`` for a part holding anything but letters, digits and ``-`` (or longer than 64 characters)."""
    for what, part in (("controller id", controller_id), ("service", service)):
        if part is not None and not _NAME_PART.fullmatch(part):
            raise ValueError(f"{what} {part[:40]!r}: a secret's name takes only letters, digits and '-'")
    return f"{SECRET_PREFIX}{controller_id}_" + (f"{service}_" if service is not None else "")


def compute_secret_name(controller_id: str, service: str, digest: str) -> str:
    """The secret store's name for one value of ``service``: at most 9 + 64 + 1 + 63 + 1 + 32 = 170 characters
    of ``[A-Za-z0-9_-]``, which both clouds accept (AWS: 512, GCP: 255)."""
    return compute_secret_prefix(controller_id, service) + digest


@dataclass(frozen=True)
class CloudSecret:
    """One secret of a launch: the variable it fills, its name in the store, and the value to store."""

    variable: str
    name: str
    value: Secret


def find_cloud_secrets(controller_id: str, request: LaunchRequest) -> tuple[CloudSecret, ...]:
    """The secrets of ``request`` as the store names them, in the task's order. Raises ``ValueError`` naming
    the field when the version names no digest for a value (it cannot be stored under a name then)."""
    digests = dict(request.spec.secrets)
    secrets = []
    for variable, value in request.secrets:
        digest = digests.get(variable)
        if not digest:
            raise ValueError(f"secrets.{variable}: version {request.version} names no digest for its value: "
                             "submit it again with --secret")
        secrets.append(CloudSecret(variable, compute_secret_name(controller_id, request.service, digest), value))
    return tuple(secrets)


class SecretBackend(Protocol):
    """A cloud's secret store. Every method raises only ``ProviderError``."""

    def put(self, name: str, value: Secret, service: str, region: str) -> str:
        """Make the secret ``name`` hold ``value``, readable by the replicas' identity, unless it exists (a
        name is per value: an existing one holds it already); return the reference the boot script reads it
        by. Idempotent."""
        ...

    def list_names(self, service: str, region: str) -> Iterable[str]:
        """The names of every secret of this controller's ``service`` in ``region``, all pages."""
        ...

    def delete(self, name: str, region: str) -> None:
        """Delete the secret now, with no recovery window (its value stays in the controller's store while a
        version names it); a missing secret is fine."""
        ...


class SecretKeeper:
    """Writes a launch's secrets before its instances boot, and deletes a service's when it goes. It
    remembers what it wrote, so only the first launch of a value in a region costs calls; a restarted
    controller writes again, which finds the secret there (``put`` is idempotent)."""

    def __init__(self, backend: SecretBackend, controller_id: str) -> None:
        self._backend = backend
        self._controller_id = controller_id
        self._references: dict[tuple[str, str], str] = {}  # (region, name) -> reference

    def ensure(self, service: str, region: str, secrets: Sequence[CloudSecret]) -> Pairs:
        """Each of ``secrets`` in ``region``'s store; (variable, reference) for the boot script. Raises
        ``ProviderError``."""
        references = []
        for secret in secrets:
            key = (region, secret.name)
            if key not in self._references:
                self._references[key] = self._backend.put(secret.name, secret.value, service, region)
            references.append((secret.variable, self._references[key]))
        return tuple(references)

    def release(self, service: str, regions: Collection[str]) -> None:
        """Delete every secret of ``service`` in ``regions`` and in every region this keeper wrote one to, and
        forget them. Idempotent; raises ``ProviderError`` when one is left (the caller asks again)."""
        prefix = compute_secret_prefix(self._controller_id, service)
        for region in sorted(set(regions) | {region for region, _ in self._references}):
            # Only names of this service: a backend's filter may match more (AWS's is a case-blind prefix).
            for name in [n for n in self._backend.list_names(service, region) if n.startswith(prefix)]:
                self._backend.delete(name, region)
                self._references.pop((region, name), None)
            for key in [k for k in self._references if k[0] == region and k[1].startswith(prefix)]:
                del self._references[key]
