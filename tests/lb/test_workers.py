"""The pieces of a load balancer on several processes (``lb.workers``, ``lb.buckets``): the pure decisions as
tables, the parent's pool against fake worker processes over real Unix sockets, and the shared bucket table
against the local store it stands in for."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.controller.metrics import compute_lb_families, render_text
from skyserve_lite.errors import UsageError
from skyserve_lite.lb.buckets import (
    PROBE,
    SLACK,
    LocalBuckets,
    SharedBuckets,
    compute_table_slots,
    compute_take,
    make_shared_table,
)
from skyserve_lite.lb.metrics_file import LatencyRow, LbSnapshot
from skyserve_lite.lb.settings import WorkerSetting, compute_worker_count, workers_from_env
from skyserve_lite.lb.workers import (
    READY_TOKEN,
    ExitPlan,
    WorkerPool,
    compute_exit_status,
    compute_restart_delay,
    compute_share,
    decode_tokens,
    encode_tokens,
    pick_worker,
    plan_worker_exit,
)
from tests.metrics_helpers import parse_samples, sample

REPO = Path(__file__).resolve().parents[2]


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


# -- decisions --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("open_connections", "order"), [
    ([0, 0], [0, 1]),
    ([3, 1, 2], [1, 2, 0]),
    ([None, 5], [1]),  # not running: never offered
    ([2, None, 2], [0, 2]),
    ([None, None], []),
    ([], []),
])
def test_pick_worker_offers_the_running_ones_by_fewest_connections(
        open_connections: list[int | None], order: list[int]) -> None:
    assert pick_worker(open_connections) == order


@pytest.mark.parametrize(("open_connections", "ready", "order"), [
    ([5, 0], [True, False], [0, 1]),  # one starting (again) gets what the serving ones cannot take
    ([5, 0, 2], [True, False, True], [2, 0, 1]),
    ([0, 0], [False, False], [0, 1]),  # all starting: they queue it
])
def test_pick_worker_prefers_workers_that_serve(
        open_connections: list[int | None], ready: list[bool], order: list[int]) -> None:
    assert pick_worker(open_connections, ready) == order


@pytest.mark.parametrize(("stopping", "starting", "status", "plan"), [
    (True, False, -9, ExitPlan.NOTHING),
    (True, True, 1, ExitPlan.NOTHING),
    (False, True, 1, ExitPlan.FAIL),  # the first start: no API keys, say
    (False, True, 0, ExitPlan.FAIL),
    (False, False, 0, ExitPlan.FINISH),  # stopped on its own: the service is gone
    (False, False, 1, ExitPlan.RESTART),  # a later failure, even before it served again: recovered from
    (False, False, -9, ExitPlan.RESTART),
])
def test_plan_worker_exit(stopping: bool, starting: bool, status: int, plan: ExitPlan) -> None:
    assert plan_worker_exit(stopping, starting, status) is plan


@pytest.mark.parametrize(("status", "exit_status"), [(0, 0), (1, 1), (-9, 137), (-15, 143)])
def test_a_worker_killed_by_a_signal_exits_as_a_shell_shows_it(status: int, exit_status: int) -> None:
    assert compute_exit_status(status) == exit_status


@pytest.mark.parametrize(("max_connections", "workers", "share"), [
    (480, 2, 240), (481, 2, 241), (10_000, 3, 3_334), (1, 2, 1), (5, 1, 5),
])
def test_each_worker_holds_its_share_rounded_up(max_connections: int, workers: int, share: int) -> None:
    assert compute_share(max_connections, workers) == share


@pytest.mark.parametrize(("quick_deaths", "delay"), [(0, 0.0), (1, 0.5), (2, 1.0), (4, 4.0), (7, 30.0), (50, 30.0)])
def test_a_worker_dying_again_and_again_waits_longer_each_time(quick_deaths: int, delay: float) -> None:
    assert compute_restart_delay(quick_deaths) == delay


@pytest.mark.parametrize(("setting", "cpus", "can_hand_off", "compiled", "count"), [
    (1, 8, True, True, 1),
    (4, 2, True, False, 4),  # as set, whatever the build
    ("auto", 8, True, False, 8),
    ("auto", 0, True, True, 1),
    ("default", 8, True, True, 2),  # compiled: a second process fills the CPU one leaves idle
    ("default", 1, True, True, 1),
    ("default", 8, True, False, 1),  # interpreted: a second process only costs CPU
    (4, 8, False, True, 1),  # no hand-off (not Linux): one process
    ("auto", 8, False, True, 1),
])
def test_worker_count(setting: WorkerSetting, cpus: int, can_hand_off: bool, compiled: bool, count: int) -> None:
    assert compute_worker_count(setting, cpus, can_hand_off, compiled) == count


@pytest.mark.parametrize(("value", "expected"), [
    (None, "default"), ("", "default"), ("2", 2), (" auto ", "auto"), ("AUTO", "auto"),
])
def test_workers_from_the_environment(value: str | None, expected: WorkerSetting) -> None:
    environ = {} if value is None else {"SKY_LITE_LB_WORKERS": value}
    assert workers_from_env(environ) == expected


@pytest.mark.parametrize("value", ["0", "two", "1.5", "-1"])
def test_an_invalid_worker_count_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(UsageError, match="SKY_LITE_LB_WORKERS"):
        workers_from_env({"SKY_LITE_LB_WORKERS": value})


def test_tokens_round_trip_and_a_partial_one_is_ignored() -> None:
    tokens = [READY_TOKEN, 1, 2**63 + 5]
    assert decode_tokens(encode_tokens(tokens)) == tokens
    assert decode_tokens(encode_tokens([7]) + b"\x00\x01") == [7]


# -- the parent's pool, with fake worker processes --------------------------------------------------------

class FakeWorker:
    """A started worker: its end of the control socket, and an exit the test decides."""

    def __init__(self, pid: int, control: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.control = control
        self.signals: list[int] = []
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        self.returncode = await self._exit
        return self.returncode

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)
        self.exit(0)

    def exit(self, status: int) -> None:
        if not self._exit.done():
            self.control.close()
            self._exit.set_result(status)

    def ready(self) -> None:
        self.control.send(encode_tokens([READY_TOKEN]))

    def received(self) -> list[tuple[int, socket.socket]]:
        """The connections handed over so far: (token, socket)."""
        got: list[tuple[int, socket.socket]] = []
        self.control.setblocking(False)
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self.control, 8, 1)
            except BlockingIOError:
                return got
            got.append((decode_tokens(message)[0], socket.socket(fileno=fds[0])))

    def release(self, tokens: Sequence[int]) -> None:
        self.control.send(encode_tokens(tokens))


class FakeSpawner:
    def __init__(self) -> None:
        self.started: list[tuple[int, FakeWorker]] = []  # (index, worker), in order

    async def __call__(self, index: int, control: socket.socket) -> FakeWorker:
        worker = FakeWorker(1000 + len(self.started), socket.socket(fileno=os.dup(control.fileno())))
        self.started.append((index, worker))
        return worker

    def latest(self, index: int) -> FakeWorker:
        return [worker for each, worker in self.started if each == index][-1]


async def _started(spawner: FakeSpawner, count: int, seconds: float = 3) -> None:
    for _ in range(int(seconds * 100)):
        if len(spawner.started) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(spawner.started)} workers started, not {count}")


async def _serving_pool(count: int) -> tuple[FakeSpawner, WorkerPool]:
    """A pool of ``count`` fake workers, each started and serving."""
    spawner = FakeSpawner()
    pool = WorkerPool(count, spawner, "test")
    starting = asyncio.ensure_future(pool.start())
    await _settle()
    for _, worker in spawner.started:
        worker.ready()
    assert await starting is True
    return spawner, pool


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.005)


@pytest.fixture
def client_sockets() -> Iterator[Callable[[], socket.socket]]:
    made: list[socket.socket] = []

    def make() -> socket.socket:
        a, b = socket.socketpair()
        made.extend((a, b))
        return a

    yield make
    for sock in made:
        sock.close()


def test_connections_go_to_the_worker_with_fewest_and_are_released_by_token(
        client_sockets: Callable[[], socket.socket]) -> None:
    async def body() -> None:
        spawner = FakeSpawner()
        pool = WorkerPool(2, spawner, "test")
        starting = asyncio.ensure_future(pool.start())
        await _settle()
        assert not starting.done()  # waits for both to say they serve
        spawner.latest(0).ready()
        spawner.latest(1).ready()
        assert await starting is True
        released: list[str] = []
        for name in ("a", "b", "c"):
            assert pool.hand_off(client_sockets(), lambda name=name: released.append(name))  # type: ignore[misc]
        first, second = spawner.latest(0).received(), spawner.latest(1).received()
        assert [len(first), len(second)] == [2, 1]  # a -> 0, b -> 1, c -> 0 (the lower index among equals)
        assert [worker.open_connections for worker in pool.workers] == [2, 1]
        spawner.latest(0).release([first[0][0]])
        await _settle()
        assert released == ["a"]
        assert [worker.open_connections for worker in pool.workers] == [1, 1]
        await pool.stop()
        assert all(worker.signals for _, worker in spawner.started)

    _run(body)


def test_a_dead_worker_releases_its_connections_and_is_started_again(
        client_sockets: Callable[[], socket.socket]) -> None:
    async def body() -> None:
        spawner, pool = await _serving_pool(2)
        released: list[int] = []
        for number in range(4):
            pool.hand_off(client_sockets(), lambda number=number: released.append(number))  # type: ignore[misc]
        spawner.latest(1).exit(-9)  # killed, after it served
        await _settle()
        assert sorted(released) == [1, 3]  # what it held, and nothing of worker 0's
        assert len(spawner.started) == 2  # it died soon after its start: the next waits 0.5 s
        await _started(spawner, 3)
        assert spawner.started[-1][0] == 1
        assert not pool.finished.is_set()
        assert pool.hand_off(client_sockets(), lambda: None)
        await pool.stop()

    _run(body)


@pytest.mark.parametrize(("status", "ready_first", "exit_status"), [
    (1, False, 1),  # could not start (no API keys): the load balancer exits as one that could not
    (0, True, 0),   # stopped on its own after serving: the service is gone
])
def test_a_worker_that_never_served_or_stopped_on_its_own_ends_the_pool(
        status: int, ready_first: bool, exit_status: int) -> None:
    async def body() -> None:
        spawner = FakeSpawner()
        pool = WorkerPool(2, spawner, "test")
        starting = asyncio.ensure_future(pool.start())
        await _settle()
        if ready_first:
            for _, worker in spawner.started:
                worker.ready()
            assert await starting is True
        spawner.latest(0).exit(status)
        await asyncio.wait_for(pool.finished.wait(), 5)
        if not ready_first:
            assert await starting is False
        assert pool.exit_status == exit_status
        assert len(spawner.started) == 2  # nothing started again
        await pool.stop()

    _run(body)


def test_a_restarted_worker_failing_before_it_serves_is_started_again_not_the_end(
        client_sockets: Callable[[], socket.socket]) -> None:
    async def body() -> None:
        spawner, pool = await _serving_pool(2)
        spawner.latest(1).exit(-9)
        await _started(spawner, 3)  # after 0.5 s
        assert pool.hand_off(client_sockets(), lambda: None)
        assert len(spawner.latest(0).received()) == 1  # to the one serving, not the one starting
        spawner.latest(1).exit(1)  # the new one fails before it serves (keys unreadable for a moment, say)
        await _settle()
        assert not pool.finished.is_set()
        await pool.stop()  # gives up the restart waiting out its delay, at once
        assert len(spawner.started) == 3

    _run(body)


def test_a_restart_that_cannot_make_a_process_is_tried_again() -> None:
    async def body() -> None:
        spawner = FakeSpawner()
        failures = [OSError(11, "Resource temporarily unavailable")]

        async def spawn(index: int, control: socket.socket) -> FakeWorker:
            if len(spawner.started) >= 2 and failures:
                raise failures.pop()
            return await spawner(index, control)

        pool = WorkerPool(1, spawn, "test")
        starting = asyncio.ensure_future(pool.start())
        await _settle()
        spawner.latest(0).ready()
        await starting
        spawner.latest(0).exit(-9)
        await _started(spawner, 2)  # 0.5 s later
        spawner.latest(0).ready()
        spawner.latest(0).exit(-9)  # dies again: the next start fails once (1 s later), then works (2 s later)
        await _started(spawner, 3, seconds=6)
        assert not failures
        assert not pool.finished.is_set()
        await pool.stop()

    _run(body)


def test_no_running_worker_means_the_connection_is_refused(client_sockets: Callable[[], socket.socket]) -> None:
    async def body() -> None:
        pool = WorkerPool(1, FakeSpawner(), "test")
        assert pool.hand_off(client_sockets(), lambda: None) is False

    _run(body)


# -- the shared bucket table ------------------------------------------------------------------------------

@pytest.mark.parametrize(("tat", "now", "wait", "new_tat"), [
    (None, 10.0, -2.0, 10.5),  # no bucket: full
    (9.0, 10.0, -2.0, 10.5),   # past: full again
    (11.5, 10.0, -0.5, 12.0),  # within the tolerance
    (12.0, 10.0, 0.0, 12.5),   # exactly at it
    (12.5, 10.0, 0.5, None),   # beyond: limited, unchanged
])
def test_compute_take(tat: float | None, now: float, wait: float, new_tat: float | None) -> None:
    assert compute_take(tat, now, 0.5, 2.0) == (wait, new_tat)


@pytest.mark.parametrize(("max_buckets", "slots"), [(1, 8), (4, 8), (5, 16), (50_000, 131_072), (65_536, 131_072)])
def test_table_slots(max_buckets: int, slots: int) -> None:
    assert compute_table_slots(max_buckets) == slots


@pytest.fixture
def table_fd() -> Iterator[int]:
    fd = make_shared_table(64)
    yield fd
    os.close(fd)


def _burst(store: LocalBuckets | SharedBuckets, key: tuple[int, str | bytes], times: Sequence[float]) -> list[bool]:
    return [store.take(key, now, 1.0, 2.0) <= SLACK for now in times]


def test_two_views_of_one_table_count_against_one_bucket_as_one_local_store_does(table_fd: int) -> None:
    first, second = SharedBuckets(table_fd, b"limits"), SharedBuckets(table_fd, b"limits")
    local = LocalBuckets(100)
    times = [0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    expected = _burst(local, (0, "203.0.113.7"), times)
    got = [(first if n % 2 else second).take((0, "203.0.113.7"), now, 1.0, 2.0) <= SLACK
           for n, now in enumerate(times)]
    assert got == expected == [True, True, True, False, False, True, False]
    assert _burst(second, (0, "198.51.100.1"), [0.0]) == [True]  # another client: its own bucket
    assert _burst(second, (1, "203.0.113.7"), [1.0]) == [True]  # another limit: its own bucket
    assert _burst(SharedBuckets(table_fd, b"new limits"), (0, "203.0.113.7"), [1.0]) == [True]  # fresh buckets
    assert _burst(first.with_salt(b"limits"), (0, "203.0.113.7"), [1.0]) == [False]  # one mapping, same table
    assert len(first) == 4


def test_a_full_window_gives_up_a_bucket_full_again_first_then_the_nearest_to_full(table_fd: int) -> None:
    store = SharedBuckets(table_fd, b"limits")
    slots = 64
    # Keys whose digests start at the same place, enough to fill one probe window and one more.
    same_place: list[tuple[int, str | bytes]] = []
    n = 0
    while len(same_place) < PROBE + 1:
        key: tuple[int, str | bytes] = (0, f"10.0.{n >> 8 & 255}.{n & 255}")
        if store.digest(key) % slots == 0:
            same_place.append(key)
        n += 1
    for index, key in enumerate(same_place[:PROBE]):
        assert store.take(key, 0.0, 1.0 + index, 0.0) <= SLACK  # tat 1, 2, ... 8: all in the window
    # The ninth takes the entry nearest to full (tat 1, the first key's): that key has a fresh bucket again.
    assert store.take(same_place[PROBE], 0.0, 1.0, 0.0) <= SLACK
    assert store.take(same_place[0], 0.0, 1.0, 0.0) <= SLACK
    assert store.take(same_place[PROBE - 1], 0.0, 1.0, 0.0) > SLACK  # the others kept theirs
    assert len(store) == PROBE


def test_a_table_that_is_not_whole_entries_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "table"
    path.write_bytes(b"\0" * 100)
    with path.open("rb+") as handle, pytest.raises(ValueError, match="whole entries"):
        SharedBuckets(handle.fileno(), b"x")


def test_processes_taking_from_one_bucket_at_once_never_get_more_than_the_burst(table_fd: int) -> None:
    """Four processes race for one bucket from one moment on (burst 9,999, nothing refills, 20,000 tries):
    10,000 are allowed in all, which the lock guarantees (unlocked, two processes read the same tat and
    both count)."""
    script = textwrap.dedent("""
        import sys
        from skyserve_lite.lb.buckets import SLACK, SharedBuckets
        store = SharedBuckets(int(sys.argv[1]), b"limits")
        print("ready", flush=True)
        sys.stdin.readline()  # all four go at once
        print(sum(store.take((0, "203.0.113.7"), 0.0, 1.0, 9_999.0) <= SLACK for _ in range(5_000)))
    """)
    processes = [subprocess.Popen([sys.executable, "-c", script, str(table_fd)], pass_fds=(table_fd,), cwd=REPO,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    allowed = [int(process.communicate(timeout=60)[0]) for process in processes]
    assert sum(allowed) == 10_000, allowed


# -- the workers' metrics, a series each ---------------------------------------------------------------

def _snapshot(service: str, pid: int, requests: int, worker: int | None) -> LbSnapshot:
    return LbSnapshot(
        service=service, pid=pid, written_at=float(pid),
        requests=((1, "http://r1", "2xx", requests),), failures=(),
        latency=(LatencyRow(1, "http://r1", (requests,) + (0,) * 13, 0.5 * requests),),
        in_flight=(("http://r1", 1),), waiting=1, retries=2, ejections=1, ejected=0, worker=worker)


def test_each_worker_has_its_own_series_and_a_lone_process_none_beside_them() -> None:
    samples = parse_samples(render_text(compute_lb_families(
        [_snapshot("svc", 1, 10, 0), _snapshot("svc", 2, 5, 1), _snapshot("other", 9, 7, None)])))
    requests = "skylite_lb_requests_total"
    replica = {"version": "1", "replica": "http://r1", "code": "2xx"}
    assert sample(samples, requests, service="svc", **replica, worker="0") == 10
    assert sample(samples, requests, service="svc", **replica, worker="1") == 5
    assert sample(samples, requests, service="other", **replica, worker="") == 7
    assert sample(samples, "skylite_lb_up", service="svc", worker="1") == 1
    # A worker started again counts from 0 in its own series: the other's stays as it was (no false reset).
    again = parse_samples(render_text(compute_lb_families([_snapshot("svc", 1, 11, 0), _snapshot("svc", 3, 0, 1)])))
    assert sample(again, requests, service="svc", **replica, worker="0") == 11


def test_without_workers_the_families_keep_their_labels() -> None:
    samples = parse_samples(render_text(compute_lb_families([_snapshot("svc", 1, 10, None)])))
    assert sample(samples, "skylite_lb_requests_total", service="svc", version="1", replica="http://r1",
                  code="2xx") == 10
    assert all("worker" not in dict(labels) for _, labels in samples)


# -- the parent's refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("over_tls", "answer"), [(False, b"HTTP/1.1 503 "), (True, b"")])
def test_a_parent_refuses_a_client_over_its_limit_with_a_503_or_over_tls_a_bare_close(
        over_tls: bool, answer: bytes) -> None:
    """A parent has no TLS context of its own (its workers do): ``over_tls`` tells it a refusal must be a close,
    as a TLS client could not read a plain 503."""
    from skyserve_lite.lb.listener import Listener

    async def body() -> None:
        handed: list[socket.socket] = []

        def hand_off(connection: socket.socket, release: Callable[[], None]) -> bool:
            handed.append(connection)  # held, as a worker would hold it
            return True

        listener = Listener(lambda release: asyncio.Protocol(), b"HTTP/1.1 503 none\r\n\r\n", "test", 100,
                            max_per_client=1, client_refusal=b"HTTP/1.1 503 over the limit\r\n\r\n",
                            hand_off=hand_off, over_tls=lambda: over_tls)
        [(_, port)] = listener.start("127.0.0.1", 0)
        try:
            first = await asyncio.open_connection("127.0.0.1", port)
            await _settle()
            assert len(handed) == 1
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            got = await asyncio.wait_for(reader.read(), 5)
            assert got.startswith(answer) and (answer or got == b"")
            writer.close()
            first[1].close()
        finally:
            listener.close()
            for sock in handed:
                sock.close()

    _run(body)


def test_the_salt_follows_the_limits_and_is_the_same_in_every_process() -> None:
    from skyserve_lite.lb.buckets import compute_salt
    from skyserve_lite.spec.model import RateLimit

    limits = (RateLimit(2.0, "/v1/", 5),)
    assert compute_salt(limits) == compute_salt((RateLimit(2.0, "/v1/", 5),))
    assert compute_salt(limits) != compute_salt((RateLimit(2.0, "/v1/", 6),))
    script = "from skyserve_lite.lb.buckets import compute_salt; from skyserve_lite.spec.model import RateLimit; " \
             "print(compute_salt((RateLimit(2.0, '/v1/', 5),)).hex())"
    other = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"})
    assert other.stdout.strip() == compute_salt(limits).hex()
