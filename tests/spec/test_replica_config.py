"""When a replica built from one task version can serve another: the one comparison update, rollback and
status share."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from typing import Any

import pytest
import yaml

from skyserve_lite.files.manifest import EntryKind, Manifest, ManifestEntry, TaskFiles
from skyserve_lite.spec.config import (
    FieldChange,
    compute_config_fingerprint,
    find_config_changes,
    is_same_replica_config,
)
from skyserve_lite.spec.model import TaskSpec
from skyserve_lite.spec.parse import parse_task

REMOVE = object()
NO_SNAPSHOT = "contents cannot be compared (no snapshot of them was taken)"

BASE: dict[str, Any] = {
    "name": "svc",
    "resources": {
        "cloud": "aws",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "instance_type": "m5.large",
        "image_id": "ami-1",
        "use_spot": True,
        "disk_size": 100,
        "ports": 8080,
        "labels": {"team": "ml"},
    },
    "envs": {"MODEL": "a", "BATCH": 8},
    "setup": "pip install -r requirements.txt",
    "run": "python serve.py --port $PORT",
    "service": {"readiness_probe": "/health", "replicas": 2, "ports": 8080},
}


def spec(edits: dict[str, object] | None = None) -> TaskSpec:
    """``BASE`` with dotted-path ``edits`` applied (``REMOVE`` deletes a key), parsed."""
    doc = copy.deepcopy(BASE)
    for dotted, value in (edits or {}).items():
        *parents, leaf = dotted.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is REMOVE:
            del node[leaf]
        else:
            node[leaf] = value
    return parse_task(yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.parametrize("edits", [
    pytest.param({"name": "svc-v2"}, id="name"),
    pytest.param({"service.readiness_probe": "/ready"}, id="probe-path"),
    pytest.param({"service.readiness_probe": {"path": "/health", "initial_delay_seconds": 30,
                                              "timeout_seconds": 3, "post_data": {"q": 1}}},
                 id="probe-mapping"),
    pytest.param({"service.replicas": 5}, id="replicas"),
    pytest.param({"service.replicas": REMOVE,
                  "service.replica_policy": {"min_replicas": 1, "max_replicas": 4,
                                             "target_qps_per_replica": 2}},
                 id="fixed-to-autoscaling"),
    pytest.param({"service.load_balancing_policy": "round_robin"}, id="lb-policy"),
    pytest.param({"envs": {"BATCH": "8", "MODEL": "a"}}, id="envs-reordered-and-quoted"),
    pytest.param({"resources.ports": "8080-8080"}, id="same-port-as-range"),
    pytest.param({"resources.cloud": "AWS"}, id="cloud-spelled-uppercase"),
    pytest.param({"workdir": None, "file_mounts": None}, id="explicit-nulls"),
])
def test_service_only_changes_keep_replicas(edits: dict[str, object]) -> None:
    old, new = spec(), spec(edits)
    assert find_config_changes(old, new) == ()
    assert is_same_replica_config(old, new)
    assert compute_config_fingerprint(old) == compute_config_fingerprint(new)


@pytest.mark.parametrize(("edits", "change"), [
    pytest.param({"resources.image_id": "ami-2"}, FieldChange("resources.image_id", "ami-1", "ami-2"),
                 id="image-id"),
    pytest.param({"resources.instance_type": "m5.xlarge"},
                 FieldChange("resources.instance_type", "m5.large", "m5.xlarge"), id="instance-type"),
    pytest.param({"resources.region": "us-west-2"}, FieldChange("resources.region", "us-east-1", "us-west-2"),
                 id="region"),
    pytest.param({"resources.zone": "us-east-1b"}, FieldChange("resources.zone", "us-east-1a", "us-east-1b"),
                 id="zone"),
    pytest.param({"resources.cloud": "gcp"}, FieldChange("resources.cloud", "aws", "gcp"), id="cloud"),
    pytest.param({"resources.use_spot": False}, FieldChange("resources.use_spot", True, False),
                 id="use-spot"),
    pytest.param({"resources.disk_size": 200}, FieldChange("resources.disk_size", 100, 200), id="disk-size"),
    pytest.param({"resources.ports": "8080-8081"}, FieldChange("resources.ports", "8080", "8080,8081"),
                 id="resource-ports"),
    pytest.param({"resources.ports": REMOVE}, FieldChange("resources.ports", "8080", None),
                 id="resource-ports-removed"),
    pytest.param({"resources.labels.team": "infra"}, FieldChange("resources.labels.team", "ml", "infra"),
                 id="label-value"),
    pytest.param({"resources.labels.owner": "me"}, FieldChange("resources.labels.owner", None, "me"),
                 id="label-added"),
    pytest.param({"envs.MODEL": "b"}, FieldChange("envs.MODEL", "a", "b"), id="env-value"),
    pytest.param({"envs.DEBUG": True}, FieldChange("envs.DEBUG", None, "true"), id="env-added"),
    pytest.param({"envs.BATCH": REMOVE}, FieldChange("envs.BATCH", "8", None), id="env-removed"),
    pytest.param({"setup": "pip install ."}, FieldChange("setup", "pip install -r requirements.txt",
                                                         "pip install ."), id="setup"),
    pytest.param({"setup": REMOVE}, FieldChange("setup", "pip install -r requirements.txt", None),
                 id="setup-removed"),
    pytest.param({"run": "python serve.py --port $PORT --fast"},
                 FieldChange("run", "python serve.py --port $PORT", "python serve.py --port $PORT --fast"),
                 id="run"),
    pytest.param({"service.ports": 9090}, FieldChange("service.ports", 8080, 9090), id="service-port"),
    pytest.param({"service.ports": REMOVE}, FieldChange("service.ports", 8080, None),
                 id="service-port-removed"),
])
def test_replica_field_change_is_reported(edits: dict[str, object], change: FieldChange) -> None:
    old, new = spec(), spec(edits)
    assert find_config_changes(old, new) == (change,)
    assert not is_same_replica_config(old, new)
    assert compute_config_fingerprint(old) != compute_config_fingerprint(new)


def test_several_changes_are_reported_sorted_by_path() -> None:
    changes = find_config_changes(spec(), spec({"run": "serve", "envs.MODEL": "b", "resources.zone": "z"}))
    assert [change.path for change in changes] == ["envs.MODEL", "resources.zone", "run"]


@pytest.mark.parametrize(("old_edits", "new_edits", "changes"), [
    pytest.param({"file_mounts": {"/data": "s3://bucket"}}, {"file_mounts": {"/data": "s3://bucket"}},
                 (FieldChange("file_mounts./data", "s3://bucket", "s3://bucket",
                              note="contents cannot be compared (a cloud URI)"),),
                 id="identical-cloud-file-mount"),
    pytest.param({"workdir": "."}, {"workdir": "."},
                 (FieldChange("workdir", ".", ".", note=NO_SNAPSHOT),), id="identical-workdir-without-snapshot"),
    pytest.param({"workdir": ".", "file_mounts": {"/data": "s3://bucket"}},
                 {"workdir": ".", "file_mounts": {"/data": "s3://bucket"}},
                 (FieldChange("file_mounts./data", "s3://bucket", "s3://bucket",
                              note="contents cannot be compared (a cloud URI)"),
                  FieldChange("workdir", ".", ".", note=NO_SNAPSHOT)),
                 id="identical-workdir-and-file-mounts"),
    pytest.param({"file_mounts": {"/data": "s3://bucket"}}, {},
                 (FieldChange("file_mounts./data", "s3://bucket", None),), id="file-mount-removed"),
    pytest.param({}, {"file_mounts": {"/data": "s3://bucket"}},
                 (FieldChange("file_mounts./data", None, "s3://bucket"),), id="file-mount-added"),
    pytest.param({"workdir": "."}, {"workdir": "./app"}, (FieldChange("workdir", ".", "./app"),),
                 id="workdir-changed"),
    pytest.param({}, {"workdir": "."}, (FieldChange("workdir", None, "."),), id="workdir-added"),
])
def test_workdir_and_file_mounts_force_a_change(
        old_edits: dict[str, object], new_edits: dict[str, object], changes: tuple[FieldChange, ...]) -> None:
    old, new = spec(old_edits), spec(new_edits)
    assert find_config_changes(old, new) == changes
    assert not is_same_replica_config(old, new)


@pytest.mark.parametrize(("change", "text"), [
    pytest.param(FieldChange("resources.image_id", "ami-1", "ami-2"), "resources.image_id: ami-1 -> ami-2",
                 id="strings"),
    pytest.param(FieldChange("envs.MODEL", "a", "b"), "envs.MODEL: a -> b", id="env"),
    pytest.param(FieldChange("envs.DEBUG", None, "true"), "envs.DEBUG: (unset) -> true", id="added"),
    pytest.param(FieldChange("setup", "pip install .", None), "setup: pip install . -> (unset)",
                 id="removed"),
    pytest.param(FieldChange("resources.use_spot", True, False), "resources.use_spot: true -> false",
                 id="booleans"),
    pytest.param(FieldChange("resources.disk_size", 100, 200), "resources.disk_size: 100 -> 200", id="ints"),
    pytest.param(FieldChange("workdir", "./a", "./b", note="moved"), "workdir: ./a -> ./b (moved)", id="with-note"),
    pytest.param(FieldChange("workdir", ".", ".", note="contents changed (1 file: app.py)"),
                 "workdir: contents changed (1 file: app.py)", id="same-value-says-only-the-note"),
    pytest.param(FieldChange("run", "python a.py\n", "python b.py\n"),
                 "run line 1: python a.py -> python b.py", id="script-first-different-line"),
    pytest.param(FieldChange("setup", "pip install a\npip install b\n", "pip install a\n"),
                 "setup line 2: pip install b -> (unset)", id="script-line-removed"),
    pytest.param(FieldChange("run", "x" * 60, "y" * 61), f"run: {'x' * 60} -> '{'y' * 57}...'",
                 id="long-value-truncated"),
])
def test_field_change_describe(change: FieldChange, text: str) -> None:
    assert change.describe() == text


def _manifest(files: dict[str, str]) -> Manifest:
    return Manifest(tuple(ManifestEntry(path, EntryKind.FILE, size=len(text),
                                        digest=hashlib.sha256(text.encode()).hexdigest())
                          for path, text in sorted(files.items())))


APP = {"app.py": "print(1)", "lib/x.py": "x = 1"}


@pytest.mark.parametrize(("old_files", "new_files", "reuse", "note"), [
    pytest.param(APP, APP, False, "contents identical (sha256 {digest}...), replaced by default: "
                 "--reuse-identical-files keeps it", id="identical-replaced-by-default"),
    pytest.param(APP, APP, True, None, id="identical-reused-when-asked"),
    pytest.param(APP, {"app.py": "print(2)", "lib/x.py": "x = 2", "new.py": ""}, True,
                 "contents changed (3 files: app.py, lib/x.py, +new.py)", id="changed-is-replaced-even-when-asked"),
    pytest.param(APP, {"app.py": "print(1)"}, False, "contents changed (1 file: -lib/x.py)", id="file-removed"),
])
def test_workdir_snapshots_decide_and_explain(old_files: dict[str, str], new_files: dict[str, str], reuse: bool,
                                              note: str | None) -> None:
    old = dataclasses.replace(spec({"workdir": "./app"}), files=TaskFiles(workdir=_manifest(old_files)))
    new = dataclasses.replace(spec({"workdir": "./app"}), files=TaskFiles(workdir=_manifest(new_files)))
    changes = find_config_changes(old, new, reuse_identical_files=reuse)
    assert old.files is not None and old.files.workdir is not None
    expected = () if note is None else (
        FieldChange("workdir", "./app", "./app", note=note.format(digest=old.files.workdir.digest[:8])),)
    assert changes == expected
    assert is_same_replica_config(old, new, reuse_identical_files=reuse) is (note is None)


def test_file_mount_snapshots_compare_per_destination() -> None:
    mounts: dict[str, object] = {"file_mounts": {"/data": "./data", "/model": "./model.bin"}}
    old = dataclasses.replace(spec(mounts), files=TaskFiles(mounts=(
        ("/data", _manifest({"a.csv": "1"})), ("/model", _manifest({"": "weights"})))))
    new = dataclasses.replace(spec(mounts), files=TaskFiles(mounts=(
        ("/data", _manifest({"a.csv": "1"})), ("/model", _manifest({"": "weights v2"})))))
    assert find_config_changes(old, new, reuse_identical_files=True) == (
        FieldChange("file_mounts./model", "./model.bin", "./model.bin", note="contents changed (1 file: (the file))"),)
