"""Replicas as process groups on this machine.

Each replica gets a directory ``$SKY_LITE_HOME/replicas/SERVICE/REPLICA-NONCE/`` holding::

    instance.json   who it is (service, replica id, version, launch token, port); written before the spawn
    pid             written by the replica's own wrapper as its first act, so a crash of the controller
                    between spawn and bookkeeping cannot hide the process
    exit_code       written by the wrapper when `setup` fails or `run` exits
    setup.sh run.sh the task's commands;  replica.log  their output;  workdir/  the version's `workdir`

The wrapper runs ``setup`` then ``run`` under bash in its own session, with the task's ``envs`` plus
``PORT`` (a free 127.0.0.1 port the workload must listen on) and ``SKY_LITE_REPLICA_ID``. ``workdir`` and
local ``file_mounts`` are written from the version's snapshot (``files``: captured when the version was
submitted, so editing the files on disk afterwards changes no replica): a destination ``/data/x`` or
``~/x`` lands at ``data/x`` or ``x`` below the replica's working directory, and nothing may land outside
the replica's directory.

Termination kills the process group and renames ``instance.json`` to ``instance.terminated.json``: the
inventory stops reporting it, the log stays for ``serve logs`` until the service is released.

Errors: no ``OSError`` leaves the provider. A launch request that cannot be prepared (a file mount
landing on a file) becomes a permanent ``LaunchOutcome`` (a transient one when the machine ran short: a full
disk, no memory) whose error names the field the
failing step served (``_step``), and its half-made directory is removed; anywhere else the boundary of
every public method (``_os_errors_are_transient``) makes it a ``TransientProviderError``. Without a
``workdir`` the replica directory is the working directory, so a file mount onto one of the files above
is refused rather than overwriting it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from skyserve_lite import procs
from skyserve_lite.clock import Clock
from skyserve_lite.errors import TransientProviderError
from skyserve_lite.files.blobs import BlobStore, blob_store_of
from skyserve_lite.files.capture import is_cloud_uri, needs_capture
from skyserve_lite.files.manifest import Manifest
from skyserve_lite.files.materialize import MaterializeError, materialize
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest, ReplicaLog

INSTANCE_FILE = "instance.json"
TERMINATED_FILE = "instance.terminated.json"
LOG_FILE = "replica.log"
# What the provider keeps in a replica directory. Without a `workdir` that directory is also the working
# directory, so a file mount landing on one of these would overwrite (or, as a directory, break) it.
_OWN_FILES = frozenset({INSTANCE_FILE, TERMINATED_FILE, LOG_FILE, "instance.tmp", "pid", "pid.tmp", "exit_code",
                        "exit_code.tmp", "setup.sh", "run.sh", "wrapper.sh"})
# A replica whose wrapper has not written its pid this long after launch never started.
_SPAWN_GRACE_SECONDS = 30.0

_P = ParamSpec("_P")
_R = TypeVar("_R")

_WRAPPER = """\
echo $$ > pid.tmp && mv pid.tmp pid
cd {cwd}
if [ -s {setup} ]; then
  bash {setup}
  code=$?
  if [ $code -ne 0 ]; then
    echo "sky-lite: setup failed with exit code $code"
    echo "setup failed with exit code $code" > {exit_file}.tmp && mv {exit_file}.tmp {exit_file}
    exit $code
  fi
