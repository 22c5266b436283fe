"""The fake provider records the calls that only read or clean up, like every other call."""

from __future__ import annotations

from pathlib import Path

from skyserve_lite.providers.base import ReplicaLog
from skyserve_lite.providers.fake import Call, FakeProvider


def test_read_log_returns_the_scripted_log_and_is_recorded() -> None:
    fake = FakeProvider()
    fake.logs[("svc", 1)] = ReplicaLog(path=Path("/logs/1.log"))
    assert fake.read_log("svc", 1, "fake-1", None) == ReplicaLog(path=Path("/logs/1.log"))
    assert fake.read_log("svc", 2, None, "r1") is None
    assert fake.calls == [Call("read_log", ("svc", 1, "fake-1", None)), Call("read_log", ("svc", 2, None, "r1"))]


def test_abandon_is_recorded_and_leaves_the_instances() -> None:
    fake = FakeProvider()
    fake.abandon()
    fake.abandon()
    assert fake.calls_to("abandon") == [Call("abandon"), Call("abandon")]
