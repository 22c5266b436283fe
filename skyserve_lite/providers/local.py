"""Replicas as process groups on this machine.

Each replica gets a directory ``$SKY_LITE_HOME/replicas/SERVICE/REPLICA-NONCE/`` holding::

    instance.json   who it is (service, replica id, version, launch token, port); written before the spawn
    pid             written by the replica's own wrapper as its first act, so a crash of the controller
                    between spawn and bookkeeping cannot hide the process
    exit_code       written by the wrapper when `setup` fails or `run` exits
    setup.sh run.sh the task's commands;  replica.log  their output;  workdir/  a copy of `workdir`

The wrapper runs ``setup`` then ``run`` under bash in its own session, with the task's ``envs`` plus
``PORT`` (a free 127.0.0.1 port the workload must listen on) and ``SKY_LITE_REPLICA_ID``. ``workdir`` and
local ``file_mounts`` are copied into the replica's directory: a destination ``/data/x`` or ``~/x``
lands at ``data/x`` or ``x`` below the replica's working directory.

Termination kills the process group and renames ``instance.json`` to ``instance.terminated.json``: the
inventory stops reporting it, the log stays for ``serve logs`` until the service is released.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from skyserve_lite import procs
from skyserve_lite.clock import Clock
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest

INSTANCE_FILE = "instance.json"
TERMINATED_FILE = "instance.terminated.json"
LOG_FILE = "replica.log"
# A replica whose wrapper has not written its pid this long after launch never started.
_SPAWN_GRACE_SECONDS = 30.0

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


class LocalProvider:
    """Processes on this machine. See the module docstring for the layout and the contract."""

    name = "local"

    def __init__(self, home: Path, clock: Clock, *, new_id: Callable[[], str] | None = None,
                 grace_seconds: float = 5.0) -> None:
        self._root = home / "replicas"
        self._clock = clock
        self._new_id = new_id or (lambda: uuid.uuid4().hex[:10])
        self._grace_seconds = grace_seconds
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # --- Provider --------------------------------------------------------------------------------
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

    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        self._reap()
        if not self._root.is_dir():
            return []
        instances = []
        for meta_path in sorted(self._root.glob(f"*/*/{INSTANCE_FILE}")):
            record = _read_record(meta_path)
            if record is not None:
                instances.append(self._observe(meta_path.parent, record))
        return instances

    def terminate(self, instance_ids: Sequence[str]) -> None:
        wanted = set(instance_ids)
        directories = []
        for meta_path in self._root.glob(f"*/*/{INSTANCE_FILE}") if self._root.is_dir() else ():
            record = _read_record(meta_path)
            if record is not None and record.instance_id in wanted:
                directories.append(meta_path.parent)
        pgids = [pid for pid in (_read_pid(d) for d in directories) if pid is not None]
        procs.terminate_groups(pgids, self._grace_seconds)
        for directory in directories:
            os.replace(directory / INSTANCE_FILE, directory / TERMINATED_FILE)
        self._reap()

    def terminate_started(self) -> None:
        """Stop every process group this object started and that still runs (its bookkeeping files may be
        gone, e.g. when the state directory was deleted)."""
        self._reap()
        procs.terminate_groups(list(self._children), self._grace_seconds)
        self._reap()

    def release_service(self, service: str) -> None:
        shutil.rmtree(self._root / service, ignore_errors=True)

    # --- helpers ---------------------------------------------------------------------------------
    def replica_log(self, service: str, replica_id: int) -> Path | None:
        """The newest log of a replica, for `serve logs`; None if it has none."""
        logs = sorted((self._root / service).glob(f"{replica_id}-*/{LOG_FILE}"),
                      key=lambda p: p.stat().st_mtime)
        return logs[-1] if logs else None

    def _launch_one(self, request: LaunchRequest) -> Instance:
        spec = request.spec
        instance_id = f"local-{self._new_id()}"
        directory = self._root / request.service / f"{request.replica_id}-{instance_id.removeprefix('local-')}"
        directory.mkdir(parents=True, mode=0o700)
        cwd = directory
        base = Path(request.source_dir) if request.source_dir else Path.cwd()
        if spec.workdir:
            cwd = directory / "workdir"
            _copy(_resolve(spec.workdir, base), cwd, "workdir")
        for destination, source in spec.file_mounts:
            _copy(_resolve(source, base), cwd / _mount_target(destination), f"file_mounts.{destination}")
        (directory / "setup.sh").write_text(spec.setup or "")
        (directory / "run.sh").write_text(spec.run)
        (directory / "wrapper.sh").write_text(_WRAPPER.format(
            cwd=shlex.quote(str(cwd)), setup=shlex.quote(str(directory / "setup.sh")),
            run=shlex.quote(str(directory / "run.sh")), exit_file=shlex.quote(str(directory / "exit_code"))))
        port = procs.find_free_port()
        record = _Record(instance_id, request.service, request.replica_id, request.version,
                         request.launch_token, port, self._clock.now())
        _write_json(directory / INSTANCE_FILE, record.__dict__)
        env = dict(os.environ)
        env.update(dict(spec.envs))
        env.update({"PORT": str(port), "SKY_LITE_REPLICA_ID": str(request.replica_id),
                    "SKY_LITE_SERVICE": request.service})
        try:
            child = procs.spawn_detached(["bash", str(directory / "wrapper.sh")], cwd=directory, env=env,
                                         log_path=directory / LOG_FILE)
        except OSError as exc:
            os.replace(directory / INSTANCE_FILE, directory / TERMINATED_FILE)
            raise _LaunchError(f"cannot start bash: {exc}", permanent=True) from exc
        self._children[child.pid] = child
        return self._observe(directory, record)

    def _observe(self, directory: Path, record: _Record) -> Instance:
        pid = _read_pid(directory)
        exit_path = directory / "exit_code"
        if pid is not None and procs.is_alive(pid):
            state, detail = InstanceState.RUNNING, None
        elif exit_path.exists():
            state, detail = InstanceState.EXITED, exit_path.read_text().strip()
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
    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


def _resolve(source: str, base: Path) -> Path:
    if "://" in source:
        raise _LaunchError(f"{source}: the local provider copies local paths only", permanent=True)
    path = Path(source).expanduser()
    return path if path.is_absolute() else base / path


def _mount_target(destination: str) -> str:
    """``/data/x`` -> ``data/x``, ``~/x`` -> ``x``: mounts land below the replica's working directory."""
    return destination.removeprefix("~").lstrip("/") or "."


def _copy(source: Path, target: Path, field: str) -> None:
    try:
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    except OSError as exc:
        raise _LaunchError(f"{field}: cannot copy {source}: {exc.strerror or exc}", permanent=True) from exc


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
