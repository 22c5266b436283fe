"""What a load balancer records once it listens (``lb_endpoints``), and an endpoint port chosen inside the
transaction that stores the service; on both engines."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import skyserve_lite.state.store as store_module
from skyserve_lite.errors import NotFoundError, UsageError
from skyserve_lite.lb.__main__ import _record_endpoint
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import LbEndpoint
from skyserve_lite.state.store import Store

TEXT = "service: {replicas: 1}\nrun: python serve.py\n"


def _task() -> SubmittedTask:
    return SubmittedTask(text=TEXT, source="/t/svc.yaml", spec=parse_task(TEXT))


def test_a_load_balancer_records_its_address_replaces_it_and_deletes_only_its_own(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    try:
        store.create_service("web", _task(), 30001, 0.0)
        store.record_lb_endpoint(LbEndpoint("web", "host-a", "127.0.0.1:30001", 100, 1.0))
        store.record_lb_endpoint(LbEndpoint("web", "host-b", "127.0.0.2:30001", 200, 2.0))
        assert [e.host for e in store.list_lb_endpoints("web")] == ["host-a", "host-b"]
        # A load balancer of host-a that moved (another port, another pid) replaces host-a's row.
        moved = LbEndpoint("web", "host-a", "127.0.0.1:30002", 101, 3.0)
        store.record_lb_endpoint(moved)
        assert store.list_lb_endpoints("web")[0] == moved
        store.delete_lb_endpoint("web", "host-a", 100)  # the old process stopping: not its row any more
        assert store.list_lb_endpoints("web")[0] == moved
        store.delete_lb_endpoint("web", "host-a", 101)
        assert [e.host for e in store.list_lb_endpoints("web")] == ["host-b"]
        # A load balancer of a service gone records nothing, and a service deleted takes its rows.
        store.record_lb_endpoint(LbEndpoint("gone", "host-a", "127.0.0.1:30009", 300, 4.0))
        assert store.list_lb_endpoints("gone") == []
        store.delete_service("web")
        assert store.list_lb_endpoints("web") == []
    finally:
        store.close()


class RecordingConnection:
    """The store's connection, with the SQL of every statement it was given."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.statements: list[str] = []

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        self.statements.append(sql)
        return self.connection.execute(sql, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


@pytest.mark.parametrize("by_name", [True, False])
def test_the_endpoints_of_many_services_are_read_in_one_query(tmp_path: Path, by_name: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if not by_name:  # more services than are read by name: every row is read, and only those asked kept
        monkeypatch.setattr(store_module, "_FENCE_BY_NAME", 1)
    store = Store.open(tmp_path / "home")
    try:
        for port, name in enumerate(("api", "web", "idle"), start=30001):
            store.create_service(name, _task(), port, 0.0)
        store.record_lb_endpoint(LbEndpoint("web", "host-b", "127.0.0.2:30002", 200, 2.0))
        store.record_lb_endpoint(LbEndpoint("web", "host-a", "127.0.0.1:30002", 100, 1.0))
        store.record_lb_endpoint(LbEndpoint("api", "host-a", "127.0.0.1:30001", 101, 1.0))
        recording = RecordingConnection(store._db)
        store._db = recording
        found = store.list_lb_endpoints_of(["web", "idle", "gone"])
        assert len(recording.statements) == 1
        assert found == {"web": tuple(store.list_lb_endpoints("web")), "idle": (), "gone": ()}
        assert [e.host for e in found["web"]] == ["host-a", "host-b"]
        assert store.list_lb_endpoints_of([]) == {}
    finally:
        store.close()


def test_an_endpoint_port_chosen_in_the_transaction_sees_every_port_taken(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    try:
        store.create_service("one", _task(), 30001, 0.0)
        seen: list[set[int]] = []

        def choose(used: set[int]) -> int:
            seen.append(set(used))
            return max(used) + 1

        assert store.create_service("two", _task(), choose, 0.0).lb_port == 30002
        assert seen == [{30001}]

        def refuse(_used: set[int]) -> int:
            raise UsageError("no free port")

        with pytest.raises(UsageError, match="no free port"):
            store.create_service("three", _task(), refuse, 0.0)
        with pytest.raises(NotFoundError):
            store.get_service("three")  # nothing was stored
    finally:
        store.close()


@pytest.mark.parametrize(("bound", "address"), [
    (("127.0.0.2", 30001), "127.0.0.2:30001"),
    (("::1", 30001, 0, 0), "[::1]:30001"),  # an IPv6 address in brackets, as in a url
])
def test_the_address_a_load_balancer_records_is_one_a_url_can_hold(
    tmp_path: Path, bound: tuple[Any, ...], address: str
) -> None:
    store = Store.open(tmp_path / "home")
    try:
        store.create_service("web", _task(), 30001, 0.0)
        asyncio.run(_record_endpoint(store, "web", [bound]))
        [recorded] = store.list_lb_endpoints("web")
        assert recorded.address == address
    finally:
        store.close()
