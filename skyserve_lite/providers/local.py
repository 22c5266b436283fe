"""Replicas as process groups on this machine.

Each replica gets a directory ``$SKY_LITE_HOME/replicas/SERVICE/REPLICA-NONCE/`` (the first part is
``SKY_LITE_LOCAL_REPLICAS_DIR`` where that is set: ``find_replicas_dir``) holding::

    instance.json   who it is (service, replica id, version, launch token, port); written before the spawn
    pid             written by the replica's supervisor (or, where there is none, its wrapper) as its first
                    act, so a crash of the controller between spawn and bookkeeping cannot hide the process:
                    its pid, the leader of the replica's process group, and its start time
                    (``procs.RecordedProcess``); removed when the replica is terminated and that process is gone
    exit_code       written by the wrapper when `setup` fails or `run` exits
    phase           written by the wrapper as it starts `setup` and then `run` ("setup", "run"): what
                    `serve status` shows of a STARTING replica
    setup.sh run.sh the task's commands;  replica.log  their output;  workdir/  the version's `workdir`

Each replica is its supervisor (``skyserve_lite/supervisor.py``, Linux: a child subreaper that stops every
descendant, those that called ``setsid`` or double-forked included) running the wrapper, which runs
``setup`` then ``run`` under bash, in a session of its own.

**Output.** Everything ``setup``, ``run`` and the wrapper print, stdout and stderr, reaches ``replica.log``
through the supervisor, each line with the UTC time it was printed in front: ``2026-12-01T17:30:05.123Z
Serving HTTP on 127.0.0.1 port 8000`` (``supervisor.format_line_time``; `serve logs --since` reads it).
Where there is no supervisor (not Linux) the wrapper writes to the log itself and lines carry no time.

**Environment.** A replica gets a bare environment, not the controller's (which holds the operator's
cloud credentials): ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` and ``LC_*`` as the controller has them, the
variables ``SKY_LITE_REPLICA_ENV_PASSTHROUGH`` names (``NAME,NAME``), the task's ``envs``, and then
``PORT`` (a free 127.0.0.1 port the workload must listen on), ``SKY_LITE_REPLICA_ID``,
``SKY_LITE_SERVICE`` and the two tags below (``compute_replica_env``).

**Tags.** Every replica process carries ``SKY_LITE_HOME`` (the state directory, realpath) and
``SKY_LITE_REPLICA_DIR`` (its replica directory) in its environment, and so does every descendant that
keeps its environment. The process table (``/proc/PID/environ``) is thus the provider's own record of what
runs, which no deleted state directory takes away: ``find_replica_processes`` finds them, whoever started
them (this object, a controller before a restart, or `serve down --force`).

``workdir`` and local ``file_mounts`` are written from the version's snapshot (``files``: captured when the
version was submitted, so editing the files on disk afterwards changes no replica): a destination
``/data/x`` or ``~/x`` lands at ``data/x`` or ``x`` below the replica's working directory, and nothing may
land outside the replica's directory.

Termination (``stop_replica_processes``) sends SIGTERM to the top of each replica's tree (its supervisor),
which passes it once to every descendant and SIGKILLs them after the grace; whatever still carries the
replica's tag after that (a supervisor killed by hand) is SIGKILLed by its tag. Then ``instance.json`` is
renamed to ``instance.terminated.json``: the inventory stops reporting it, the log stays for ``serve logs``
until the service is released. The ``pid`` file goes too once its process is gone: by then the pid may be
another process's, and a reader (a person's ``kill`` included) would take it for the replica. Every reader
of a ``pid`` file goes through ``find_recorded_process``, which checks that the process still is the one
that wrote it (its start time) before anything acts on the pid.

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
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from skyserve_lite import procs, supervisor
from skyserve_lite.clock import Clock
from skyserve_lite.errors import TransientProviderError, UsageError
from skyserve_lite.files.blobs import BlobStore, blob_store_of
from skyserve_lite.files.capture import is_cloud_uri, needs_capture
from skyserve_lite.files.manifest import Manifest
from skyserve_lite.files.materialize import MaterializeError, materialize
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest, Phase, ReplicaLog

INSTANCE_FILE = "instance.json"
TERMINATED_FILE = "instance.terminated.json"
LOG_FILE = "replica.log"
PHASE_FILE = "phase"  # "setup" or "run": which command the wrapper runs now
PID_FILE = "pid"  # the replica's process group leader and its start time (see the module docstring)
# What the provider keeps in a replica directory. Without a `workdir` that directory is also the working
# directory, so a file mount landing on one of these would overwrite (or, as a directory, break) it.
_OWN_FILES = frozenset({INSTANCE_FILE, TERMINATED_FILE, LOG_FILE, "instance.tmp", PID_FILE, f"{PID_FILE}.tmp",
                        "exit_code", "exit_code.tmp", "setup.sh", "run.sh", "wrapper.sh", PHASE_FILE,
                        f"{PHASE_FILE}.tmp"})
# A replica whose wrapper has not written its pid this long after launch never started.
_SPAWN_GRACE_SECONDS = 30.0
# A supervisor takes its grace to stop the replica's descendants, then exits: wait that much longer for it.
_SUPERVISOR_MARGIN_SECONDS = 1.0

# The tags every replica process carries in its environment (see the module docstring).
TAG_HOME = "SKY_LITE_HOME"
TAG_REPLICA_DIR = "SKY_LITE_REPLICA_DIR"
# Extra variables of the controller's environment that replicas get, comma-separated names.
PASSTHROUGH_SETTING = "SKY_LITE_REPLICA_ENV_PASSTHROUGH"
REPLICAS_DIR_SETTING = "SKY_LITE_LOCAL_REPLICAS_DIR"
# What a replica gets of the controller's environment without asking: enough for a shell, a locale and a
# temporary directory; nothing that may hold a secret (AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, ...).
BASE_ENV = ("PATH", "HOME", "LANG", "TMPDIR")
_BASE_ENV_PREFIX = "LC_"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_P = ParamSpec("_P")
_R = TypeVar("_R")

_WRAPPER = """\
cd {cwd}
if [ -s {setup} ]; then
  echo setup > {phase_file}.tmp && mv {phase_file}.tmp {phase_file}
  bash {setup}
  code=$?
  if [ $code -ne 0 ]; then
    echo "sky-lite: setup failed with exit code $code"
    echo "setup failed with exit code $code" > {exit_file}.tmp && mv {exit_file}.tmp {exit_file}
    exit $code
  fi