fi
bash {run}
code=$?
echo "sky-lite: run exited with code $code"
echo "run exited with code $code" > {exit_file}.tmp && mv {exit_file}.tmp {exit_file}
exit $code
"""


@dataclass(frozen=True)
class _Record:
    """``instance.json`` of one replica directory."""

    instance_id: str
    service: str
    replica_id: int
    version: int
    launch_token: str
    port: int
    launched_at: float


def _os_errors_are_transient(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """The provider's boundary: an ``OSError`` (a file removed meanwhile, a full disk, a permission) leaves
    a public method as a ``TransientProviderError``, and the next pass tries again."""

    @functools.wraps(method)
    def translated(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except OSError as exc:
            raise TransientProviderError(f"local provider: {method.__name__}: {_describe(exc)}") from exc

    return translated


class LocalProvider:
    """Processes on this machine. See the module docstring for the layout and the contract."""

    name = "local"

    def __init__(self, home: Path, clock: Clock, *, new_id: Callable[[], str] | None = None,
                 grace_seconds: float = 5.0, blobs: BlobStore | None = None) -> None:
        self._root = home / "replicas"
        # Where the versions' files are: the state directory's blob store (emulation passes its own home's).
        self._blobs = blobs or blob_store_of(home)
        self._clock = clock
        self._new_id = new_id or (lambda: uuid.uuid4().hex[:10])
        self._grace_seconds = grace_seconds
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # --- Provider --------------------------------------------------------------------------------
    @_os_errors_are_transient
    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        existing = {(i.service, i.replica_id): i for i in self.list_instances()}
        outcomes = []
        for request in requests:
            found = existing.get((request.service, request.replica_id))
            if found is not None:
                outcomes.append(LaunchOutcome(request.replica_id, instance=found))
                continue
            try:
                outcomes.append(LaunchOutcome(request.replica_id, instance=self._launch_one(request)))
            except _LaunchError as exc:
                outcomes.append(LaunchOutcome(request.replica_id, error=str(exc), permanent=exc.permanent))
        return outcomes

    @_os_errors_are_transient
    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        self._reap()
        instances = []
        for meta_path in self._find_records():
            record = _read_record(meta_path)
            if record is not None:
                instances.append(self._observe(meta_path.parent, record))
        return instances

    @_os_errors_are_transient
    def terminate(self, instance_ids: Sequence[str]) -> None:
        wanted = set(instance_ids)
        directories = []
        for meta_path in self._find_records():
            record = _read_record(meta_path)
            if record is not None and record.instance_id in wanted:
                directories.append(meta_path.parent)
        pgids = [pid for pid in (_read_pid(d) for d in directories) if pid is not None]
        procs.terminate_groups(pgids, self._grace_seconds)
        for directory in directories:
            with contextlib.suppress(FileNotFoundError):  # terminated meanwhile by another call
                os.replace(directory / INSTANCE_FILE, directory / TERMINATED_FILE)
        self._reap()

    @_os_errors_are_transient
    def release_service(self, service: str) -> None:
        directory = self._root / service
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            pass  # nothing kept, or removed meanwhile
        except OSError:
            if directory.exists():
                raise

    @_os_errors_are_transient
    def read_log(self, service: str, replica_id: int, instance_id: str | None,
                 region: str | None) -> ReplicaLog | None:
        """The newest ``replica.log`` of the replica (it grows while the replica runs, and stays after it
        is terminated until the service is released); None if it has none."""
        logs = sorted((self._root / service).glob(f"{replica_id}-*/{LOG_FILE}"), key=lambda p: p.stat().st_mtime)
        return ReplicaLog(path=logs[-1]) if logs else None

    @_os_errors_are_transient
    def abandon(self) -> None:
        """Stop every process group this object started and that still runs: their bookkeeping files may
        be gone with the state directory, so nothing else would find them."""
        self._reap()
        procs.terminate_groups(list(self._children), self._grace_seconds)
        self._reap()

    # --- helpers ---------------------------------------------------------------------------------
    def _find_records(self) -> list[Path]:
        return sorted(self._root.glob(f"*/*/{INSTANCE_FILE}")) if self._root.is_dir() else []

    def _launch_one(self, request: LaunchRequest) -> Instance:
        """Start one replica; raises ``_LaunchError`` (having removed what it made) when it cannot."""
        instance_id = f"local-{self._new_id()}"
        directory = self._root / request.service / f"{request.replica_id}-{instance_id.removeprefix('local-')}"
        with _step(f"replica directory {directory}", "cannot create it"):
            directory.mkdir(parents=True, mode=0o700)
        try:
            with _step(f"replica directory {directory}"):  # any step below that names no field of its own
                _prepare(directory, request, self._blobs)
                with _step("PORT", "no free port on 127.0.0.1"):
                    port = procs.find_free_port()
                record = _Record(instance_id, request.service, request.replica_id, request.version,
                                 request.launch_token, port, self._clock.now())
                _write_json(directory / INSTANCE_FILE, record.__dict__)
                env = dict(os.environ)
                env.update(dict(request.spec.envs))
                env.update({"PORT": str(port), "SKY_LITE_REPLICA_ID": str(request.replica_id),
                            "SKY_LITE_SERVICE": request.service})
                with _step("run", "cannot start bash"):
                    child = procs.spawn_detached(["bash", str(directory / "wrapper.sh")], cwd=directory, env=env,
                                                 log_path=directory / LOG_FILE)
        except _LaunchError:
            _discard(directory)
            raise
        self._children[child.pid] = child
        return self._observe(directory, record)

    def _observe(self, directory: Path, record: _Record) -> Instance:
        pid = _read_pid(directory)
        exit_reason = _read_exit_reason(directory)
        if pid is not None and procs.is_alive(pid):
            state, detail = InstanceState.RUNNING, None
        elif exit_reason is not None:
            state, detail = InstanceState.EXITED, exit_reason
        elif pid is not None:
            state, detail = InstanceState.EXITED, "killed by a signal"
        elif self._clock.now() - record.launched_at < _SPAWN_GRACE_SECONDS:
            state, detail = InstanceState.PENDING, None
        else:
            state, detail = InstanceState.EXITED, "the process never started"
        return Instance(
            instance_id=record.instance_id, service=record.service, replica_id=record.replica_id,
            version=record.version, state=state, url=f"http://127.0.0.1:{record.port}", detail=detail,
        )

    def _reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]


class _LaunchError(Exception):
    """A launch request that cannot be carried out: an outcome whose message starts with the field at
    fault. Permanent unless the machine itself ran short (``permanent`` False: a later pass tries again,
    and a full disk does not count toward the launch circuit breaker)."""

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


# The machine ran short, not the task at fault: a full disk or quota, no memory, no file descriptors.
_SHORTAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.EAGAIN})


@contextlib.contextmanager
def _step(field: str, doing: str = "") -> Iterator[None]:
    """One step of preparing a replica: its ``OSError`` becomes a ``_LaunchError`` naming the field the step
    serves (``workdir``, ``file_mounts./data``), so the replica's status says what to fix."""
    try:
        yield
    except OSError as exc:
        raise _LaunchError(f"{field}: {_describe(exc, doing)}", permanent=exc.errno not in _SHORTAGE_ERRNOS) from exc


