"""Where the load balancer gets what ``lb.guard`` decides with: its service's current version's rate limits,
and the values of its ``service.auth`` keys from the secret store of the home, by the digests the version
names (as the controller's prober reads a probe's secrets).

- ``read_guard_config`` is the pure part: a ``ServiceSpec`` and a ``read_secret(digest) -> value`` in, a
  ``GuardConfig`` out, each value hashed at once (``ApiKeys``) and checked as ``serve up`` checks it;
- ``StoreGuardSource`` is the thin reader: the store for the version, ``SecretStore`` for the values. It
  reads the version and the values again only when the service's current version changes.

Nothing here logs or shows a key: errors name the secret and the version, never a value or a digest. When
the keys cannot be read the caller must not serve the endpoint open: at start it should exit with the reason
(the controller starts it again), later keep the keys it has, as it keeps its TLS certificate. Wired into
the load balancer's process, on the thread its store calls run on::

    source = StoreGuardSource.of_home(store, service, home)
    guard = Guard(source.read())          # StateConflictError: exit 1 with its message
    ...                                   # then on each refresh of the targets:
    try:
        config = source.read()            # one row read while the version stays the same
    except StateConflictError as exc:     # log once; the message holds no key
        ...                               # and keep deciding with the config the guard has
    else:
        if config is not None:
            guard.configure(config)       # keeps the buckets when the limits did not change
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from skyserve_lite.errors import StateConflictError
from skyserve_lite.lb.current_version import CurrentVersionValue, VersionStore
from skyserve_lite.lb.guard import ApiKeys, GuardConfig
from skyserve_lite.spec.inputs import find_api_key_problem
from skyserve_lite.spec.model import ServiceSpec

if TYPE_CHECKING:
    from skyserve_lite.state.models import VersionRecord

SecretReader = Callable[[str], str]


def read_guard_config(service: ServiceSpec, read_secret: SecretReader, where: str) -> GuardConfig:
    """The limits and keys of ``service`` (a bound spec: its keys name digests), the values read with
    ``read_secret``. ``where`` names the version in errors (``service svc version 3``).

    Raises ``StateConflictError`` naming the key when it has no digest (a spec that was never bound), when
    ``read_secret`` raises it (the secret store does when a value is missing) or ``OSError`` (a file it cannot
    read), or when a value could not be sent as a bearer token; the message never holds a value."""
    if service.auth is None:
        return GuardConfig(rate_limits=service.rate_limits)
    values = []
    for name, digest in service.auth.api_keys:
        if not digest:
            raise StateConflictError(f"{where}: the key {name} of service.auth has no value: submit the version "
                                     f"again with --secret {name}")
        try:
            value = read_secret(digest)
        except StateConflictError as exc:  # the secret store's message holds a digest's first bytes, no value
            raise StateConflictError(f"{where}: the key {name} of service.auth cannot be read: {exc}") from exc
        except (OSError, UnicodeDecodeError) as exc:  # str(exc) of a decoding error quotes a byte of the value
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise StateConflictError(f"{where}: the key {name} of service.auth cannot be read from the secret "
                                     f"store ({reason}); give it again with `sky-lite serve update --secret "
                                     f"{name}`") from None
        problem = find_api_key_problem(value)
        if problem is not None:
            raise StateConflictError(f"{where}: the key {name} of service.auth {problem}; give another with "
                                     f"`sky-lite serve update --secret {name}`")
        values.append((name, value))
    return GuardConfig(keys=ApiKeys.from_values(values), rate_limits=service.rate_limits)


class StoreGuardSource:
    """The current version's ``GuardConfig``, read from the store and the home's secret store.

    ``read`` costs one row read while the current version stays the same (``CurrentVersionValue``); a new
    current version (an update, a rollback, a key rotated with ``serve update --secret``) is read whole, its
    keys from the secret store. None once the service is gone. Raises ``StateConflictError`` as
    ``read_guard_config`` does, and again on each call until the version changes or the value can be read.
    """

    def __init__(self, store: VersionStore, service: str, read_secret: SecretReader) -> None:
        self._service = service
        self._read_secret = read_secret
        self._current = CurrentVersionValue(store, service, self._derive)

    @classmethod
    def of_home(cls, store: VersionStore, service: str, home: Path) -> StoreGuardSource:
        """A source reading values from the secret store of ``home`` (``$SKY_LITE_HOME/secrets``)."""
        from skyserve_lite.state.secrets import SecretStore

        secrets = SecretStore(home)
        return cls(store, service, secrets.read_value)

    def read(self) -> GuardConfig | None:
        return self._current.read()

    def _derive(self, version: VersionRecord) -> GuardConfig:
        where = f"service {self._service} version {version.version}"
        service = version.service_spec  # the stored parsed form: no YAML parsed for the limits alone
        if service.auth is not None:
            service = version.spec.service  # bound from the version's inputs: the keys' digests for sure
        return read_guard_config(service, self._read_secret, where)
