"""Writing a captured tree back out from the blob store, for a replica on this machine.

Every entry must land inside ``root`` (the replica's directory): a path is refused when its folder,
symlinks followed, resolves outside it, so neither a ``..`` in a stored path nor a symlink in the workdir
that a file mount lands under can write anywhere else. Directory modes are applied last, so a read-only
folder still receives its files.
"""

from __future__ import annotations

import os
from pathlib import Path

from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.manifest import EntryKind, Manifest


class MaterializeError(Exception):
    """An entry cannot be written where it belongs (outside the root, or its blob is missing)."""


def materialize(manifest: Manifest, blobs: BlobStore, target: Path, root: Path) -> None:
    """Write ``manifest`` at ``target`` (a folder; a file itself for a single-file manifest). Raises
    ``MaterializeError``, or ``OSError`` from the disk."""
    root = root.resolve()
    directories: list[tuple[Path, int]] = []
    for entry in manifest.entries:
        path = target / entry.path if entry.path else target
        _check_inside(path, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        _check_inside(path, root)  # again, now that its folder exists: resolve sees any symlink on the way
        if entry.kind is EntryKind.DIR:
            path.mkdir(exist_ok=True)
            directories.append((path, entry.mode))
        elif entry.kind is EntryKind.LINK:
            assert entry.target is not None
            if path.is_symlink() or path.exists():
                path.unlink()
            os.symlink(entry.target, path)
        else:
            assert entry.digest is not None
            if not blobs.has(entry.digest):
                raise MaterializeError(f"{entry.path or path.name}: its content (sha256 {entry.digest[:12]}) is "
                                       "missing from the snapshot store")
            blobs.copy_to(entry.digest, path, entry.mode)
    for path, mode in reversed(directories):
        os.chmod(path, mode | 0o700)  # the replica's own user must still be able to enter and write its tree


def _check_inside(path: Path, root: Path) -> None:
    resolved = path.parent.resolve() / path.name
    if resolved != root and root not in resolved.parents:
        raise MaterializeError(f"{path} would land outside the replica's directory {root}")
