"""Manifests: what a captured tree holds, as a value that can be compared. Pure.

A manifest lists every entry of a tree (path, kind, mode, size, and the sha256 of a file's bytes or a
link's target), sorted by path. Its digest is the sha256 of its canonical JSON, so two trees with the same
files, modes and links have the same digest whatever disk or time they were captured on, and a plan can
say "contents identical". The bytes themselves live once per digest in the blob store (``blobs``).

A single-file source is a manifest with one entry whose path is ``""``; the `service.tls` pair is a
manifest of two entries, ``TLS_CERT`` and ``TLS_KEY``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any


class EntryKind(str, Enum):
    FILE = "file"
    DIR = "dir"  # kept so that empty directories come back
    LINK = "link"  # a symbolic link, recorded as its target text; never followed


@dataclass(frozen=True)
class ManifestEntry:
    path: str  # relative, "/"-separated; "" for a single-file source
    kind: EntryKind
    mode: int = 0o644  # permission bits
    size: int = 0
    digest: str | None = None  # sha256 of a file's bytes
    target: str | None = None  # a link's target

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"path": self.path, "kind": self.kind.value, "mode": self.mode}
        if self.kind is EntryKind.FILE:
            document |= {"size": self.size, "digest": self.digest}
        if self.kind is EntryKind.LINK:
            document["target"] = self.target
        return document

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> ManifestEntry:
        return cls(path=str(document["path"]), kind=EntryKind(document["kind"]), mode=int(document["mode"]),
                   size=int(document.get("size", 0)), digest=document.get("digest"), target=document.get("target"))


@dataclass(frozen=True)
class Manifest:
    entries: tuple[ManifestEntry, ...] = ()  # sorted by path

    @cached_property
    def digest(self) -> str:
        canonical = json.dumps([e.to_json() for e in self.entries], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def files(self) -> dict[str, ManifestEntry]:
        return {e.path: e for e in self.entries if e.kind is EntryKind.FILE}

    def to_json(self) -> list[dict[str, Any]]:
        return [e.to_json() for e in self.entries]

    @classmethod
    def from_json(cls, documents: Sequence[Mapping[str, Any]]) -> Manifest:
        return cls(tuple(sorted((ManifestEntry.from_json(d) for d in documents), key=lambda e: e.path)))


# The entry paths of ``TaskFiles.tls``: the certificate chain and its private key (both mode 0600).
TLS_CERT = "cert.pem"
TLS_KEY = "key.pem"


@dataclass(frozen=True)
class TaskFiles:
    """Everything local a task version ships: its workdir, each local file-mount source, and the key and
    certificate of `service.tls` (for the load balancer only: replicas never receive them).

    Cloud URIs (``s3://``, ``gs://``) are referenced by the task, not captured, so they do not appear here.
    A snapshot without TLS has no ``tls`` key in its JSON, as those stored before it existed: their digests
    stay what they were.
    """

    workdir: Manifest | None = None
    mounts: tuple[tuple[str, Manifest], ...] = ()  # (destination, manifest), sorted by destination
    tls: Manifest | None = None  # entries TLS_CERT and TLS_KEY

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @property
    def size(self) -> int:
        return sum(m.size for m in self._manifests())

    @property
    def mount(self) -> dict[str, Manifest]:
        return dict(self.mounts)

    def blob_digests(self) -> set[str]:
        """Every file digest the snapshot needs (what garbage collection must keep), TLS files included."""
        return {e.digest for m in self._manifests() for e in m.entries if e.digest is not None}

    def _manifests(self) -> list[Manifest]:
        return ([self.workdir] if self.workdir else []) + [m for _, m in self.mounts] + ([self.tls] if self.tls else [])

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "workdir": None if self.workdir is None else self.workdir.to_json(),
            "mounts": {destination: manifest.to_json() for destination, manifest in self.mounts}}
        if self.tls is not None:
            document["tls"] = self.tls.to_json()
        return document

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> TaskFiles:
        workdir, tls = document.get("workdir"), document.get("tls")
        return cls(workdir=None if workdir is None else Manifest.from_json(workdir),
                   mounts=tuple(sorted((str(d), Manifest.from_json(m)) for d, m in document["mounts"].items())),
                   tls=None if tls is None else Manifest.from_json(tls))


@dataclass(frozen=True)
class ManifestDiff:
    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    other: tuple[str, ...] = field(default=())  # modes, links and directories that differ

    @property
    def count(self) -> int:
        return len(self.changed) + len(self.added) + len(self.removed) + len(self.other)

    def describe(self, limit: int = 3) -> str:
        """``3 files: app.py, lib/x.py, +new.py`` (``-gone.py`` for a removed one), at most ``limit`` named."""
        names = ([p or "(the file)" for p in self.changed] + [f"+{p}" for p in self.added]
                 + [f"-{p}" for p in self.removed] + list(self.other))
        shown = ", ".join(names[:limit]) + (f", and {len(names) - limit} more" if len(names) > limit else "")
        noun = "entry" if self.count == 1 else "entries"
        if not self.other:
            noun = "file" if self.count == 1 else "files"
        return f"{self.count} {noun}: {shown}"


def compare_manifests(old: Manifest, new: Manifest) -> ManifestDiff:
    """What differs between two trees, by path."""
    old_by_path = {e.path: e for e in old.entries}
    new_by_path = {e.path: e for e in new.entries}
    changed: list[str] = []
    added: list[str] = []
    removed: list[str] = []
    other: list[str] = []
    for path in sorted(old_by_path.keys() | new_by_path.keys()):
        before, after = old_by_path.get(path), new_by_path.get(path)
        if before == after:
            continue
        if before is None or after is None:
            entry = after or before
            assert entry is not None
            if entry.kind is EntryKind.FILE:
                (added if before is None else removed).append(path)
            else:
                other.append(("+" if before is None else "-") + (path + "/" if entry.kind is EntryKind.DIR else path))
        elif before.kind is EntryKind.FILE and after.kind is EntryKind.FILE and before.digest != after.digest:
            changed.append(path)
        else:
            other.append(f"{path or '(the file)'} ({_what_differs(before, after)})")
    return ManifestDiff(tuple(changed), tuple(added), tuple(removed), tuple(other))


def _what_differs(before: ManifestEntry, after: ManifestEntry) -> str:
    if before.kind is not after.kind:
        return f"{before.kind.value} -> {after.kind.value}"
    if before.mode != after.mode:
        return f"mode {before.mode:o} -> {after.mode:o}"
    return f"link -> {after.target}"
