"""A pass records that it completed (at most every 5 s); a pass that cannot write its state does not, so
`serve status` can tell that what the store says has not been checked since."""

from __future__ import annotations

import sqlite3

import pytest

from skyserve_lite.controller.executor import HEARTBEAT_SECONDS
from skyserve_lite.providers.base import InstanceState

from .conftest import Harness


def test_completed_passes_record_a_heartbeat_at_most_every_few_seconds(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.tick()
    first = harness.store.last_pass_at
    assert first == harness.clock.now()
    harness.tick(1)
    assert harness.store.last_pass_at == first  # no write per pass
    harness.tick(HEARTBEAT_SECONDS)
    assert harness.store.last_pass_at == harness.clock.now()


def test_a_pass_that_cannot_write_leaves_the_heartbeat_old(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    harness.create(replicas=1)
    harness.tick()
    before = harness.store.last_pass_at

    def disk_full(*_args: object, **_kwargs: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(harness.store, "put_replicas", disk_full)
    (replica,) = harness.replicas()
    assert replica.instance_id is not None
    harness.provider.set_state(replica.instance_id, InstanceState.EXITED)  # the pass has something to write
    with pytest.raises(sqlite3.OperationalError):
        harness.tick(HEARTBEAT_SECONDS + 1)
    assert harness.store.last_pass_at == before
