"""The state's families of the controller's Prometheus endpoint: a scrape counts replicas with the store's one
``GROUP BY`` (``count_replicas_by_status``) and decodes no replica row."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.controller.metrics import HostCollector, render_text
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import AutoscalerObservation, ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store

TEXT = "service:\n  replicas: 1\nrun: echo hi\n"
# (service, version, status, how many)
REPLICAS = (("api", 1, ReplicaStatus.READY, 3), ("api", 2, ReplicaStatus.STARTING, 1),
            ("api", 1, ReplicaStatus.FAILED, 2), ("web", 1, ReplicaStatus.READY, 1))


class RecordingState:
    """A scrape's read-only store: answers what ``HostCollector`` may ask from a real store and records each
    call. It has no way to list replicas, so a scrape that decoded rows would fail its read."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.calls: list[str] = []

    def count_replicas_by_status(self) -> Mapping[tuple[str, int, ReplicaStatus], int]:
        self.calls.append("count_replicas_by_status")
        return self._store.count_replicas_by_status()

    def list_autoscaler_states(self) -> Mapping[str, tuple[AutoscalerState, AutoscalerObservation]]:
        self.calls.append("list_autoscaler_states")
        return self._store.list_autoscaler_states()

    def close(self) -> None:
        self.calls.append("close")


def test_a_scrape_counts_replicas_by_status_without_decoding_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store.open(home)
    try:
        for port, name in enumerate(("api", "web"), start=30001):
            store.create_service(name, SubmittedTask(text=TEXT, source="/t.yaml", spec=parse_task(TEXT)), port, 0.0)
        for service, version, status, count in REPLICAS:
            store.add_replicas(service, count, ReplicaRecord(
                service=service, replica_id=0, version=version, status=status, cloud="local", launched_at=0.0,
                status_since=0.0, launch_token="t"))
        store.put_autoscaler_states([("api", AutoscalerState(version=1, target=3),
                                      AutoscalerObservation(policy="request_rate", raw_target=4))])
        state = RecordingState(store)
        text = render_text(list(HostCollector(home, lambda: state, is_alive=lambda _pid: True).collect()))
    finally:
        store.close()
    assert state.calls == ["count_replicas_by_status", "list_autoscaler_states", "close"]
    replicas = {(s.labels["service"], s.labels["version"], s.labels["status"]): s.value
                for family in text_string_to_metric_families(text) if family.name == "skylite_replicas"
                for s in family.samples}
    assert replicas == {("api", "1", "READY"): 3, ("api", "2", "STARTING"): 1, ("api", "1", "FAILED"): 2,
                        ("web", "1", "READY"): 1}
    targets = {s.name: s.value for family in text_string_to_metric_families(text)
               if family.name.startswith("skylite_autoscaler") for s in family.samples}
    assert targets == {"skylite_autoscaler_raw_target_replicas": 4, "skylite_autoscaler_target_replicas": 3}
