"""Reading a task's `workdir` and local `file_mounts` sources into a snapshot, when the task is submitted.

``capture_task_files`` walks each source once: every regular file is hashed (and, given a blob store,
stored there), symlinks are recorded as links (never followed, so nothing outside the tree is read),
directories are recorded so empty ones come back, and other kinds (sockets, fifos, devices) are skipped.
The workdir honours its `.skyignore`, else its `.gitignore` (``ignore``). A source that is missing or
unreadable, or a snapshot larger than the limit, is a ``SpecError`` naming the field (``workdir``,
``file_mounts./data``); nothing that the caller stores refers to a half-made snapshot.

The `service.tls` key and certificate are captured the same way (``TaskFiles.tls``, both recorded with
mode 0600 whatever their mode on disk), for the load balancer: a missing or unreadable one is refused
naming ``service.tls.keyfile`` or ``service.tls.certfile``, and so is a pair that does not load as a
certificate chain and its key (``files.tls``), on ``service.tls.certfile``.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite.errors import SpecError
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.ignore import IGNORE_FILES, IgnoreRules, parse_ignore_rules
from skyserve_lite.files.manifest import TLS_CERT, TLS_KEY, EntryKind, Manifest, ManifestEntry, TaskFiles
from skyserve_lite.files.tls import TlsPairError, load_server_context
from skyserve_lite.spec.model import TaskSpec, TlsFiles

DEFAULT_LIMIT_BYTES = 1 << 30  # 1 GiB per version
_CHUNK = 1 << 20


def is_cloud_uri(source: str) -> bool:
    return "://" in source


def needs_capture(spec: TaskSpec) -> bool:
    """Whether ``spec`` has local files to capture (`service.tls` included) and no snapshot of them yet."""
    local_mounts = any(not is_cloud_uri(source) for _, source in spec.file_mounts)
    return spec.files is None and (spec.workdir is not None or local_mounts or spec.service.tls is not None)


@dataclass
class _Budget:
    source: str
    limit: int
    used: int = 0

    def spend(self, size: int, field: str) -> None:
        self.used += size
        if self.used > self.limit:
            raise SpecError(self.source, field, f"the task's files exceed the snapshot limit of "
                                                f"{format_size(self.limit)} per version (set "
                                                "SKY_LITE_SNAPSHOT_LIMIT_BYTES to raise it)")


def find_task_dir(source: str) -> Path:
    """Where a task's relative paths (`workdir`, `file_mounts` sources, `service.tls`) resolve: the directory
    sky-lite runs in, as SkyPilot resolves them (`sky serve up examples/x/task.yaml` from a repository's root,
    with `workdir: examples/x`), whatever folder the task file is in."""
    del source  # the file's folder is only named in the hint of ``describe_missing``
    return Path.cwd()


def describe_missing(written: str, resolved: Path, source: str) -> str:
    """Why a relative path is not found: where it was looked for, and, when the task file's folder holds it
    (where sky-lite read relative paths from before it read them as SkyPilot does), how to name it."""
    problem = f"{written!r} does not exist (resolved to {resolved})"
    task_file = Path(source)
    beside = task_file.parent / Path(written).expanduser()
    if not Path(written).expanduser().is_absolute() and task_file.is_absolute() and beside.exists():
        shown = os.path.relpath(beside, Path.cwd())
        shown = str(beside) if shown.startswith("..") else shown
        problem += (f"; relative paths are read from the directory sky-lite runs in, as SkyPilot does, not from "
                    f"the task file's folder: write {shown!r}, or run sky-lite from {task_file.parent}")
    return problem


def check_task_sources(spec: TaskSpec, base: Path, source: str) -> None:
    """Refuse a missing or wrong-kind source before anything is read or stored (``SpecError``)."""
    if spec.workdir is not None:
        root = _resolve(spec.workdir, base)
        if not root.is_dir():
            raise SpecError(source, "workdir", f"{spec.workdir!r} is not a directory" if root.exists()
                            else describe_missing(spec.workdir, root, source))
    for destination, mount_source in spec.file_mounts:
        path = _resolve(mount_source, base)
        if not is_cloud_uri(mount_source) and not (path.is_file() or (path.is_dir() and not path.is_symlink())):
            raise SpecError(source, f"file_mounts.{destination}",
                            describe_missing(mount_source, path, source) if not path.exists()
                            else f"{mount_source!r} is neither a file nor a directory")
    if spec.service.tls is not None:
        _check_tls(spec.service.tls, base, source)


def _tls_sources(tls: TlsFiles) -> tuple[tuple[str, str, str], ...]:
    """(entry path in ``TaskFiles.tls``, field, path as written) of the key, then the certificate."""
    return ((TLS_KEY, "service.tls.keyfile", tls.keyfile), (TLS_CERT, "service.tls.certfile", tls.certfile))


def _check_tls(tls: TlsFiles, base: Path, source: str) -> None:
    """Each file is there and readable, and the pair loads as a certificate chain and its key."""
    for _name, field, written in _tls_sources(tls):
        path = _resolve(written, base)
        if not path.is_file():
            raise SpecError(source, field, describe_missing(written, path, source) if not path.exists()
                            else f"{written!r} is not a file")
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise SpecError(source, field, f"cannot read {path}: {exc.strerror or exc}") from exc
    field = "service.tls.certfile"
    try:
        load_server_context(_resolve(tls.certfile, base), _resolve(tls.keyfile, base))
    except TlsPairError as exc:
        raise SpecError(source, field, f"{tls.certfile!r} with keyfile {tls.keyfile!r}: {exc}") from exc
    except OSError as exc:  # replaced since the check above
        raise SpecError(source, field, f"cannot read {exc.filename}: {exc.strerror or exc}") from exc


def capture_task_files(spec: TaskSpec, base: Path, source: str, blobs: BlobStore | None = None,
                       limit_bytes: int = DEFAULT_LIMIT_BYTES) -> TaskFiles | None:
    """The snapshot of ``spec``'s local files; None when it has none. Relative sources resolve against
    ``base`` (``find_task_dir``). Without ``blobs`` the files are only hashed (a dry run)."""
    if spec.workdir is None and spec.service.tls is None and all(is_cloud_uri(s) for _, s in spec.file_mounts):
        return None
    check_task_sources(spec, base, source)
    budget = _Budget(source, limit_bytes)
    workdir = None
    if spec.workdir is not None:
        root = _resolve(spec.workdir, base)
        workdir = _capture_dir(root, "workdir", _ignore_rules(root, source), blobs, budget)
    mounts = []
    for destination, mount_source in spec.file_mounts:
        if is_cloud_uri(mount_source):
            continue  # referenced, not captured
        field = f"file_mounts.{destination}"
        path = _resolve(mount_source, base)
        if path.is_dir():
            mounts.append((destination, _capture_dir(path, field, IgnoreRules(), blobs, budget)))
        else:
            mounts.append((destination, Manifest((_capture_file(path, "", field, blobs, budget),))))
    tls = None
    if spec.service.tls is not None:
        # 0600 whatever the mode on disk: the load balancer writes its copy with the mode recorded here.
        tls = Manifest(tuple(sorted((_capture_file(_resolve(written, base), name, field, blobs, budget, 0o600)
                                     for name, field, written in _tls_sources(spec.service.tls)),
                                    key=lambda e: e.path)))
    return TaskFiles(workdir=workdir, mounts=tuple(sorted(mounts)), tls=tls)


def find_local_paths(spec: TaskSpec, base: Path, files: TaskFiles) -> dict[str, Path]:
    """Where on this disk each blob of ``files`` (a snapshot of ``spec`` captured against ``base``) was
    read from: digest -> path. What a remote client uploads from; the bytes there may have changed since
    (the receiver checks every blob against its digest)."""
    roots: list[tuple[Path, Manifest]] = []
    if spec.workdir is not None and files.workdir is not None:
        roots.append((_resolve(spec.workdir, base), files.workdir))
    sources = dict(spec.file_mounts)
    for destination, manifest in files.mounts:
        if destination in sources:
            roots.append((_resolve(sources[destination], base), manifest))
    paths: dict[str, Path] = {}
    for root, manifest in roots:
        for entry in manifest.entries:
            if entry.digest is not None:
                paths.setdefault(entry.digest, root / entry.path if entry.path else root)
    if spec.service.tls is not None and files.tls is not None:
        written = {name: source for name, _field, source in _tls_sources(spec.service.tls)}
        for entry in files.tls.entries:
            if entry.digest is not None and entry.path in written:
                paths.setdefault(entry.digest, _resolve(written[entry.path], base))
    return paths


def _resolve(source: str, base: Path) -> Path:
    path = Path(source).expanduser()
    return path if path.is_absolute() else base / path


def _ignore_rules(root: Path, source: str) -> IgnoreRules:
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            try:
                return parse_ignore_rules(path.read_text(errors="replace"), name)
            except OSError as exc:
                raise SpecError(source, "workdir", f"cannot read {path}: {exc.strerror or exc}") from exc
    return IgnoreRules()


def _capture_dir(root: Path, field: str, rules: IgnoreRules, blobs: BlobStore | None, budget: _Budget) -> Manifest:
    entries: list[ManifestEntry] = []
    pending = [""]
    while pending:
        relative = pending.pop()
        directory = root / relative if relative else root
        try:
            children = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            raise SpecError(budget.source, field, f"cannot read {directory}: {exc.strerror or exc}") from exc
        for child in children:
            path = f"{relative}/{child.name}" if relative else child.name
            if "\n" in path or "\t" in path:
                raise SpecError(budget.source, field, f"{path!r}: file names with tabs or newlines are not supported")
            try:
                info = child.stat(follow_symlinks=False)
            except OSError as exc:
                raise SpecError(budget.source, field, f"cannot read {child.path}: {exc.strerror or exc}") from exc
            is_dir = stat.S_ISDIR(info.st_mode)
            if rules.is_ignored(path, is_dir):
                continue
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                entries.append(ManifestEntry(path, EntryKind.LINK, mode=0o777, target=os.readlink(child.path)))
            elif is_dir:
                entries.append(ManifestEntry(path, EntryKind.DIR, mode=mode))
                pending.append(path)
            elif stat.S_ISREG(info.st_mode):
                entries.append(_capture_file(Path(child.path), path, field, blobs, budget, mode))
    return Manifest(tuple(sorted(entries, key=lambda e: e.path)))


def _capture_file(path: Path, relative: str, field: str, blobs: BlobStore | None, budget: _Budget,
                  mode: int | None = None) -> ManifestEntry:
    try:
        if mode is None:
            mode = stat.S_IMODE(path.stat().st_mode)
        budget.spend(path.stat().st_size, field)
        with open(path, "rb") as stream:
            if blobs is not None:
                digest, size = blobs.put(stream)
            else:
                hasher, size = hashlib.sha256(), 0
                while chunk := stream.read(_CHUNK):
                    hasher.update(chunk)
                    size += len(chunk)
                digest = hasher.hexdigest()
    except OSError as exc:
        raise SpecError(budget.source, field, f"cannot read {path}: {exc.strerror or exc}") from exc
    return ManifestEntry(relative, EntryKind.FILE, mode=mode, size=size, digest=digest)


def format_size(size: int) -> str:
    """``12 KiB``, ``1.5 GiB``: the largest unit with at least 1 of it."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"
