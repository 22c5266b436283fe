"""Homes as the CLI tests start from: one service already up, written through the api and the store."""

from __future__ import annotations

from pathlib import Path

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.spec.parse import load_task_file
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store

# A service of 4 replicas on an image; the second version changes only the image, so every replica is replaced.
IMAGE_V1 = "resources:\n  infra: local\n  image_id: img-1\nservice:\n  replicas: 4\nrun: python serve.py\n"
IMAGE_V2 = IMAGE_V1.replace("img-1", "img-2")


def home_with_service(tmp_path: Path, text: str, replicas: int) -> Path:
    """``tmp_path/home`` holding service ``svc`` created from ``text`` (its file ``tmp_path/svc.yaml``) and
    ``replicas`` READY replicas of its version 1; no controller runs."""
    home = tmp_path / "home"
    task = tmp_path / "svc.yaml"
    task.write_text(text)
    LocalController(home, FakeClock(), start_daemon=False).create_service("svc", load_task_file(task))
    store = Store.open(home)
    template = ReplicaRecord(service="svc", replica_id=0, version=1, status=ReplicaStatus.READY, cloud="local",
                             launched_at=0.0, status_since=0.0, launch_token="t")
    store.add_replicas("svc", replicas, template)
    store.close()
    return home


def write(tmp_path: Path, text: str) -> str:
    """``text`` as the task file ``tmp_path/new.yaml`` (replacing the last one); its path."""
    path = tmp_path / "new.yaml"
    path.write_text(text)
    return str(path)


def versions(home: Path) -> list[int]:
    """The version numbers ``home`` holds of service ``svc``, oldest first."""
    store = Store.open(home)
    try:
        return [v.version for v in store.list_versions("svc")]
    finally:
        store.close()