fi
echo run > {phase_file}.tmp && mv {phase_file}.tmp {phase_file}
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
                 grace_seconds: float = 5.0, blobs: BlobStore | None = None, state_home: Path | None = None,
                 environ: Mapping[str, str] | None = None, replicas_dir: Path | None = None) -> None:
        """``home`` holds ``replicas/`` unless ``replicas_dir`` names the directory (``find_replicas_dir``);
        ``state_home`` (default ``home``) is the state directory the replicas' ``SKY_LITE_HOME`` tag names
        (emulation keeps its replicas below the state directory). ``environ`` (default ``os.environ``, read
        now) is what replicas take their base environment and ``SKY_LITE_REPLICA_ENV_PASSTHROUGH`` from."""
        # Tags are compared as paths: the real one, whichever way the home was spelled.
        self._root = (Path(os.path.realpath(replicas_dir)) if replicas_dir is not None
                      else Path(os.path.realpath(home)) / "replicas")
        self._state_home = Path(os.path.realpath(state_home or home))
        # Where the versions' files are: the state directory's blob store (emulation passes its own home's).
        self._blobs = blobs or blob_store_of(home)
        self._clock = clock
        self._new_id = new_id or (lambda: uuid.uuid4().hex[:10])
        self._grace_seconds = grace_seconds
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._environ = dict(os.environ if environ is None else environ)
        self._passthrough: tuple[str, ...] = ()
        self._setting_error: str | None = None  # an invalid passthrough setting fails every launch, naming it
        try:
            self._passthrough = parse_env_passthrough(self._environ.get(PASSTHROUGH_SETTING, ""))
        except UsageError as exc:
            self._setting_error = str(exc)
        self._swept = False

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
        """Every replica directory with an ``instance.json``.

        The first call of this object also stops the replica processes below its directory that no
        ``instance.json`` claims any more (their directory went with a state directory deleted while no
        controller ran): they are nobody's instances, no inventory could ever report them, and a new
        controller of the same home would otherwise leave them running for good."""
        self._reap()
        if not self._swept:
            stop_replica_processes(lambda tag: tag.is_relative_to(self._root) and not (tag / INSTANCE_FILE).exists(),
                                   (), self._grace_seconds)
            self._swept = True
        instances = []
        for meta_path in self._find_records():
            record = _read_record(meta_path)
            if record is not None:
                instances.append(self._observe(meta_path.parent, record))
        return instances

    def find_instances(self, instance_ids: Sequence[str], regions: Collection[str] = ()) -> list[Instance]:
        """The listing has no lag here: the ones of ``list_instances`` with these ids."""
        wanted = set(instance_ids)
        return [i for i in self.list_instances(regions) if i.instance_id in wanted]

    @_os_errors_are_transient
    def terminate(self, instance_ids: Sequence[str]) -> None:
        wanted = set(instance_ids)
        directories = []
        for meta_path in self._find_records():
            record = _read_record(meta_path)
            if record is not None and record.instance_id in wanted:
                directories.append(meta_path.parent)
        targets = set(directories)
        recorded = [process for process in map(find_recorded_process, directories) if process is not None]
        stop_replica_processes(targets.__contains__, [process.pid for process in recorded], self._grace_seconds)
        for directory in directories:
            with contextlib.suppress(FileNotFoundError):  # terminated meanwhile by another call
                os.replace(directory / INSTANCE_FILE, directory / TERMINATED_FILE)
            _retire_pid_file(directory)
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
        """Stop every replica process below this provider's directory, found from the process table by its
        tag (whoever started it: this object, or a controller of the same home before a restart) and every
        process this object spawned: their bookkeeping files may be gone with the state directory, so
        nothing else would find them."""
        self._reap()
        stop_replica_processes(lambda tag: tag.is_relative_to(self._root), list(self._children),
                               self._grace_seconds)
        self._reap()

    # --- helpers ---------------------------------------------------------------------------------
    def _find_records(self) -> list[Path]:
        return sorted(self._root.glob(f"*/*/{INSTANCE_FILE}")) if self._root.is_dir() else []

    def _launch_one(self, request: LaunchRequest) -> Instance:
        """Start one replica; raises ``_LaunchError`` (having removed what it made) when it cannot."""
        instance_id = f"local-{self._new_id()}"
        directory = self._root / request.service / f"{request.replica_id}-{instance_id.removeprefix('local-')}"
        with _step(f"replica directory {directory}", "cannot create it"):
            self._root.mkdir(parents=True, exist_ok=True, mode=0o700)
            (self._root / request.service).mkdir(exist_ok=True, mode=0o700)
            directory.mkdir(mode=0o700)
        try:
            with _step(f"replica directory {directory}"):  # any step below that names no field of its own
                _prepare(directory, request, self._blobs)
                with _step("PORT", "no free port on 127.0.0.1"):
                    port = procs.find_free_port()
                record = _Record(instance_id, request.service, request.replica_id, request.version,
                                 request.launch_token, port, self._clock.now())
                if self._setting_error is not None:
                    raise _LaunchError(self._setting_error)
                env = compute_replica_env(self._environ, self._passthrough, dict(request.envs), {
                    "PORT": str(port), "SKY_LITE_REPLICA_ID": str(request.replica_id),
                    "SKY_LITE_SERVICE": request.service, TAG_HOME: str(self._state_home),
                    TAG_REPLICA_DIR: str(directory)})
                bash = shutil.which("bash", path=env["PATH"])
                if bash is None:
                    raise _LaunchError(f"run: no bash on the replicas' PATH ({env['PATH']})")
                _write_json(directory / INSTANCE_FILE, record.__dict__)
                with _step("run", "cannot start bash"):
                    child = procs.spawn_detached(self._launcher(directory, bash), cwd=directory, env=env,
                                                 log_path=directory / LOG_FILE)
        except _LaunchError:
            _discard(directory)
            raise
        self._children[child.pid] = child
        return self._observe(directory, record)

    def _launcher(self, directory: Path, bash: str) -> list[str]:
        """The argv of a replica: its wrapper under the supervisor, or (where there is none) the wrapper
        writing its own pid first."""
        wrapper = [bash, str(directory / "wrapper.sh")]
        if supervisor.is_supported():
            return supervisor.supervisor_argv(directory / PID_FILE, self._grace_seconds, wrapper)
        # Without a start time: there is no /proc to read it from here (``find_recorded_process``).
        return [bash, "-c", f'echo $$ > {PID_FILE}.tmp && mv {PID_FILE}.tmp {PID_FILE} && exec "$0" "$1"', *wrapper]

    def _observe(self, directory: Path, record: _Record) -> Instance:
        recorded = procs.read_pid_file(directory / PID_FILE)
        exit_reason = _read_exit_reason(directory)
        if recorded is not None and is_recorded_replica(directory, recorded):
            state, detail = InstanceState.RUNNING, None
        elif exit_reason is not None:
            state, detail = InstanceState.EXITED, exit_reason
        elif recorded is not None:
            state, detail = InstanceState.EXITED, "killed by a signal"
        elif self._clock.now() - record.launched_at < _SPAWN_GRACE_SECONDS:
            state, detail = InstanceState.PENDING, None
        else:
            state, detail = InstanceState.EXITED, "the process never started"
        return Instance(
            instance_id=record.instance_id, service=record.service, replica_id=record.replica_id,
            version=record.version, state=state, url=f"http://127.0.0.1:{record.port}", detail=detail,
            phase=_read_phase(directory) if state is InstanceState.RUNNING else None,
        )

    def _reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]


