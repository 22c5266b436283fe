"""A load balancer on two worker processes (``SKY_LITE_LB_WORKERS=2``, ``lb.workers``), as the controller
starts it (``python -m skyserve_lite.lb`` over a real state store), in front of a replica on 127.0.0.1:
what is the load balancer's as a whole stays so (one rate per client, one per-client connection limit, one
endpoint record, one set of metrics), and the processes live and die together."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skyserve_lite.lb.metrics_file import metrics_dir, read_snapshots
from skyserve_lite.procs import find_free_port
from skyserve_lite.state.store import Store
from tests.lb.test_guarded_endpoint import (
    AUTH_TASK,
    BURST,
    KEY_1,
    KEY_2,
    LIMITED_TASK,
    Replica,
    add_ready_replica,
    replica,
    submit,
)
from tests.lb.test_limits import (
    _IDLE_CONNECTIONS,
    _LB_OPEN_FILES,
    _REQUESTS,
    _IdleClient,
    _open_files_for_the_test,
    _requests_answered_200,
)

__all__ = ["replica"]  # the fixture, used by name

if not sys.platform.startswith("linux"):
    pytest.skip("reads worker processes from /proc", allow_module_level=True)


def children_of(pid: int) -> set[int]:
    """The processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def _limit_open_files(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Lb:
    """A load balancer process for svc in ``home`` with two workers; its log goes to a file."""

    def __init__(self, home: Path, log: Path, open_files: int | None = None, **settings: str) -> None:
        self.home, self.port, self.log_path = home, find_free_port(), log
        environ = {key: value for key, value in os.environ.items() if not key.startswith("SKY_LITE_LB_")}
        with log.open("wb") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "skyserve_lite.lb", "--home", str(home), "--service", "svc",
                 "--port", str(self.port)],
                stdout=subprocess.DEVNULL, stderr=log_file,
                preexec_fn=None if open_files is None else functools.partial(_limit_open_files, open_files),
                env={**environ, "PYTHONUNBUFFERED": "1", "SKY_LITE_LB_WORKERS": "2", **settings})
        wait_for(lambda: self._answers() or self.process.poll() is not None, "the load balancer to answer")
        assert self.process.poll() is None, self.log()
        wait_for(lambda: len(self.workers()) == 2, "two workers")

    def _answers(self) -> bool:
        try:
            connection = self.connection()
        except OSError:
            return False
        try:
            return connection.get("/health")[0] > 0
        except OSError:
            return False
        finally:
            connection.close()

    def connection(self, source: str = "127.0.0.1") -> Connection:
        return Connection(self.port, source)

    def workers(self) -> set[int]:
        return children_of(self.process.pid)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


class Connection:
    """One kept-alive client connection."""

    def __init__(self, port: int, source: str = "127.0.0.1") -> None:
        self._http = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
        self._http.connect()

    def get(self, path: str = "/v1/models", key: str | None = None) -> tuple[int, dict[str, str]]:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        self._http.request("GET", path, headers=headers)
        response = self._http.getresponse()
        response.read()
        return response.status, {name.lower(): value for name, value in response.getheaders()}

    def close(self) -> None:
        self._http.close()


@pytest.fixture
def lb_of(tmp_path: Path, replica: Replica) -> Iterator[Callable[..., Lb]]:
    started: list[Lb] = []

    def start(task: str = AUTH_TASK, open_files: int | None = None, **settings: str) -> Lb:
        home = tmp_path / "home"
        submit(home, task, (KEY_1, KEY_2))
        add_ready_replica(home, replica.port)
        lb = Lb(home, tmp_path / "lb.log", open_files, **settings)
        started.append(lb)
        return lb

    yield start
    for lb in started:
        with contextlib.suppress(Exception):
            lb.stop()
        for worker in lb.workers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)


def test_a_client_on_two_workers_gets_its_rate_once(lb_of: Callable[..., Lb]) -> None:
    lb = lb_of(LIMITED_TASK)
    # Two connections open at once: each on its own worker (a new one goes to the worker holding fewer).
    first, second = lb.connection(), lb.connection()
    try:
        statuses = [(first if n % 2 else second).get(key=KEY_1)[0] for n in range(BURST + 3)]
    finally:
        first.close()
        second.close()
    # burst + 1 in all, as from one process; two separate buckets would have given 2 * (burst + 1).
    assert statuses == [200] * (BURST + 1) + [429, 429]


def test_the_per_client_connection_limit_holds_across_workers_and_comes_back_when_one_closes(
        lb_of: Callable[..., Lb]) -> None:
    lb = lb_of(SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT="3")
    held = [socket.create_connection(("127.0.0.1", lb.port)) for _ in range(3)]  # idle: spread on both workers
    try:
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", lb.port), timeout=10) as refused:
            refused.sendall(b"GET / HTTP/1.1\r\nHost: svc\r\n\r\n")
            answer = refused.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT" in answer
        other = lb.connection("127.0.0.2")  # another address has its own limit
        assert other.get(key=KEY_1)[0] == 200
        other.close()
        held.pop().close()  # the worker that held it tells the parent, which admits the next one
        wait_for(lambda: _served(lb), "a place to come free")
    finally:
        for sock in held:
            sock.close()


