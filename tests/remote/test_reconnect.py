"""A submission whose connection drops after it was sent: the client asks the host what became of it and says
so, and the same `serve up` or `serve update` run again gets the answer of the one stored instead of an error
or a second version. The host side is the real server on a state directory (``InProcessTransport``); the
network between is a double that loses a request or its answer on cue."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from skyserve_lite.errors import ControllerError, StateConflictError, UsageError
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.remote import protocol
from skyserve_lite.remote.client import ATTEMPTS, RemoteController
from skyserve_lite.remote.connect import submission_secret
from skyserve_lite.remote.server import RpcServer
from skyserve_lite.remote.transport import Channel, InProcessTransport
from skyserve_lite.spec.inputs import with_inputs
from skyserve_lite.spec.model import Secret, SubmittedTask
from skyserve_lite.spec.parse import load_task_file
from skyserve_lite.state.store import Store
from tests.controller.conftest import TASK

SECRET = bytes(range(32))
WHERE = "ssh://ubuntu@203.0.113.9:22"

# What the network does to one connection, decided once its request is complete:
# "after": the host ran the request, and the answer was lost; "before": the request never reached the host;
# "down": the host cannot be reached at all; None: delivered.
Fate = str | None


class Lossy:
    """The in-process host behind a network that does to each connection what ``fate`` says; records every
    request line and each fate."""

    def __init__(self, home: Path, fate: Callable[[dict[str, Any], int], Fate] = lambda _r, _n: None) -> None:
        self.inner = InProcessTransport(home)
        self.where = WHERE
        self.fate = fate
        self.requests: list[dict[str, Any]] = []
        self.fates: list[Fate] = []

    def open(self) -> Channel:
        return _LossyChannel(self)


class _Sent(io.BytesIO):
    def __init__(self, on_close: Callable[[bytes], None]) -> None:
        super().__init__()
        self._on_close = on_close

    def close(self) -> None:
        if not self.closed:
            data = self.getvalue()
            super().close()
            self._on_close(data)


class _LossyChannel:
    def __init__(self, owner: Lossy) -> None:
        self._owner = owner
        self.stdin: IO[bytes] = _Sent(self._deliver)
        self.stdout: IO[bytes] = io.BytesIO(b"")
        self._inner: Channel | None = None
        self._fate: Fate = None

    def _deliver(self, data: bytes) -> None:
        request = json.loads(data.split(b"\n", 1)[0])
        self._owner.requests.append(request)
        self._fate = self._owner.fate(request, len(self._owner.requests))
        self._owner.fates.append(self._fate)
        if self._fate in ("before", "down"):
            return
        inner = self._owner.inner.open()
        inner.stdin.write(data)
        inner.stdin.close()
        if self._fate == "after":
            inner.stdout.read()  # the host answered...
            inner.finish()  # ...and the connection dropped before the answer arrived
            return
        self._inner = inner
        self.stdout = inner.stdout

    def finish(self) -> tuple[int, str]:
        if self._inner is not None:
            return self._inner.finish()
        return 255, ("ssh: connect to host 203.0.113.9 port 22: Connection refused\n" if self._fate == "down"
                     else "Connection reset by peer\n")

    def kill(self) -> None:
        if self._inner is not None:
            self._inner.kill()


def _task(folder: Path, replicas: int, name: str = "task.yaml") -> SubmittedTask:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(TASK.format(replicas=replicas))
    return load_task_file(path)


def _client(transport: Lossy, said: list[str], secret: bytes | None = SECRET) -> RemoteController:
    return RemoteController(transport, retry_pause_seconds=0, submission_secret=secret, say=said.append)


def _versions(home: Path, name: str) -> list[int]:
    store = Store.open(home, create=False)
    try:
        return [v.version for v in store.list_versions(name)]
    finally:
        store.close()


def once(method: str, fate: str) -> Callable[[dict[str, Any], int], Fate]:
    """``fate`` for the first request of ``method``, the others delivered."""
    seen: list[int] = []

    def decide(request: dict[str, Any], _count: int) -> Fate:
        if request["method"] == method and not seen:
            seen.append(1)
            return fate
        return None
    return decide


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "host-home"


@pytest.mark.parametrize(("fate", "outcome_line", "replayed"), [
    ("after", "the controller had stored it (version {v}). Asking for its answer again.", True),
    ("before", "the controller had not stored it. Sending it again.", False),
])
@pytest.mark.parametrize("method", ["create_service", "submit_update"])
def test_after_a_drop_the_client_says_whether_it_was_stored_and_it_is_stored_once(
        home: Path, tmp_path: Path, method: str, fate: str, outcome_line: str, replayed: bool) -> None:
    said: list[str] = []
    if method == "submit_update":
        _client(Lossy(home), said).create_service("web", _task(tmp_path / "v1", 1))
    transport = Lossy(home, once(method, fate))
    remote = _client(transport, said)
    task = _task(tmp_path / "t", 3)
    if method == "create_service":
        answer = remote.create_service("web", task).current_version
    else:
        answer = remote.submit_update("web", task, UpdateMode.ROLLING, expect_version=1).version
    version = 1 if method == "create_service" else 2
    assert answer == version and _versions(home, "web") == list(range(1, version + 1))
    methods = [r["method"] for r in transport.requests]
    assert methods == [method, "submission_outcome", method]
    keys = {r["key"] for r in transport.requests}
    assert len(keys) == 1  # the outcome is asked of the submission's own key, which is sent again
    expected = [f"The connection to {WHERE} dropped before its answer arrived; " + outcome_line.format(v=version)]
    if replayed:
        expected.append(f"The controller at {WHERE} had stored this request already (an earlier attempt or run "
                        "sent the same one); this is its answer, and nothing was stored again.")
    assert said == expected


def test_a_host_lost_after_the_request_says_what_is_known_and_the_same_command_again_answers(
        home: Path, tmp_path: Path) -> None:
    # First run of `serve up`: the host stores the service, the answer is lost, and the host is gone after.
    said: list[str] = []
    first = Lossy(home, lambda request, count: "after" if count == 1 else "down")
    with pytest.raises(ControllerError) as caught:
        _client(first, said).create_service("web", _task(tmp_path / "t", 2))
    message = str(caught.value)
    assert f"lost the connection to the controller at {WHERE} {ATTEMPTS} times" in message
    assert "whether the controller stored the request is not known. Run the same command again: it sends the " \
           "same request, so the controller answers with what it stored instead of storing it twice." in message
    assert said == []

    # The same command again, a new process (a new client) with this state directory's secret: the answer.
    again = Lossy(home)
    said_again: list[str] = []
    service = _client(again, said_again).create_service("web", _task(tmp_path / "t", 2))
    assert service.name == "web" and service.current_version == 1 and _versions(home, "web") == [1]
    assert again.requests[-1]["key"] == first.requests[0]["key"]
    assert said_again == [f"The controller at {WHERE} had stored this request already (an earlier attempt or run "
                          "sent the same one); this is its answer, and nothing was stored again."]


def test_the_same_update_again_after_a_lost_answer_is_the_version_it_stored(home: Path, tmp_path: Path) -> None:
    said: list[str] = []
    _client(Lossy(home), said).create_service("web", _task(tmp_path / "v1", 1))
    # The outcome is learned on the second try, then the host is gone.
    first = Lossy(home, lambda request, count: {1: "after", 2: None}.get(count, "down"))
    with pytest.raises(ControllerError, match=r"the controller had stored the request \(version 2\), but its "
                       "answer was lost. Run the same command again"):
        _client(first, said).submit_update("web", _task(tmp_path / "v2", 3), UpdateMode.ROLLING, expect_version=1)
    assert [r["method"] for r in first.requests][:2] == ["submit_update", "submission_outcome"]
    # `serve update` again plans from version 2 (which the first run stored) and expects it.
    again = Lossy(home)
    version = _client(again, said).submit_update("web", _task(tmp_path / "v2", 3), UpdateMode.ROLLING,
                                                 expect_version=2)
    assert version.version == 2 and _versions(home, "web") == [1, 2]


def test_the_same_task_after_another_update_is_a_new_update(home: Path, tmp_path: Path) -> None:
    said: list[str] = []
    remote = _client(Lossy(home), said)
    remote.create_service("web", _task(tmp_path / "v1", 1))
    a, b = _task(tmp_path / "a", 2), _task(tmp_path / "b", 3)
    assert remote.submit_update("web", a, UpdateMode.ROLLING).version == 2
    assert remote.submit_update("web", b, UpdateMode.ROLLING).version == 3
    assert remote.submit_update("web", a, UpdateMode.ROLLING).version == 4  # A -> B -> A: A again is new
    assert remote.submit_update("web", a, UpdateMode.ROLLING).version == 4  # ...and its rerun is that one
    assert said == [f"The controller at {WHERE} had stored this request already (an earlier attempt or run "
                    "sent the same one); this is its answer, and nothing was stored again."]
    # `serve up` of the first task again, once the service has moved on, is refused as any would be.
    with pytest.raises(StateConflictError, match="service 'web' already exists"):
        remote.create_service("web", _task(tmp_path / "v1", 1))


@pytest.mark.parametrize(("change", "same"), [
    (lambda remote, task: remote.create_service("web", task), True),
    (lambda remote, task: remote.create_service("web", task, endpoint_port=30555), False),
    (lambda remote, task: remote.create_service("api", task), False),
    (lambda remote, task: remote.create_service("web", with_inputs(task, (), [("TOKEN", Secret("b"))], None)),
     False),
])
def test_the_key_is_what_was_asked(home: Path, tmp_path: Path,
                                   change: Callable[[RemoteController, SubmittedTask], object], same: bool) -> None:
    text = TASK.format(replicas=1) + "secrets:\n  TOKEN: null\n"
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "task.yaml").write_text(text)

    def task() -> SubmittedTask:
        return with_inputs(load_task_file(tmp_path / "t" / "task.yaml"), (), [("TOKEN", Secret("a"))], None)

    transport = Lossy(home)
    remote = _client(transport, [])
    remote.create_service("web", task())
    first_key = transport.requests[-1]["key"]
    with contextlib.suppress(StateConflictError):  # a `serve up` of a taken name, asked otherwise: refused
        change(remote, task())
    assert (transport.requests[-1]["key"] == first_key) is same
    other = Lossy(home)
    with pytest.raises(StateConflictError, match="already exists"):  # another state directory's secret...
        _client(other, [], secret=bytes(32)).create_service("web", task())
    assert other.requests[-1]["key"] != first_key  # ...makes another request of the same command


def test_the_secret_is_made_once_privately_and_none_where_it_cannot_be(tmp_path: Path) -> None:
    home = tmp_path / "home"
    secret = submission_secret(home)
    assert secret is not None and len(secret) == 32
    assert submission_secret(home) == secret
    path = home / "ssh" / "submission.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    (tmp_path / "file").write_text("")
    assert submission_secret(tmp_path / "file" / "home") is None  # cannot be made: random keys instead
    path.write_text("damaged\n")
    assert submission_secret(home) is None
    os.chmod(path, 0)
    if os.getuid() != 0:  # root reads it anyway
        assert submission_secret(home) is None


def test_without_a_secret_each_submission_has_a_key_of_its_own(home: Path, tmp_path: Path) -> None:
    transport = Lossy(home)
    remote = _client(transport, [], secret=None)
    remote.create_service("web", _task(tmp_path / "t", 1))
    with pytest.raises(StateConflictError, match="already exists"):
        remote.create_service("web", _task(tmp_path / "t", 1))
    assert len({r["key"] for r in transport.requests if r["method"] == "create_service"}) == 2


@pytest.mark.parametrize(("params", "key", "message"), [
    ({"name": "web", "method": "drop_tables", "base": None}, "k" * 64, "is not a submission"),
    ({"name": "web", "method": "create_service", "base": None}, None, "needs an idempotency key"),
])
def test_a_bad_outcome_question_is_named(home: Path, params: dict[str, Any], key: str | None, message: str) -> None:
    out = io.BytesIO()
    request = protocol.make_request("submission_outcome", params, key)
    RpcServer(home, io.BytesIO(json.dumps(request).encode() + b"\n"), out).serve()
    error = json.loads(out.getvalue())["error"]
    assert message in error["message"]
    with pytest.raises((UsageError, ControllerError)):
        protocol.raise_error(error)