def parse_env_passthrough(text: str) -> tuple[str, ...]:
    """The variable names of ``SKY_LITE_REPLICA_ENV_PASSTHROUGH`` (``NAME,NAME``; blanks ignored). Raises
    ``UsageError`` naming the setting for anything that is not a variable name."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"{PASSTHROUGH_SETTING}: {name!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*); "
                             "list names separated by commas")
    return names


def compute_replica_env(environ: Mapping[str, str], passthrough: Collection[str], envs: Mapping[str, str],
                        own: Mapping[str, str]) -> dict[str, str]:
    """A replica's whole environment: the base (``BASE_ENV`` and ``LC_*``) and the ``passthrough`` names of
    ``environ``, then the task's ``envs``, then ``own`` (``PORT``, the replica's ids and tags), each
    overriding the ones before. ``PATH`` falls back to the system default."""
    env = {name: value for name, value in environ.items()
           if name in BASE_ENV or name.startswith(_BASE_ENV_PREFIX) or name in passthrough}
    env.setdefault("PATH", os.defpath)
    env.update(envs)
    env.update(own)
    return env


def find_recorded_process(directory: Path) -> procs.RecordedProcess | None:
    """The process the ``pid`` file of replica ``directory`` records, if it still runs; None when there is
    no such file or its process is gone (``is_recorded_replica``). What every reader of a replica's pid file
    asks before it acts on the pid: the provider's inventory and termination, `serve down --force`,
    `serve status --pid`."""
    recorded = procs.read_pid_file(directory / PID_FILE)
    return recorded if recorded is not None and is_recorded_replica(directory, recorded) else None


def is_recorded_replica(directory: Path, recorded: procs.RecordedProcess) -> bool:
    """Whether ``recorded`` (read from the ``pid`` file of replica ``directory``) still is that replica's
    process: the same pid started at the same time. A file without a start time (one an older sky-lite
    wrote) is believed only while the process's argv names the directory's wrapper, as a replica's does."""
    if not recorded.is_alive():
        return False
    if recorded.start_time is not None:
        return True
    argv = procs.read_cmdline(recorded.pid)
    return argv is not None and str(directory / "wrapper.sh") in argv


