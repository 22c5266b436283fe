"""``service.auth`` and ``service.rate_limits`` enforced by a real load balancer process
(``python -m skyserve_lite.lb``) over a real state store, in front of a replica on 127.0.0.1; each test runs
with one process and with two workers (``lb.workers``), where each request's new connection may land on
either worker: the answers must not depend on which (tests/lb/test_workers_e2e.py pins two connections to
the two workers for the shared rate limit)."""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from multidict import CIMultiDict

from skyserve_lite.api import bind_submission
from skyserve_lite.clock import FakeClock
from skyserve_lite.errors import StateConflictError
from skyserve_lite.lb.guard import ApiKeys, Guard, GuardConfig
from skyserve_lite.lb.http1 import RawHeaders
from skyserve_lite.lb.proxy import LbView, LoadBalancer, render_upstream_headers
from skyserve_lite.procs import find_free_port
from skyserve_lite.spec.inputs import with_inputs
from skyserve_lite.spec.model import Secret
from skyserve_lite.spec.parse import read_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.state.secrets import SecretStore
from skyserve_lite.state.store import Store
from tests.lb.serving import StaticSource

KEY_1 = "sk-" + "1" * 29
KEY_2 = "sk-" + "2" * 29
KEY_3 = "sk-" + "3" * 29

AUTH_TASK = """\
secrets: {API_KEY: null, PARTNER_KEY: null}
service:
  replicas: 1
  auth: {api_keys: [API_KEY, PARTNER_KEY]}
run: serve
"""
# One request every 10 s per API key, 2 more at once: nothing refills within the test.
LIMITED_TASK = """\
secrets: {API_KEY: null, PARTNER_KEY: null}
service:
  replicas: 1
  auth: {api_keys: [API_KEY, PARTNER_KEY]}
  rate_limits: [{prefix: /v1/, rps: 0.1, burst: 2, key: header Authorization}]
run: serve
"""
BURST = 2


@dataclass
class Replica:
    """What the replica saw: the Authorization header of each request (None when absent)."""

    port: int
    authorizations: list[str | None] = field(default_factory=list)


@pytest.fixture
def replica() -> Iterator[Replica]:
    seen = Replica(0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.authorizations.append(self.headers.get("Authorization"))
            body = b"from the replica\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    seen.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield seen
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def submit(home: Path, text: str, keys: tuple[str, str]) -> None:
    """Store ``text`` as the service's next version (its first: the service too) with these key values."""
    store, secrets = Store.open(home), SecretStore(home)
    try:
        given = (("API_KEY", Secret(keys[0])), ("PARTNER_KEY", Secret(keys[1])))
        task = with_inputs(read_task(text, "svc.yaml"), (), given, None)
        record = store.find_service("svc")
        before = store.get_version("svc", record.current_version) if record is not None else None
        bound, inputs = bind_submission(task, before, secrets, keep_secrets=True)
        if record is None:
            store.create_service("svc", bound, 30001, 0.0, inputs=inputs)
        else:
            store.add_version("svc", bound, "rolling", 0.0, inputs=inputs)
    finally:
        store.close()


def add_ready_replica(home: Path, port: int) -> None:
    store = Store.open(home)
    try:
        store.add_replicas("svc", 1, ReplicaRecord(
            service="svc", replica_id=0, version=1, status=ReplicaStatus.READY, cloud="local", launched_at=0.0,
            status_since=0.0, launch_token="t", url=f"http://127.0.0.1:{port}"))
    finally:
        store.close()


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
def workers(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def run_lb(home: Path, port: int, workers: int = 1) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "skyserve_lite.lb", "--home", str(home), "--service", "svc", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "SKY_LITE_LB_WORKERS": str(workers)})