def _served(lb: Lb) -> bool:
    connection = lb.connection()
    try:
        return connection.get(key=KEY_1)[0] == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def test_a_killed_worker_is_started_again_and_the_endpoint_keeps_answering(lb_of: Callable[..., Lb]) -> None:
    lb = lb_of()
    before = lb.workers()
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    # A connection handed over in the instant before the kill dies with the worker, as with one process;
    # once the parent knows, new connections go to the survivor (the worker started again gets them only
    # once it serves, or when the survivor cannot take them).
    wait_for(lambda: "exited with status -9" in lb.log(), "the parent to see the worker die")
    for _ in range(20):
        connection = lb.connection()
        assert connection.get(key=KEY_1)[0] == 200
        connection.close()
    wait_for(lambda: len(lb.workers()) == 2 and victim not in lb.workers(), "the worker to be started again")
    assert lb.stop() == 0


def test_a_worker_stopped_by_hand_is_started_again_and_the_load_balancer_goes_on(lb_of: Callable[..., Lb]) -> None:
    lb = lb_of()
    victim = min(lb.workers())
    os.kill(victim, signal.SIGTERM)  # a clean stop, but not the service's end: only status 0 is that
    wait_for(lambda: len(lb.workers()) == 2 and victim not in lb.workers(), "the worker to be started again")
    assert lb.process.poll() is None
    assert _served(lb)
    assert lb.stop() == 0


def test_the_workers_stop_when_their_parent_is_killed(lb_of: Callable[..., Lb]) -> None:
    lb = lb_of()
    workers = lb.workers()
    lb.process.kill()
    lb.process.wait(timeout=10)

    def gone() -> bool:
        return not any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in workers)

    wait_for(gone, "the workers to stop")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_sigterm_stops_all_of_it_and_its_record_and_metrics_are_one_load_balancers(lb_of: Callable[..., Lb]) -> None:
    lb = lb_of()
    identity = lb.connection()
    status, _ = identity.get("/.sky-lite/identity")
    assert status == 200
    identity.close()
    # Every connection so far released (a worker tells the parent within a loop turn): the next two, open at
    # once, go one to each worker.
    time.sleep(0.5)
    first, second = lb.connection(), lb.connection()
    for _ in range(5):
        assert first.get(key=KEY_1)[0] == 200
        assert second.get(key=KEY_1)[0] == 200
    for connection in (first, second):
        connection.close()
    store = Store.open(lb.home, create=False)
    try:
        [endpoint] = store.list_lb_endpoints_of(["svc"])["svc"]
        assert endpoint.pid == lb.process.pid  # the parent owns the port and the record
    finally:
        store.close()

    def replica_answers() -> int:
        paths = sorted(metrics_dir(lb.home).glob("svc*.json"))
        return sum(count for snapshot in read_snapshots(paths) for _, replica, code, count in snapshot.requests
                   if code == "2xx" and replica)

    wait_for(lambda: replica_answers() == 10, "both workers' metrics files to count the 10 answers")
    paths = sorted(metrics_dir(lb.home).glob("svc*.json"))
    assert [path.name for path in paths] == ["svc.worker-0.json", "svc.worker-1.json"]
    served = {snapshot.worker: sum(count for _, replica, code, count in snapshot.requests if replica)
              for snapshot in read_snapshots(paths)}
    assert served == {0: 5, 1: 5}  # the two connections, one on each worker
    workers = lb.workers()
    assert lb.stop() == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    assert list(metrics_dir(lb.home).glob("svc*.json")) == []
    store = Store.open(lb.home, create=False)
    try:
        assert store.list_lb_endpoints_of(["svc"]).get("svc", ()) == ()
    finally:
        store.close()


@pytest.mark.timeout(180)
def test_a_client_holding_2000_idle_connections_cannot_lock_another_client_out_of_two_workers(
        lb_of: Callable[..., Lb]) -> None:
    """As tests/lb/test_limits.py's test for one process: the parent refuses the idle client beyond its share,
    and each worker closes its longest idle connections to make room within its half of the limit."""
    with _open_files_for_the_test(_IDLE_CONNECTIONS + 1_000):
        lb = lb_of(AUTH_TASK.replace("  auth: {api_keys: [API_KEY, PARTNER_KEY]}\n", ""), _LB_OPEN_FILES,
                   SKY_LITE_LB_HEAD_SECONDS="2")

        async def body() -> list[int | str]:
            idle = _IdleClient(lb.port, "127.0.0.2", _IDLE_CONNECTIONS)
            holding = asyncio.create_task(idle.run())
            try:
                deadline = time.monotonic() + 60
                while idle.opened < _IDLE_CONNECTIONS:
                    assert time.monotonic() < deadline, f"only {idle.opened} idle connections opened"
                    await asyncio.sleep(0.1)
                return await _requests_answered_200(f"http://127.0.0.1:{lb.port}/", "127.0.0.1")
            finally:
                idle.stop.set()
                await asyncio.wait_for(holding, 30)

        results = asyncio.run(body())
    answered = sum(1 for result in results if result == 200)
    assert answered >= 0.99 * _REQUESTS, f"{answered}/{_REQUESTS} answered 200\n{lb.log()}"
    log = lb.log()
    assert "at most 240 client connections" in log  # each worker's half of the 480
    assert "SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT" in log  # the parent refused the idle client beyond 120
    assert lb.stop() == 0
