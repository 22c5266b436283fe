"""Capturing a task's workdir and file mounts: what a manifest holds, what the blob store keeps, and the
errors that refuse a submission naming the field."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest

from skyserve_lite.errors import SpecError
from skyserve_lite.files import capture as capture_module
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.capture import capture_task_files, check_task_sources, needs_capture
from skyserve_lite.files.manifest import EntryKind, Manifest, ManifestEntry, TaskFiles, compare_manifests
from skyserve_lite.spec.parse import parse_task


def task(extra: str) -> str:
    return f"service:\n  replicas: 1\nrun: python app.py\n{extra}"


def capture(root: Path, extra: str, blobs: BlobStore | None = None, limit: int = 1 << 30) -> TaskFiles:
    files = capture_task_files(parse_task(task(extra)), root, str(root / "svc.yaml"), blobs, limit)
    assert files is not None
    return files


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "app" / "lib").mkdir(parents=True)
    (root / "app" / "empty").mkdir()
    (root / "app" / "app.py").write_text("print('v1')")
    (root / "app" / "lib" / "x.py").write_text("x = 1")
    (root / "app" / "run.sh").write_text("#!/bin/sh\n")
    (root / "app" / "run.sh").chmod(0o755)
    (root / "weights.bin").write_text("weights")
    return root


def test_a_workdir_manifest_lists_files_dirs_modes_and_digests(project: Path) -> None:
    manifest = capture(project, "workdir: app\n").workdir
    assert manifest is not None
    assert [(e.path, e.kind, e.mode) for e in manifest.entries] == [
        ("app.py", EntryKind.FILE, 0o644), ("empty", EntryKind.DIR, 0o755), ("lib", EntryKind.DIR, 0o755),
        ("lib/x.py", EntryKind.FILE, 0o644), ("run.sh", EntryKind.FILE, 0o755)]
    assert manifest.files["app.py"].digest == sha("print('v1')")
    assert manifest.size == len("print('v1')") + len("x = 1") + len("#!/bin/sh\n")


def test_symlinks_are_recorded_as_links_and_never_followed(project: Path, tmp_path: Path) -> None:
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "key").write_text("do not read")
    os.symlink(secret, project / "app" / "escape")
    os.symlink("app.py", project / "app" / "alias.py")
    manifest = capture(project, "workdir: app\n").workdir
    assert manifest is not None
    by_path = {e.path: e for e in manifest.entries}
    assert by_path["escape"] == ManifestEntry("escape", EntryKind.LINK, mode=0o777, target=str(secret))
    assert by_path["alias.py"].target == "app.py"
    assert not any(p.startswith("escape/") for p in by_path)
    assert sha("do not read") not in {e.digest for e in manifest.entries}


@pytest.mark.parametrize(("files", "kept"), [
    pytest.param({".skyignore": "*.log\n", ".gitignore": "app.py\n"},
                 {"app.py", ".gitignore", ".skyignore", "build", "build/out.o"}, id="skyignore-wins-over-gitignore"),
    pytest.param({".gitignore": "*.log\n/build/\n"}, {"app.py", ".gitignore"}, id="gitignore-when-no-skyignore"),
    pytest.param({}, {"app.py", "debug.log", "build", "build/out.o"}, id="nothing-ignored-without-files"),
])
def test_the_workdir_honours_skyignore_else_gitignore(tmp_path: Path, files: dict[str, str], kept: set[str]) -> None:
    (tmp_path / "app" / "build").mkdir(parents=True)
    (tmp_path / "app" / "build" / "out.o").write_text("o")
    (tmp_path / "app" / "app.py").write_text("a")
    (tmp_path / "app" / "debug.log").write_text("l")
    for name, text in files.items():
        (tmp_path / "app" / name).write_text(text)
    manifest = capture(tmp_path, "workdir: app\n").workdir
    assert manifest is not None
    assert {e.path for e in manifest.entries} == kept


def test_a_single_file_mount_is_one_entry_with_an_empty_path(project: Path) -> None:
    files = capture(project, "file_mounts:\n  /models/w.bin: weights.bin\n  /remote: s3://bucket/data\n")
    assert files.mounts == (("/models/w.bin", Manifest((ManifestEntry("", EntryKind.FILE, mode=0o644, size=7,
                                                                      digest=sha("weights")),))),)
    assert files.workdir is None  # and the s3:// source is referenced, not captured


def test_equal_trees_have_equal_digests_and_a_change_is_named(project: Path) -> None:
    before = capture(project, "workdir: app\n")
    again = capture(project, "workdir: app\n")
    assert before.digest == again.digest
    (project / "app" / "app.py").write_text("print('v2')")
    (project / "app" / "new.py").write_text("")
    (project / "app" / "lib" / "x.py").unlink()
    after = capture(project, "workdir: app\n")
    assert after.digest != before.digest
    assert before.workdir is not None and after.workdir is not None
    assert compare_manifests(before.workdir, after.workdir).describe() == "3 files: app.py, +new.py, -lib/x.py"


def test_blobs_are_stored_once_per_content_across_versions_and_services(project: Path, tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    (project / "app" / "copy.py").write_text("print('v1')")  # same bytes as app.py
    first = capture(project, "workdir: app\n", blobs)
    assert len(blobs.digests()) == 3  # app.py and copy.py share one blob
    (project / "app" / "app.py").write_text("print('v2')")
    second = capture(project, "workdir: app\nfile_mounts:\n  /w: weights.bin\n", blobs)
    assert blobs.digests() == first.blob_digests() | second.blob_digests()
    assert len(blobs.digests()) == 5  # one changed file and the mount were new
    assert blobs.path_of(sha("weights")).read_text() == "weights"
    assert blobs.path_of(sha("weights")).stat().st_mode & 0o777 == 0o600


def test_hashing_only_writes_nothing(project: Path, tmp_path: Path) -> None:
    files = capture(project, "workdir: app\n", blobs=None)
    assert files.workdir is not None and files.workdir.files["app.py"].digest == sha("print('v1')")
    assert not (tmp_path / "blobs").exists()


@pytest.mark.parametrize(("extra", "field", "message"), [
    pytest.param("workdir: nope\n", "workdir", "'nope' does not exist", id="missing-workdir"),
    pytest.param("workdir: weights.bin\n", "workdir", "is not a directory", id="workdir-is-a-file"),
    pytest.param("file_mounts:\n  /data: missing.csv\n", "file_mounts./data", "'missing.csv' does not exist",
                 id="missing-mount-source"),
])
def test_a_missing_source_is_refused_naming_the_field(project: Path, extra: str, field: str, message: str) -> None:
    spec = parse_task(task(extra))
    with pytest.raises(SpecError) as raised:
        check_task_sources(spec, project, str(project / "svc.yaml"))
    assert raised.value.path == field and message in raised.value.problem
    with pytest.raises(SpecError, match=message):
        capture_task_files(spec, project, "svc.yaml")


def test_an_unreadable_file_is_refused_naming_the_field(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(path: object, *args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(capture_module, "open", denied, raising=False)  # root reads every file: simulate it
    with pytest.raises(SpecError) as raised:
        capture(project, "workdir: app\n")
    assert raised.value.path == "workdir" and "cannot read" in raised.value.problem
    assert "Permission denied" in raised.value.problem


def test_a_snapshot_over_the_limit_is_refused_naming_the_field(project: Path) -> None:
    with pytest.raises(SpecError) as raised:
        capture(project, "file_mounts:\n  /w: weights.bin\n", limit=6)
    assert raised.value.path == "file_mounts./w"
    assert "exceed the snapshot limit of 6 bytes per version" in raised.value.problem
    assert "SKY_LITE_SNAPSHOT_LIMIT_BYTES" in raised.value.problem


def test_needs_capture_only_for_local_files_not_captured_yet(project: Path) -> None:
    assert needs_capture(parse_task(task("workdir: app\n")))
    assert needs_capture(parse_task(task("file_mounts:\n  /w: weights.bin\n")))
    assert not needs_capture(parse_task(task("file_mounts:\n  /w: s3://bucket/w\n")))
    assert not needs_capture(parse_task(task("")))
    captured = dataclasses.replace(parse_task(task("workdir: app\n")), files=capture(project, "workdir: app\n"))
    assert not needs_capture(captured)


def test_a_manifest_survives_its_json(project: Path) -> None:
    os.symlink("app.py", project / "app" / "alias.py")
    files = capture(project, "workdir: app\nfile_mounts:\n  /w: weights.bin\n")
    assert TaskFiles.from_json(files.to_json()) == files
    assert TaskFiles.from_json(files.to_json()).digest == files.digest
