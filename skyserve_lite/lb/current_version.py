"""What a load balancer derives from its service's current version (its API keys and rate limits, its TLS
key and certificate), derived again only when the current version moves: one row read per refresh
otherwise, whatever the derivation costs (a version read, secrets or blobs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from skyserve_lite.state.models import ServiceRecord, VersionRecord

T = TypeVar("T")


class VersionStore(Protocol):
    """What ``CurrentVersionValue`` reads of the state store (``state.store.Store`` has both)."""

    def find_service(self, name: str) -> ServiceRecord | None: ...

    def get_version(self, name: str, version: int) -> VersionRecord: ...


class CurrentVersionValue(Generic[T]):
    """``derive(version)`` of ``service``'s current version, kept until the current version changes (an
    update, a rollback, a secret rotated with ``serve update --secret`` all make a new one).

    ``read`` returns None once the service is gone (``last`` still holds the last value derived). What
    ``derive`` raises propagates and nothing is kept: the next ``read`` derives again, so a value that
    could not be derived is never served as if it were the version's."""

    def __init__(self, store: VersionStore, service: str, derive: Callable[[VersionRecord], T]) -> None:
        self._store = store
        self._service = service
        self._derive = derive
        self._version: int | None = None
        self._value: T | None = None

    @property
    def last(self) -> T | None:
        return self._value

    def read(self) -> T | None:
        record = self._store.find_service(self._service)
        if record is None:
            return None
        if record.current_version != self._version:
            value = self._derive(self._store.get_version(self._service, record.current_version))
            self._version, self._value = record.current_version, value
        return self._value