def find_replicas_dir(home: Path, environ: Mapping[str, str]) -> Path:
    """The directory the local replicas of the state directory ``home`` live in: ``home/replicas``, or the
    absolute directory ``SKY_LITE_LOCAL_REPLICAS_DIR`` names. Several controllers on one machine sharing one
    database name the same one: this machine is then one "cloud" every controller lists, so the controller
    that takes a service over finds the replicas another launched (as controllers on AWS list one account's
    instances); with a directory each, it would see none of them and launch them all again.
    Raises ``UsageError`` (naming the setting) for a relative path."""
    named = environ.get(REPLICAS_DIR_SETTING, "")
    if not named:
        return Path(os.path.realpath(home)) / "replicas"
    if not os.path.isabs(named):
        raise UsageError(f"{REPLICAS_DIR_SETTING}={named!r}: give an absolute directory")
    return Path(os.path.realpath(named))


def find_live_replica(replicas_dir: Path, service: str, replica_id: int) -> procs.RecordedProcess | None:
    """The running process of local replica ``replica_id`` of ``service`` below ``replicas_dir``
    (``find_replicas_dir``): the leader of the replica's process group (its supervisor), so ``kill -- -PID``
    signals the whole replica. Only a replica the inventory still reports (not terminated) whose recorded
    process still runs (``find_recorded_process``); None otherwise. ``service`` must be a valid service name
    (it is a path component here)."""
    directory = replicas_dir / service
    for meta_path in sorted(directory.glob(f"{replica_id}-*/{INSTANCE_FILE}")):
        found = find_recorded_process(meta_path.parent)
        if found is not None:
            return found
    return None