@dataclass
class Endpoint:
    home: Path
    port: int
    process: subprocess.Popen[str]

    def get(self, path: str = "/v1/models", key: str | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
        """One GET on a new connection: status and headers (names lower-cased)."""
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", path, headers=sent)
            response = connection.getresponse()
            response.read()
            return response.status, {name.lower(): value for name, value in response.getheaders()}
        finally:
            connection.close()


def start(home: Path, workers: int = 1) -> Endpoint:
    """A load balancer for svc in ``home``, once it answers HTTP (at most 30 s)."""
    port = find_free_port()
    endpoint = Endpoint(home, port, run_lb(home, port, workers))
    deadline = time.monotonic() + 30
    while True:
        if endpoint.process.poll() is not None:
            raise AssertionError(f"the load balancer exited: {endpoint.process.communicate()[1]}")
        try:
            endpoint.get("/")
            return endpoint
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def stop(endpoint: Endpoint) -> str:
    """Stop the process; its stderr."""
    endpoint.process.terminate()
    _, stderr = endpoint.process.communicate(timeout=30)
    return stderr


@pytest.fixture
def endpoint(tmp_path: Path, replica: Replica, workers: int, request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    home = tmp_path / "home"
    submit(home, getattr(request, "param", AUTH_TASK), (KEY_1, KEY_2))
    add_ready_replica(home, replica.port)
    running = start(home, workers)
    try:
        yield running
    finally:
        stderr = stop(running)
        for key in (KEY_1, KEY_2, KEY_3):
            assert key not in stderr  # never a key in the log


def test_a_request_without_a_key_or_with_a_wrong_one_gets_401_and_reaches_no_replica(
        endpoint: Endpoint, replica: Replica) -> None:
    status, headers = endpoint.get()
    assert status == 401
    assert headers["www-authenticate"] == 'Bearer realm="svc"'
    status, headers = endpoint.get(key=KEY_3)
    assert status == 401
    assert headers["www-authenticate"] == 'Bearer realm="svc", error="invalid_token"'
    status, headers = endpoint.get(headers={"Authorization": f"Basic {KEY_1}"})  # a key, but not as Bearer
    assert status == 401
    assert replica.authorizations == []


def test_the_right_key_gets_200_and_the_replica_never_sees_it(endpoint: Endpoint, replica: Replica) -> None:
    assert endpoint.get(key=KEY_1)[0] == 200
    assert endpoint.get(key=KEY_2)[0] == 200
    assert replica.authorizations == [None, None]


def test_a_websocket_handshake_is_checked_like_any_request(endpoint: Endpoint, replica: Replica) -> None:
    handshake = (b"GET /ws HTTP/1.1\r\nHost: svc\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                 b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) as sock:
        sock.sendall(handshake)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                break
            answer += data
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert b"WWW-Authenticate: Bearer realm=\"svc\"" in answer
    assert replica.authorizations == []


@pytest.mark.parametrize("endpoint", [LIMITED_TASK], indirect=True)
def test_a_key_past_its_burst_gets_429_with_retry_after_while_another_key_gets_200(
        endpoint: Endpoint, replica: Replica) -> None:
    statuses = [endpoint.get(key=KEY_1)[0] for _ in range(BURST + 1)]
    assert statuses == [200] * (BURST + 1)
    status, headers = endpoint.get(key=KEY_1)
    assert status == 429
    # rps 0.1: the next request of this key is allowed 10 s after the first (rounded up, with the clock's
    # progress during the test: 9 or 10).
    assert 1 <= int(headers["retry-after"]) <= 10
    assert endpoint.get(key=KEY_2)[0] == 200  # its own bucket
    assert endpoint.get("/health", key=KEY_1)[0] == 200  # a path no prefix matches is not limited
    assert len(replica.authorizations) == BURST + 1 + 2  # the refused request never reached the replica


def test_a_key_rotated_in_a_new_version_reaches_the_running_load_balancer(endpoint: Endpoint) -> None:
    assert endpoint.get(key=KEY_1)[0] == 200
    submit(endpoint.home, AUTH_TASK, (KEY_3, KEY_2))  # API_KEY rotated: KEY_1 out, KEY_3 in
    deadline = time.monotonic() + 30  # the refresh is every 0.5 s

    def rotated() -> bool:  # several times over: with two workers, each reads the new version on its own
        return all(endpoint.get(key=KEY_3)[0] == 200 and endpoint.get(key=KEY_1)[0] == 401 for _ in range(4))

    while not rotated():
        assert time.monotonic() < deadline, "the rotated key never reached the load balancer"
        time.sleep(0.1)
    assert endpoint.get(key=KEY_2)[0] == 200


def test_a_key_that_cannot_be_read_at_start_stops_the_load_balancer_naming_the_key(
        tmp_path: Path, workers: int) -> None:
    home = tmp_path / "home"
    submit(home, AUTH_TASK, (KEY_1, KEY_2))
    secrets = SecretStore(home)
    (secrets.directory / secrets.digest(Secret(KEY_2))).unlink()  # PARTNER_KEY's value is gone from the store
    process = run_lb(home, find_free_port(), workers)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "cannot read its API keys" in stderr and "PARTNER_KEY" in stderr
    assert KEY_1 not in stderr and KEY_2 not in stderr


@pytest.mark.parametrize(("strip", "expected"), [(True, None), (False, f"Bearer {KEY_1}")])
def test_authorization_is_kept_from_the_replica_only_with_service_auth(strip: bool, expected: str | None) -> None:
    sent = RawHeaders([(b"authorization", f"Bearer {KEY_1}".encode()), (b"Accept", b"*/*")])
    lines = render_upstream_headers(sent, "127.0.0.1", "http", strip).split(b"\r\n")
    assert [line for line in lines if line.lower().startswith(b"authorization:")] == (
        [] if expected is None else [f"authorization: {expected}".encode()])
    assert b"Accept: */*" in lines


class FailingGuardSource:
    """The keys once, then a key that cannot be read on every later read."""

    def __init__(self, first: GuardConfig) -> None:
        self.first: GuardConfig | None = first
        self.reads = 0

    def read(self) -> GuardConfig | None:
        self.reads += 1
        first, self.first = self.first, None
        if first is None:
            raise StateConflictError("service svc version 2: the key API_KEY of service.auth cannot be read")
        return first


def test_keys_that_cannot_be_read_later_keep_the_previous_ones_and_are_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    config = GuardConfig(keys=ApiKeys.from_values([("API_KEY", KEY_1)]))
    source = FailingGuardSource(config)

    async def body() -> None:
        lb = LoadBalancer("svc", StaticSource(LbView((), "round_robin")), None, FakeClock(0.0), refresh_seconds=0.01,
                          hold_seconds=0, guard=Guard(), guard_source=source)
        await lb.start()
        try:
            for _ in range(500):  # bounded: 5 s at most
                if source.reads >= 5:
                    break
                await asyncio.sleep(0.01)
            assert source.reads >= 5
            assert lb.strips_authorization
            assert lb.check_request("/", "127.0.0.1", CIMultiDict(Authorization=f"Bearer {KEY_1}")) is None
            refusal = lb.check_request("/", "127.0.0.1", CIMultiDict())
            assert refusal is not None and refusal.status == 401
            assert dict(refusal.headers)["WWW-Authenticate"] == 'Bearer realm="svc"'
        finally:
            await lb.close()

    with caplog.at_level(logging.WARNING, logger="skyserve_lite.lb.proxy"):
        asyncio.run(body())
    warnings = [record for record in caplog.records if "cannot be read" in record.getMessage()]
    assert len(warnings) == 1
    assert "keeping the previous API keys" in warnings[0].getMessage()
