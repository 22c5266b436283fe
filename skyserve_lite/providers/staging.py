"""Staging a version's snapshot in a cloud's object store, the same way on every cloud.

Each service has a bucket (``compute_bucket_name``: per controller and service). Each blob goes once per
digest to ``blobs/<sha256>``, whatever the number of versions that hold it; the stager remembers what it
uploaded, and its first use of a bucket learns what is there already with one listing of ``blobs/``, so a
restarted controller uploads nothing again. Next to the blobs, one small file list per snapshot,
``files/<snapshot digest>.tsv``, says where each entry lands (``boot_script.render_file_list``); it goes
last, so a file list in the bucket means every blob it names is there too. The boot script downloads it and
applies it.

A cloud gives an ``ObjectStore``: its bucket calls, translated to ``ProviderError`` by its provider.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from skyserve_lite.errors import ProviderError
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.manifest import EntryKind, TaskFiles
from skyserve_lite.providers.boot_script import Placement, StagedFiles, render_file_list

BLOB_PREFIX = "blobs/"
FILE_LIST_PREFIX = "files/"


def compute_bucket_prefix(controller_id: str) -> str:
    """What the name of every bucket of ``controller_id`` starts with (``compute_bucket_name``): a controller
    VM's identity is granted the buckets matching it and no others. A store's controller id is 12 hex digits,
    so no controller's prefix starts another's."""
    return re.sub(r"[^a-z0-9-]+", "-", f"sky-lite-{controller_id}-".lower())


def compute_bucket_name(controller_id: str, service: str) -> str:
    """The bucket of one service's uploaded files: lowercase, at most 63 characters, unique per controller,
    starting with ``compute_bucket_prefix`` (a shortened name keeps its first 53 characters: the prefix of a
    controller id of up to 40 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"sky-lite-{controller_id}-{service}".lower()).strip("-")
    if len(name) > 63:
        name = f"{name[:54].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return name


class ObjectStore(Protocol):
    """A cloud's buckets. Every method raises only ``ProviderError``."""

    scheme: str  # "s3", "gs": how the boot script names an object (``scheme://bucket/key``)

    def ensure_bucket(self, bucket: str, region: str) -> None:
        """Create the bucket in ``region`` unless it exists (owned by us). Idempotent."""
        ...

    def list_keys(self, bucket: str, region: str, prefix: str) -> Iterable[str]:
        """Every key under ``prefix``, all pages."""
        ...

    def put(self, bucket: str, region: str, key: str, body: BinaryIO, size: int, content_type: str) -> None:
        """Write ``size`` bytes of ``body`` at ``key`` (a retry reads ``body`` again from the start)."""
        ...

    def delete_bucket(self, bucket: str, region: str) -> None:
        """Delete every object and then the bucket; a missing bucket is fine."""
        ...


@dataclass
class _Bucket:
    name: str
    region: str
    blobs: set[str]  # digests under blobs/: listed once, then added to as they are uploaded
    file_lists: dict[str, StagedFiles] = field(default_factory=dict)  # by snapshot digest, uploaded


class SnapshotStager:
    """See the module docstring. ``missing`` makes the permanent error of a blob that cannot be read from
    the state directory (field path, entry name, problem)."""

    def __init__(self, store: ObjectStore, blobs: BlobStore, controller_id: str,
                 missing: Callable[[str], ProviderError]) -> None:
        self._store = store
        self._blobs = blobs
        self._controller_id = controller_id
        self._missing = missing
        self._buckets: dict[str, _Bucket] = {}  # by service

    def stage(self, service: str, region: str, files: TaskFiles, placements: Sequence[Placement]) -> StagedFiles:
        """Upload the blobs of ``files`` the bucket lacks, then its file list; idempotent."""
        bucket = self._bucket(service, region)
        staged = bucket.file_lists.get(files.digest)
        if staged is not None:
            return staged
        for placement in placements:
            entry = placement.entry
            if entry.kind is not EntryKind.FILE or entry.digest is None or entry.digest in bucket.blobs:
                continue
            with self._reading(placement.field, entry.path or placement.path, entry.digest), \
                    self._blobs.open(entry.digest) as body:
                self._store.put(bucket.name, bucket.region, BLOB_PREFIX + entry.digest, body, entry.size,
                                "application/octet-stream")
            bucket.blobs.add(entry.digest)
        key = f"{FILE_LIST_PREFIX}{files.digest}.tsv"
        data = render_file_list(placements).encode()
        self._store.put(bucket.name, bucket.region, key, io.BytesIO(data), len(data), "text/tab-separated-values")
        scheme = self._store.scheme
        staged = StagedFiles(file_list=f"{scheme}://{bucket.name}/{key}", blobs=f"{scheme}://{bucket.name}/{BLOB_PREFIX}")
        bucket.file_lists[files.digest] = staged
        return staged

    def release(self, service: str, default_region: str) -> None:
        """Delete the service's bucket and everything in it (idempotent), and forget it."""
        known = self._buckets.pop(service, None)
        self._store.delete_bucket(compute_bucket_name(self._controller_id, service),
                                  known.region if known else default_region)

    def _bucket(self, service: str, region: str) -> _Bucket:
        known = self._buckets.get(service)
        if known is not None:
            return known
        name = compute_bucket_name(self._controller_id, service)
        self._store.ensure_bucket(name, region)
        blobs = {key[len(BLOB_PREFIX):] for key in self._store.list_keys(name, region, BLOB_PREFIX)}
        self._buckets[service] = _Bucket(name, region, blobs)
        return self._buckets[service]

    @contextmanager
    def _reading(self, field_path: str, name: str, digest: str) -> Iterator[None]:
        """An ``OSError`` reading a blob from the state directory is a permanent error naming the field (the
        version's files cannot be had; resubmitting it captures them again)."""
        try:
            yield
        except FileNotFoundError as exc:
            raise self._missing(f"{field_path}: {name}: its content (sha256 {digest[:12]}) is missing from the "
                                "snapshot store: submit the task again with `sky-lite serve update`") from exc
        except OSError as exc:
            raise self._missing(f"{field_path}: {name}: cannot read its content from the snapshot store "
                                f"({exc.filename}): {exc.strerror or exc}") from exc