def _describe(exc: OSError, doing: str = "") -> str:
    reason = exc.strerror or str(exc)
    if exc.strerror and exc.filename is not None and str(exc.filename) not in doing:
        reason = f"{reason}: {exc.filename}"
    return f"{doing}: {reason}" if doing else reason


def _prepare(directory: Path, request: LaunchRequest, blobs: BlobStore) -> Path:
    """Fill a new replica directory: the version's snapshot of ``workdir`` and ``file_mounts``, and the
    scripts the wrapper runs. Returns the working directory of ``setup`` and ``run``. Raises
    ``_LaunchError`` or ``OSError``."""
    spec = request.spec
    if needs_capture(spec):
        raise _LaunchError(f"{'workdir' if spec.workdir else 'file_mounts'}: version {request.version} has no "
                           "snapshot of its files (it was stored by an older sky-lite): submit it again with "
                           "`sky-lite serve update`")
    files = spec.files
    cwd = directory
    if spec.workdir and files is not None and files.workdir is not None:
        cwd = directory / "workdir"
        with _step("workdir", "cannot write the snapshot"):
            cwd.mkdir()
            _materialize(files.workdir, blobs, cwd, directory, "workdir")
    mounts = files.mount if files is not None else {}
    for destination, source_text in spec.file_mounts:
        field = f"file_mounts.{destination}"
        if is_cloud_uri(source_text):
            raise _LaunchError(f"{field}: {source_text}: the local provider copies local paths only")
        target = _mount_target(destination)
        top = Path(target).parts[:1]
        if cwd == directory and top and top[0] in _OWN_FILES:
            raise _LaunchError(f"{field}: lands on {top[0]}, which the local provider keeps for the replica: "
                               "choose another destination, or set workdir")
        with _step(field, "cannot write the snapshot"):
            _materialize(mounts[destination], blobs, cwd / target, directory, field)
    with _step("setup"):
        (directory / "setup.sh").write_text(spec.setup or "")
    with _step("run"):
        (directory / "run.sh").write_text(spec.run)
    (directory / "wrapper.sh").write_text(_WRAPPER.format(
        cwd=shlex.quote(str(cwd)), setup=shlex.quote(str(directory / "setup.sh")),
        run=shlex.quote(str(directory / "run.sh")), exit_file=shlex.quote(str(directory / "exit_code"))))
    return cwd


def _discard(directory: Path) -> None:
    """Remove what a failed launch made. Its record goes first: should the rest not go, the inventory still
    never reports it (a directory without ``instance.json`` is no instance)."""
    with contextlib.suppress(OSError):
        (directory / INSTANCE_FILE).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def _materialize(manifest: Manifest, blobs: BlobStore, target: Path, root: Path, field: str) -> None:
    try:
        materialize(manifest, blobs, target, root)
    except MaterializeError as exc:
        raise _LaunchError(f"{field}: {exc}") from exc


def _mount_target(destination: str) -> str:
    """``/data/x`` -> ``data/x``, ``~/x`` -> ``x``: mounts land below the replica's working directory."""
    return destination.removeprefix("~").lstrip("/") or "."


def _read_exit_reason(directory: Path) -> str | None:
    try:
        return (directory / "exit_code").read_text().strip()
    except OSError:
        return None  # not exited (or not yet written: the wrapper renames it into place)


def _read_record(path: Path) -> _Record | None:
    try:
        return _Record(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # renamed away meanwhile, or half-written by a crash before the rename


def _read_pid(directory: Path) -> int | None:
    try:
        return int((directory / "pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, value: object) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(value, sort_keys=True))
    os.replace(temporary, path)
