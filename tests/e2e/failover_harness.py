"""Three real controller processes on one PostgreSQL database, three services of the local provider, and one
controller killed with SIGKILL at a chosen point: what a trial saw. Shared by
tests/e2e/test_failover_processes.py (two trials in CI) and benchmarks/failover_bench.py (20 trials).

The set-up:

- controller ``n`` is ``python -m skyserve_lite controller run`` with a home of its own (``home0`` ...), its load
  balancers and its metrics endpoint bound to ``127.0.0.(n+2)`` (``host.json``, ``SKY_LITE_METRICS_ADDR``),
  the database in its ``db_url`` setting, a lease TTL of ``FleetSettings.lease_ttl_seconds`` (4 s) renewed
  every second, a pass every 0.5 s;
- the three controllers name one local replicas directory (``SKY_LITE_LOCAL_REPLICAS_DIR``): they stand for
  three hosts of one "cloud", this machine, which each of them must be able to list (as three controllers on
  AWS list one account's instances). With a ``replicas/`` of its own each, a controller that takes a service
  over would see none of its replicas, launch them all again, and the killed controller's would run on;
- the services are created and updated through ``api.LocalController`` (what the CLI calls) from a fourth
  home that runs no controller, and read back through the store.

A trial (``Fleet.run_trial``): create services ``a b c`` (2 replicas each) and wait until they are READY; pick
a service (and, unless the caller names one, a point) with the trial's ``random.Random``; act; kill the
service's owner (``kill -9``: its replicas and load balancers live on, as a crashed controller's do) at the
point:

- ``launch``: the service is scaled 2 -> 3; the owner is killed as soon as the store holds the new replica's
  launch intent (a row without an instance): before its launch's outcome is stored when the poll is quick
  enough (``TrialResult.in_window`` says whether each kill landed inside its step: ``is_inside_step``);
- ``rolling``: a changed ``run`` (a rolling update); killed 0-1.5 s after the first replica of the new version
  appears;
- ``scale-down``: the service is scaled 2 -> 1; killed 0-2 s after a replica starts draining.

Then wait until every service has its target of READY replicas of its current version and nothing else
(the store), and the live replica processes are exactly those the store claims; take everything down
(``request_down``) and wait until no replica or load balancer process is left; restart the killed controller
(a new loop id), so the next trial starts with three again. Watched all along (``_Watch``, every 0.25 s): no
replica id with two live replica directories at once. Checked at the end: no replica id launched twice (two
replica directories, live or not).
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from skyserve_lite import procs
from skyserve_lite.api import LocalController
from skyserve_lite.controller.host import HostSettings, write_host_settings
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.providers.local import TAG_HOME, TAG_REPLICA_DIR
from skyserve_lite.spec.parse import load_task_file
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store
from skyserve_lite.userconfig import DB_URL, set_config

from .answering import answering_run

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SERVICES = ("a", "b", "c")
POINTS = ("launch", "rolling", "scale-down")
REPLICAS = 2

_T = TypeVar("_T")

_TASK = """\
service:
  readiness_probe:
    path: /
    initial_delay_seconds: 120
  replicas: {replicas}
