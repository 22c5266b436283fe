"""Idempotency keys: a retried submission finds what its first attempt stored and stores nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.errors import StateConflictError
from skyserve_lite.state.store import Store
from tests.state.test_store import TEXT, task

TWO = TEXT.replace("echo hi", "echo two")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path)


def test_a_retried_update_stores_one_version(store: Store) -> None:
    store.create_service("svc", task(), 30001, now=1.0)
    first = store.add_version("svc", task(TWO), "rolling", now=2.0, key="k" * 16)
    again = store.add_version("svc", task(TWO), "rolling", now=3.0, key="k" * 16)
    assert again == first
    assert [v.version for v in store.list_versions("svc")] == [1, 2]
    assert store.find_submission("k" * 16) == ("svc", 2)


def test_a_retry_does_not_trip_its_own_expect_version(store: Store) -> None:
    store.create_service("svc", task(), 30001, now=1.0)
    store.add_version("svc", task(TWO), "rolling", now=2.0, expect_version=1, key="retry-key")
    # The first attempt moved the service to version 2; its retry still expects 1 and must not conflict.
    again = store.add_version("svc", task(TWO), "rolling", now=3.0, expect_version=1, key="retry-key")
    assert again.version == 2


def test_a_retried_create_returns_the_service_instead_of_a_conflict(store: Store) -> None:
    created = store.create_service("svc", task(), 30001, now=1.0, key="create-key")
    assert store.create_service("svc", task(), 30002, now=2.0, key="create-key") == created
    with pytest.raises(StateConflictError, match="already exists"):
        store.create_service("svc", task(), 30002, now=2.0, key="another-key")


def test_a_key_of_another_service_is_not_taken_for_a_retry(store: Store) -> None:
    store.create_service("a", task(), 30001, now=1.0)
    store.create_service("b", task(), 30002, now=1.0)
    store.add_version("a", task(TWO), "rolling", now=2.0, key="key-of-a")
    assert store.add_version("b", task(TWO), "rolling", now=2.0, key="key-of-a").version == 2
    assert [v.version for v in store.list_versions("b")] == [1, 2]


def test_a_deleted_service_takes_its_keys_with_it(store: Store) -> None:
    store.create_service("a", task(), 30001, now=1.0)
    store.create_service("b", task(), 30002, now=1.0)
    store.add_version("a", task(TWO), "rolling", now=2.0, key="key-of-a")
    store.add_version("b", task(TWO), "rolling", now=2.0, key="key-of-b")
    store.delete_service("b")
    assert store.find_submission("key-of-b") is None
    assert store.find_submission("key-of-a") == ("a", 2)
