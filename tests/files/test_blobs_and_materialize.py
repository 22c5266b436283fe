"""The blob store's garbage collection against submissions in flight, and writing a snapshot back out."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest

from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.manifest import EntryKind, Manifest, ManifestEntry
from skyserve_lite.files.materialize import MaterializeError, materialize


def put(blobs: BlobStore, text: str) -> str:
    digest, _size = blobs.put(io.BytesIO(text.encode()))
    return digest


def test_collection_keeps_what_is_needed_and_removes_the_rest(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    keep, drop = put(blobs, "keep"), put(blobs, "drop")
    assert blobs.collect_garbage(lambda: {keep}) == 1
    assert blobs.digests() == {keep}
    assert blobs.collect_garbage(set) == 1
    assert not blobs.root.exists()  # nothing needed: no folder left behind
    assert drop not in blobs.digests()


def test_collection_waits_for_a_capture_under_way(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    with blobs.writing():
        fresh = put(blobs, "written for a version not stored yet")
        assert blobs.collect_garbage(set) is None  # deferred, not deleted
    assert blobs.digests() == {fresh}


def test_what_is_needed_is_asked_under_the_lock(tmp_path: Path) -> None:
    """A version stored just before collection takes the lock is seen: its blobs stay."""
    blobs = BlobStore(tmp_path / "blobs")
    stored: set[str] = set()
    entered, release = threading.Event(), threading.Event()

    def submit() -> None:
        with blobs.writing():
            stored.add(put(blobs, "v2"))
            entered.set()
            release.wait(5)

    submitter = threading.Thread(target=submit)
    submitter.start()
    entered.wait(5)
    assert blobs.collect_garbage(lambda: set(stored)) is None
    release.set()
    submitter.join(5)
    assert blobs.collect_garbage(lambda: set(stored)) == 0
    assert blobs.digests() == stored


def test_materialize_writes_files_dirs_links_and_modes(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    digest = put(blobs, "print(1)")
    manifest = Manifest((
        ManifestEntry("app.py", EntryKind.FILE, mode=0o755, size=8, digest=digest),
        ManifestEntry("empty", EntryKind.DIR, mode=0o755),
        ManifestEntry("link", EntryKind.LINK, mode=0o777, target="app.py"),
    ))
    root = tmp_path / "replica"
    materialize(manifest, blobs, root / "workdir", root)
    assert (root / "workdir" / "app.py").read_text() == "print(1)"
    assert (root / "workdir" / "app.py").stat().st_mode & 0o777 == 0o755
    assert (root / "workdir" / "empty").is_dir()
    assert os.readlink(root / "workdir" / "link") == "app.py"
    (root / "workdir" / "app.py").write_text("edited by the replica")
    assert blobs.path_of(digest).read_text() == "print(1)"  # a copy: the blob is untouched


@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt"])
def test_materialize_refuses_a_path_that_leaves_the_root(tmp_path: Path, path: str) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    manifest = Manifest((ManifestEntry(path, EntryKind.FILE, digest=put(blobs, "x")),))
    root = tmp_path / "replica"
    root.mkdir()
    with pytest.raises(MaterializeError, match="would land outside the replica's directory"):
        materialize(manifest, blobs, root, root)
    assert not (tmp_path / "escape.txt").exists()


def test_materialize_says_which_blob_is_missing(tmp_path: Path) -> None:
    manifest = Manifest((ManifestEntry("a.txt", EntryKind.FILE, digest="ab" * 32),))
    with pytest.raises(MaterializeError, match=r"a.txt: its content \(sha256 abababababab\) is missing"):
        materialize(manifest, BlobStore(tmp_path / "blobs"), tmp_path / "r", tmp_path / "r")