def find_replica_processes(is_target: Callable[[Path], bool]) -> list[tuple[procs.ProcessInfo, Path]]:
    """Every live process whose ``SKY_LITE_REPLICA_DIR`` tag ``is_target`` accepts, with that directory.
    Reads the process table only (empty without ``/proc``); processes of other users are not seen."""
    found = []
    for process in procs.list_processes():
        environ = procs.read_environ(process.pid)
        tag = environ.get(TAG_REPLICA_DIR) if environ is not None else None
        if tag and os.path.isabs(tag) and is_target(Path(tag)):
            found.append((process, Path(tag)))
    return found


def stop_replica_processes(is_target: Callable[[Path], bool], pids: Collection[int],
                           grace_seconds: float) -> list[tuple[procs.ProcessInfo, Path]]:
    """Stop every replica process whose tag ``is_target`` accepts, all its descendants included, and the
    process groups of ``pids`` (recorded pids: replicas started before their processes were tagged, or
    where there is no ``/proc``). Returns the tagged processes that were running. Idempotent.

    SIGTERM goes once to the top of each tree (a supervisor, which passes it on to its descendants, or a
    tagged process whose supervisor is gone); after ``grace_seconds`` plus the supervisor's margin, what
    still carries a target's tag is SIGKILLed. Raises ``OSError`` only from the process table itself."""
    tagged = find_replica_processes(is_target)
    tagged_pids = {process.pid for process, _tag in tagged}
    procs.terminate_groups([pid for pid in pids if pid not in tagged_pids], grace_seconds)
    tops = [process for process, _tag in tagged if process.ppid not in tagged_pids]
    procs.stop_processes(tops, grace_seconds + _SUPERVISOR_MARGIN_SECONDS)
    procs.kill_processes([process for process, _tag in find_replica_processes(is_target)])
    return tagged


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
        run=shlex.quote(str(directory / "run.sh")), exit_file=shlex.quote(str(directory / "exit_code")),
        phase_file=shlex.quote(str(directory / PHASE_FILE))))
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


def _read_phase(directory: Path) -> Phase | None:
    try:
        return Phase((directory / PHASE_FILE).read_text().strip())
    except (OSError, ValueError):
        return None  # the wrapper has not got that far (or renames it into place right now)


def _read_record(path: Path) -> _Record | None:
    try:
        return _Record(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # renamed away meanwhile, or half-written by a crash before the rename


def _retire_pid_file(directory: Path) -> None:
    """Remove the ``pid`` file of a terminated replica once the process it records is gone: the pid may be
    another process's by then. Kept while that process still runs (a survivor of SIGKILL: another user's, or
    one stuck in the kernel), which it still names correctly."""
    if find_recorded_process(directory) is None:
        (directory / PID_FILE).unlink(missing_ok=True)


def _write_json(path: Path, value: object) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(value, sort_keys=True))
    os.replace(temporary, path)
