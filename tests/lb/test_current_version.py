"""CurrentVersionValue: derived once per current version, nothing kept from a failed derivation, None once
the service is gone with the last value still at hand (what the TLS and API-key sources rely on)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import pytest

from skyserve_lite.lb.current_version import CurrentVersionValue
from skyserve_lite.state.models import ServiceRecord, VersionRecord


@dataclass
class FakeVersions:
    """A store holding one service's current version number (None: the service is gone); records every
    version read."""

    current: int | None = 1
    version_reads: list[int] = field(default_factory=list)

    def find_service(self, name: str) -> ServiceRecord | None:
        return None if self.current is None else cast(ServiceRecord, _Service(self.current))

    def get_version(self, name: str, version: int) -> VersionRecord:
        self.version_reads.append(version)
        return cast(VersionRecord, _Version(version))


@dataclass(frozen=True)
class _Service:
    current_version: int


@dataclass(frozen=True)
class _Version:
    version: int


def test_a_version_is_derived_once_until_the_current_version_moves() -> None:
    store = FakeVersions()
    value = CurrentVersionValue(store, "svc", lambda record: f"v{record.version}")

    assert [value.read(), value.read(), value.read()] == ["v1", "v1", "v1"]
    store.current = 2
    assert [value.read(), value.read()] == ["v2", "v2"]
    assert store.version_reads == [1, 2]


def test_a_failed_derivation_is_not_kept_and_is_tried_again() -> None:
    store = FakeVersions()
    failures = [RuntimeError("secret unreadable")]

    def derive(record: VersionRecord) -> str:
        if failures:
            raise failures.pop()
        return f"v{record.version}"

    value = CurrentVersionValue(store, "svc", derive)
    with pytest.raises(RuntimeError, match="secret unreadable"):
        value.read()
    assert value.last is None
    assert value.read() == "v1"
    assert store.version_reads == [1, 1]


def test_a_service_gone_reads_none_and_keeps_the_last_value() -> None:
    store = FakeVersions()
    value = CurrentVersionValue(store, "svc", lambda record: f"v{record.version}")
    assert value.read() == "v1"

    store.current = None

    assert value.read() is None
    assert value.last == "v1"