""" + answering_run('"generation {generation}"')


@dataclass(frozen=True)
class FleetSettings:
    lease_ttl_seconds: float = 4.0
    lease_renew_seconds: float = 1.0
    interval_seconds: float = 0.5
    drain_seconds: float = 1.5
    # Generous for a loaded 2-core machine: a replica is a Python supervisor, bash and a Python server.
    ready_timeout_seconds: float = 120.0
    converge_timeout_seconds: float = 120.0
    down_timeout_seconds: float = 90.0


@dataclass(frozen=True)
class TrialResult:
    trial: int
    point: str
    service: str
    victim: int  # the index of the controller killed
    in_window: bool  # the kill landed inside the step (``is_inside_step``)
    at_kill: str  # the service's live replicas as the victim left them: "ID:vVERSION:STATUS, ..."
    takeover_seconds: float | None  # kill -> every service of the victim's claimed by another loop
    converge_seconds: float | None  # kill -> every service at its target and no replica process unclaimed
    failed: tuple[str, ...]  # the service's replicas that ended FAILED*, with their reasons (what was replaced)
    duplicates: tuple[str, ...]  # "service/replica id" launched twice or live twice at once
    leaked: tuple[str, ...]  # replica processes the store did not claim when the trial ended
    unconverged: tuple[str, ...]  # services not at their target by the deadline, with what they had
    left_after_down: tuple[str, ...]  # processes of the fleet still running after every service was down

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.leaked or self.unconverged or self.left_after_down) and \
            self.takeover_seconds is not None and self.converge_seconds is not None

    def describe(self) -> str:
        takeover = "-" if self.takeover_seconds is None else f"{self.takeover_seconds:.2f}s"
        converge = "-" if self.converge_seconds is None else f"{self.converge_seconds:.2f}s"
        window = "inside the step" if self.in_window else "outside the step"
        text = (f"trial {self.trial}: {self.point} of {self.service}, controller {self.victim} killed {window} "
                f"[{self.at_kill}]; takeover {takeover}, converged {converge}; duplicates {len(self.duplicates)}, "
                f"leaked {len(self.leaked)}")
        for label, items in (("failed", self.failed), ("duplicates", self.duplicates), ("leaked", self.leaked),
                             ("unconverged", self.unconverged), ("left after down", self.left_after_down)):
            if items:
                text += f"\n  {label}: " + "; ".join(items)
        return text


@dataclass(frozen=True)
class ReplicaProcess:
    """A live process carrying a replica directory tag below the shared ``replicas/``."""

    pid: int
    directory: str  # "service/REPLICA-NONCE", relative to the shared replicas directory

    @property
    def key(self) -> str:
        """``service/replica id``."""
        service, name = self.directory.split("/", 1)
        return f"{service}/{name.split('-', 1)[0]}"

    @property
    def instance_id(self) -> str:
        return "local-" + self.directory.split("/", 1)[1].split("-", 1)[1]


class Fleet:
    """The controllers, their homes and the client home below ``root``. Nothing starts until ``start``;
    ``close`` kills every process of the fleet (controllers, load balancers, replicas), found by their tags."""

    def __init__(self, root: Path, db_url: str, settings: FleetSettings | None = None,
                 log: Callable[[str], None] = lambda _line: None) -> None:
        self.root = Path(os.path.realpath(root))
        self.db_url = db_url
        self.settings = settings or FleetSettings()
        self.homes = [self.root / f"home{n}" for n in range(len(ADDRESSES))]
        self.client_home = self.root / "client"
        self.replicas_root = self.root / "replicas"
        self.controllers: list[subprocess.Popen[bytes] | None] = [None] * len(ADDRESSES)
        self._log = log
        self._store: Store | None = None

    # --- life cycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.replicas_root.mkdir(parents=True, mode=0o700)
        for n, home in enumerate([*self.homes, self.client_home]):
            home.mkdir(mode=0o700)
            set_config(home, DB_URL, self.db_url)
            if n < len(ADDRESSES):
                write_host_settings(home, HostSettings(lb_host=ADDRESSES[n], endpoint_host=ADDRESSES[n]))
        self._store = Store.open(self.client_home)
        self.api = LocalController(self.client_home, start_daemon=False, stop_when_idle=False)
        for n in range(len(ADDRESSES)):
            self.start_controller(n)
        for n in range(len(ADDRESSES)):
            self.wait_controller(n)

    def start_controller(self, n: int) -> None:
        """Start controller ``n`` (``wait_controller`` waits for its first pass)."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("SKY_LITE_")}
        env.update(SKY_LITE_HOME=str(self.homes[n]), PYTHONUNBUFFERED="1",
                   SKY_LITE_LEASE_TTL_SECONDS=f"{self.settings.lease_ttl_seconds:g}",
                   SKY_LITE_LEASE_RENEW_SECONDS=f"{self.settings.lease_renew_seconds:g}",
                   SKY_LITE_CONTROLLER_INTERVAL_SECONDS=f"{self.settings.interval_seconds:g}",
                   SKY_LITE_DRAIN_SECONDS=f"{self.settings.drain_seconds:g}",
                   SKY_LITE_LOCAL_REPLICAS_DIR=str(self.replicas_root),
                   # Its metrics endpoint on its own address, as its load balancers: 127.0.0.1:30000 is one port.
                   SKY_LITE_METRICS_ADDR=f"{ADDRESSES[n]}:30000")
        logs = self.homes[n] / "logs"
        logs.mkdir(exist_ok=True, mode=0o700)
        with open(logs / "controller.log", "ab") as output:
            self.controllers[n] = subprocess.Popen(
                [sys.executable, "-m", "skyserve_lite", "controller", "run"], env=env, cwd=self.homes[n],
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_controller(self, n: int) -> None:
        """Until controller ``n`` has written its row in ``controllers`` (its first lease step: from then it
        takes its share of the services). Raises ``AssertionError`` with its log's end if it exits first."""
        process = self.controllers[n]
        assert process is not None

        def registered() -> bool:
            if process.poll() is not None:
                log = (self.homes[n] / "logs" / "controller.log").read_text(errors="replace")
                raise AssertionError(f"controller {n} exited with {process.returncode}:\n{log[-3000:]}")
            return any(loop.rsplit("-", 2)[-2] == str(process.pid) for loop in self.store.list_controllers())

        _wait(registered, 60.0, f"controller {n} (pid {process.pid}) to start")

    def kill(self, n: int) -> None:
        """SIGKILL controller ``n`` alone (what a crash does: its replicas and load balancers live on)."""
        process = self.controllers[n]
        if process is not None:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Kill every process of the fleet; safe to call after a failure at any point."""
        for process in self.controllers:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        for _ in range(20):
            left = self.fleet_processes()
            if not left:
                break
            procs.kill_processes(left, wait_seconds=1.0)
        if self._store is not None:
            self._store.close()
            self._store = None

    @property
    def store(self) -> Store:
        assert self._store is not None, "start() first"
        return self._store

    # --- what runs -------------------------------------------------------------------------------
    def fleet_processes(self) -> list[procs.ProcessInfo]:
        """Every live process tagged with one of the fleet's homes (controllers, load balancers, replicas),
        this process excluded."""
        homes = {str(home) for home in [*self.homes, self.client_home]}
        me = os.getpid()
        found = []
        for process in procs.list_processes():
            if process.pid == me:
                continue
            environ = procs.read_environ(process.pid)
            # Replicas carry it as their tag; the controllers and load balancers have it as their home.
            if environ is not None and environ.get(TAG_HOME) in homes:
                found.append(process)
        return found

    def replica_processes(self) -> list[ReplicaProcess]:
        """Every live process of a replica of the fleet, by its replica directory tag."""
        found = []
        for process in procs.list_processes():
            environ = procs.read_environ(process.pid)
            tag = environ.get(TAG_REPLICA_DIR) if environ is not None else None
            if not tag:
                continue
            prefix = f"{self.replicas_root}/"
            if tag.startswith(prefix):
                found.append(ReplicaProcess(process.pid, tag.removeprefix(prefix)))
        return found

    def launched_twice(self) -> list[str]:
        """``service/replica id`` with more than one replica directory (live or terminated): launched twice."""
        seen: dict[str, set[str]] = {}
        for path in self.replicas_root.glob("*/*/instance*.json"):  # instance.json, instance.terminated.json
            key = f"{path.parent.parent.name}/{path.parent.name.split('-', 1)[0]}"
            seen.setdefault(key, set()).add(path.parent.name)
        return sorted(f"{key} launched {len(names)} times: {', '.join(sorted(names))}"
                      for key, names in seen.items() if len(names) > 1)

    def owners(self) -> dict[str, str | None]:
        return {lease.service: lease.owner for lease in self.store.list_leases()}

    def controller_of(self, loop_id: str | None) -> int | None:
        """The index of the controller whose loop id is ``loop_id`` (``host-PID-random``)."""
        if loop_id is None:
            return None
        pid = loop_id.rsplit("-", 2)[-2]
        for n, process in enumerate(self.controllers):
            if process is not None and str(process.pid) == pid:
                return n
        return None

    # --- services --------------------------------------------------------------------------------
    def _task(self, replicas: int, generation: int) -> Path:
        path = self.root / f"task-{replicas}-{generation}.yaml"
        path.write_text(_TASK.format(replicas=replicas, generation=generation))
        return path

    def create_services(self) -> None:
        task = load_task_file(self._task(REPLICAS, 1))
        for name in SERVICES:
            self.api.create_service(name, task)

    def update(self, name: str, replicas: int, generation: int) -> None:
        self.api.submit_update(name, load_task_file(self._task(replicas, generation)), UpdateMode.ROLLING)

    def find_unconverged(self, targets: dict[str, int]) -> list[str]:
        """Services not at their target: READY replicas of the current version, nothing else live."""
        problems = []
        by_service: dict[str, list[ReplicaRecord]] = {}
        for replica in self.store.list_replicas():
            by_service.setdefault(replica.service, []).append(replica)
        for name, target in targets.items():
            service = self.store.find_service(name)
            if service is None:
                problems.append(f"{name}: gone")
                continue
            live = [r for r in by_service.get(name, []) if not r.status.is_terminal]
            good = [r for r in live if r.status is ReplicaStatus.READY and r.version == service.current_version]
            if len(good) != target or len(live) != target:
                shown = ", ".join(f"{r.replica_id}:v{r.version}:{r.status.value}" for r in live)
                problems.append(f"{name}: want {target} READY of v{service.current_version}, have [{shown}]")
        return problems

    def find_unclaimed(self) -> list[str]:
        """Replica directories with live processes whose instance no live replica row claims."""
        claimed = {r.instance_id for r in self.store.list_replicas()
                   if r.instance_id is not None and not r.status.is_terminal}
        return sorted({f"{p.directory} (pid {p.pid})" for p in self.replica_processes()
                       if p.instance_id not in claimed})

    def wait_ready(self) -> None:
        targets = dict.fromkeys(SERVICES, REPLICAS)
        _wait(lambda: not self.find_unconverged(targets) and not self.find_unclaimed(),
              self.settings.ready_timeout_seconds, lambda: "services READY: " + "; ".join(
                  self.find_unconverged(targets) + self.find_unclaimed()))
        # One service per controller: each then has something to lose (3 services, 3 live loops: a share of 1).
        with contextlib.suppress(AssertionError):
            _wait(lambda: len({o for o in self.owners().values() if o is not None}) == len(ADDRESSES), 30.0, "")

    def take_down(self) -> list[str]:
        """``serve down`` of every service; what of the fleet still runs (besides the controllers) after."""
        self.api.request_down(list(SERVICES))
        with contextlib.suppress(AssertionError):
            _wait(lambda: all(self.store.find_service(name) is None for name in SERVICES),
                  self.settings.down_timeout_seconds, "")
        gone = [name for name in SERVICES if self.store.find_service(name) is not None]
        controllers = {p.pid for p in self.controllers if p is not None and p.poll() is None}

        def others() -> list[procs.ProcessInfo]:
            return [p for p in self.fleet_processes() if p.pid not in controllers]

        with contextlib.suppress(AssertionError):
            _wait(lambda: not others(), 20.0, "")
        left = [f"service {name} still in the store" for name in gone]
        return left + [f"pid {p.pid}: {' '.join(procs.read_cmdline(p.pid) or [])[:120]}" for p in others()]

    # --- a trial ---------------------------------------------------------------------------------
    def run_trial(self, trial: int, rng: random.Random, point: str | None = None) -> TrialResult:
        """One trial (see the module docstring) at ``point`` (one of ``POINTS``; ``rng``'s choice when None);
        every controller is running again when it returns."""
        self.create_services()
        self.wait_ready()
        point = point or rng.choice(POINTS)
        service = rng.choice(SERVICES)
        targets = dict.fromkeys(SERVICES, REPLICAS)
        with _Watch(self) as watch:
            known = {r.replica_id for r in self.store.list_replicas(service)}
            if point == "launch":
                targets[service] = REPLICAS + 1
                self.update(service, REPLICAS + 1, 1)
                _poll(lambda: next((r for r in self.store.list_replicas(service)
                                    if r.replica_id not in known and r.instance_id is None), None), 30.0)
                victim, victim_loop, lost = self._kill_owner(service, rng)
            elif point == "rolling":
                self.update(service, REPLICAS, 2)
                _poll(lambda: next((r for r in self.store.list_replicas(service) if r.version == 2), None), 30.0)
                time.sleep(rng.uniform(0.0, 1.5))
                victim, victim_loop, lost = self._kill_owner(service, rng)
            else:
                targets[service] = REPLICAS - 1
                self.update(service, REPLICAS - 1, 1)
                _poll(lambda: next((r for r in self.store.list_replicas(service)
                                    if r.status is ReplicaStatus.SHUTTING_DOWN), None), 30.0)
                time.sleep(rng.uniform(0.0, 2.0))
                victim, victim_loop, lost = self._kill_owner(service, rng)
            killed_at = time.monotonic()
            # Nobody writes for the service until another loop claims it (a TTL from now): what the victim left.
            left_live = [r for r in self.store.list_replicas(service) if not r.status.is_terminal]
            at_kill = ", ".join(f"{r.replica_id}:v{r.version}:{r.status.value}" for r in left_live)
            in_window = is_inside_step(point, known, left_live)
            takeover = _poll(lambda: time.monotonic() - killed_at if all(
                self.owners().get(name) not in (None, victim_loop) for name in lost) else None,
                self.settings.lease_ttl_seconds * 5 + 30.0)
            converged = _poll(lambda: time.monotonic() - killed_at if not self.find_unconverged(targets)
                              and not self.find_unclaimed() else None, self.settings.converge_timeout_seconds)
            unconverged = tuple(self.find_unconverged(targets))
            leaked = tuple(self.find_unclaimed())
        duplicates = tuple(sorted(set(watch.duplicates) | set(self.launched_twice())))
        replaced = tuple(f"{r.replica_id}:v{r.version}:{r.status.value} ({r.status_reason})"
                         for r in self.store.list_replicas(service) if r.status.is_terminal)
        left = tuple(self.take_down())
        self.start_controller(victim)
        self.wait_controller(victim)
        return TrialResult(trial, point, service, victim, in_window, at_kill, takeover, converged, replaced,
                           duplicates, leaked, unconverged, left)

    def _kill_owner(self, service: str, rng: random.Random) -> tuple[int, str | None, list[str]]:
        """Kill the controller that owns ``service`` now (a random one if none does): its index, its loop id
        and the services it owned."""
        owners = self.owners()
        victim = self.controller_of(owners.get(service))
        if victim is None:
            victim = rng.randrange(len(ADDRESSES))
        process = self.controllers[victim]
        assert process is not None
        loop = next((o for o in owners.values() if o is not None and o.rsplit("-", 2)[-2] == str(process.pid)),
                    None)
        self.kill(victim)
        lost = [name for name, owner in owners.items() if owner is not None and owner == loop]
        self._log(f"  killed controller {victim} (pid {process.pid}) owning {lost}")
        return victim, loop, lost


class _Watch:
    """Samples the replica processes every 0.25 s in a thread while the trial runs: a replica id with two
    live replica directories at one moment is a duplicate."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-watch", daemon=True)
        self.duplicates: list[str] = []

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            directories: dict[str, set[str]] = {}
            for process in self._fleet.replica_processes():
                directories.setdefault(process.key, set()).add(process.directory)
            for key, found in directories.items():
                if len(found) > 1:
                    self.duplicates.append(f"{key} live twice: {', '.join(sorted(found))}")


def summarize(results: Sequence[TrialResult]) -> list[str]:
    """The lines of a summary: trials, failures, takeover and convergence times (min / median / max)."""
    lines = [f"{len(results)} trials: {sum(r.ok for r in results)} ok; duplicates "
             f"{sum(len(r.duplicates) for r in results)}, leaked {sum(len(r.leaked) for r in results)}, "
             f"unconverged {sum(len(r.unconverged) for r in results)}, left after down "
             f"{sum(len(r.left_after_down) for r in results)}"]
    for label, values in (("takeover", [r.takeover_seconds for r in results]),
                          ("converged", [r.converge_seconds for r in results])):
        known = sorted(v for v in values if v is not None)
        if known:
            lines.append(f"{label} after the kill: min {known[0]:.2f}s, median {_median(known):.2f}s, "
                         f"max {known[-1]:.2f}s")
    lines.append("kills (inside the step / all): " + ", ".join(
        f"{point} {sum(r.in_window for r in results if r.point == point)}/"
        f"{sum(r.point == point for r in results)}" for point in POINTS))
    return lines


def is_inside_step(point: str, known: Collection[int], live: Sequence[ReplicaRecord]) -> bool:
    """Whether a kill that left ``live`` (the service's live replicas; ``known``: the replica ids before the
    step) landed inside its step: ``launch``, the new replica's intent has no instance yet; ``rolling``,
    replicas of both versions are live; ``scale-down``, a replica is still being shut down."""
    if point == "launch":
        return any(r.replica_id not in known and r.instance_id is None for r in live)
    if point == "rolling":
        return len({r.version for r in live}) > 1
    return any(r.status is ReplicaStatus.SHUTTING_DOWN for r in live)


def _median(values: Sequence[float]) -> float:
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def _poll(probe: Callable[[], _T | None], timeout: float, every: float = 0.01) -> _T | None:
    """``probe()`` until it returns something other than None (returned) or ``timeout`` passes (None)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(every)


def _wait(condition: Callable[[], bool], timeout: float, message: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for "
                                 f"{message() if callable(message) else message}")
        time.sleep(0.2)


@contextlib.contextmanager
def running_fleet(root: Path, db_url: str, settings: FleetSettings | None = None,
                  log: Callable[[str], None] = lambda _line: None) -> Iterator[Fleet]:
    """A started ``Fleet``, closed (every process of it killed) however the block ends."""
    fleet = Fleet(root, db_url, settings, log)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.close()

