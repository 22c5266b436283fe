"""``RemoteController`` against the real server through real pipes (``InProcessTransport``): the same
answers as ``LocalController``, uploads of only what the host lacks, retries that store once, and the
failures a connection can have, each named."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import pytest

from skyserve_lite import __version__
from skyserve_lite.api import LocalController
from skyserve_lite.errors import (
    ControllerError,
    ControllerVersionError,
    HostKeyError,
    NotFoundError,
    SpecError,
    StateConflictError,
)
from skyserve_lite.files.blobs import blob_store_of
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.remote import protocol
from skyserve_lite.remote.client import RemoteController
from skyserve_lite.remote.server import RpcServer
from skyserve_lite.remote.transport import Channel, InProcessTransport
from skyserve_lite.spec.parse import load_task_file
from tests.controller.conftest import TASK, Harness


class Recording:
    """A transport that records each request line and can drop answers, over the in-process server."""

    def __init__(self, home: Path) -> None:
        self.inner = InProcessTransport(home)
        self.where = "recording transport"
        self.requests: list[dict[str, Any]] = []
        self.drop_answer_of: set[str] = set()  # methods whose first answer is lost, as on a dropped link
        self.after: dict[str, Any] = {}  # method -> callable run once its server is done

    def open(self) -> Channel:
        channel = self.inner.open()
        return _Tap(channel, self)


class _Tap:
    def __init__(self, channel: Channel, owner: Recording) -> None:
        self._channel = channel
        self._owner = owner
        self.stdin: IO[bytes] = cast(IO[bytes], _TapWriter(channel.stdin, owner))
        self.stdout: IO[bytes] = channel.stdout
        self._dropped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def finish(self) -> tuple[int, str]:
        code, stderr = self._channel.finish()
        return (255, "Connection reset by peer") if self._dropped else (code, stderr)

    def kill(self) -> None:
        self._channel.kill()

    def drop_answer(self) -> None:
        self._channel.finish()  # the server ran to its end; its answer goes nowhere
        self.stdout = io.BytesIO(b"")
        self._dropped = True


class _TapWriter:
    def __init__(self, stream: IO[bytes], owner: Recording) -> None:
        self._stream = stream
        self._owner = owner
        self._first = True

    def write(self, data: bytes) -> int:
        if self._first:
            self._first = False
            self._owner.requests.append(json.loads(data.split(b"\n", 1)[0]))
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        self._stream.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "host-home"


@pytest.fixture
def harness(home: Path) -> Iterator[Harness]:
    h = Harness(home)
    yield h
    h.store.close()


def _task_file(folder: Path, text: str = TASK.format(replicas=2), name: str = "task.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def test_answers_are_the_local_controllers_values(harness: Harness, home: Path, tmp_path: Path) -> None:
    harness.create("web")
    for _ in range(3):
        harness.tick()
    local, remote = LocalController(home, start_daemon=False), RemoteController(InProcessTransport(home))
    assert remote.get_status() == local.get_status()
    assert remote.get_status(["web"], events=2) == local.get_status(["web"], events=2)
    assert len(remote.get_status_report(["web"], events=1).services[0].events) == 1
    # The report also asks each READY endpoint who it is (``api.check_endpoints``); here nothing listens.
    [reported] = remote.get_status_report(["web"]).services
    assert reported.endpoint_problem is not None
    # And its endpoint on every controller host, which are live (``host_endpoints``): none here.
    assert reported.endpoints and not any(endpoint.live for endpoint in reported.endpoints)
    assert (dataclasses.replace(reported, endpoint_problem=None, endpoints=()),) == tuple(local.get_status(["web"]))
    assert remote.get_rollout_state("web") == local.get_rollout_state("web")
    task = load_task_file(_task_file(tmp_path / "tasks", TASK.format(replicas=3)))
    assert remote.plan_update("web", task, UpdateMode.ROLLING) == local.plan_update("web", task, UpdateMode.ROLLING)
    assert remote.get_rollout_state("web").versions[0].spec == local.get_rollout_state("web").versions[0].spec


def test_a_launch_plan_and_secrets_cross_the_protocol(harness: Harness, home: Path, tmp_path: Path) -> None:
    from skyserve_lite.spec.inputs import with_inputs
    from skyserve_lite.spec.model import Secret

    text = TASK.format(replicas=2) + "secrets:\n  TOKEN: null\n"
    task = with_inputs(load_task_file(_task_file(tmp_path / "s", text)), (), [("TOKEN", Secret("s3cr3t"))], None)
    local, remote = LocalController(home, start_daemon=False), RemoteController(InProcessTransport(home))
    assert remote.plan_create("web", task) == local.plan_create("web", task)
    assert not (home / "secrets").exists()  # a plan stores nothing, not even the secret store's key
    remote.create_service("web", task)
    [(name, digest)] = local.get_rollout_state("web").versions[0].spec.secrets
    assert name == "TOKEN" and (home / "secrets" / digest).read_text() == "s3cr3t"


def test_errors_come_back_as_the_same_classes(harness: Harness, home: Path, tmp_path: Path) -> None:
    remote = RemoteController(InProcessTransport(home))
    with pytest.raises(NotFoundError, match="no service named 'nope'"):
        remote.get_status(["nope"])
    harness.create("web")
    bad = load_task_file(_task_file(tmp_path / "t", TASK.format(replicas=1)))
    with pytest.raises(StateConflictError, match="not 7"):
        remote.submit_update("web", bad, UpdateMode.ROLLING, expect_version=7)


def test_another_version_is_refused_with_the_upgrade_hint_but_describe_answers(home: Path) -> None:
    def ask(method: str, version: str) -> dict[str, Any]:
        request = protocol.make_request(method, {"names": []}) | {"sky_lite": version}
        out = io.BytesIO()
        RpcServer(home, io.BytesIO(json.dumps(request).encode() + b"\n"), out,
                  LocalController(home, start_daemon=False)).serve()
        return dict(json.loads(out.getvalue()))

    refused = ask("get_status", "0.0.1")
    assert refused["error"]["type"] == "ControllerVersionError"
    assert "sky-lite controller upgrade" in refused["error"]["message"]
    assert f"runs sky-lite {__version__}" in refused["error"]["message"]
    with pytest.raises(ControllerVersionError):
        protocol.raise_error(refused["error"])
    described = ask("describe", "0.0.1")
    assert described["result"]["sky_lite"] == __version__ and described["result"]["home"] == str(home)
    assert "result" in ask("get_status", __version__)


def test_a_bad_request_names_what_is_wrong(home: Path) -> None:
    def ask(request: dict[str, Any]) -> str:
        out = io.BytesIO()
        RpcServer(home, io.BytesIO(json.dumps(request).encode() + b"\n"), out).serve()
        return str(json.loads(out.getvalue())["error"]["message"])

    assert "no method 'drop_tables'" in ask(protocol.make_request("drop_tables", {}))
    assert "params.names" in ask(protocol.make_request("get_status", {"names": "web"}))
    assert "no parameter 'name'" in ask(protocol.make_request("get_rollout_state", {}))


WORKDIR_TASK = TASK.format(replicas=1) + "workdir: ./app\n"


def test_a_submission_uploads_only_the_blobs_the_host_lacks(home: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "project"
    (source / "app").mkdir(parents=True)
    monkeypatch.chdir(source)  # relative paths resolve against the working directory
    for index in range(5):
        (source / "app" / f"file{index}.txt").write_text(f"content {index}\n")
    transport = Recording(home)
    remote = RemoteController(transport)
    remote.create_service("web", load_task_file(_task_file(source, WORKDIR_TASK)))
    uploads = [r for r in transport.requests if r["method"] == "put_blobs"]
    assert [len(r["params"]["blobs"]) for r in uploads] == [5]

    (source / "app" / "file3.txt").write_text("changed\n")
    transport.requests.clear()
    version = remote.submit_update("web", load_task_file(source / "task.yaml"), UpdateMode.ROLLING)
    uploads = [r for r in transport.requests if r["method"] == "put_blobs"]
    assert [len(r["params"]["blobs"]) for r in uploads] == [1]
    # The host holds every file of the version, and materializes it from its own blobs.
    files = version.files
    assert files is not None and files.workdir is not None
    assert all(blob_store_of(home).has(d) for d in files.blob_digests())
    assert {e.path for e in files.workdir.entries if e.digest} == {f"file{i}.txt" for i in range(5)}


def test_an_update_fills_paths_with_the_current_versions_env_as_the_host_does(home: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from skyserve_lite.spec.inputs import with_inputs

    source = tmp_path / "project"
    (source / "data").mkdir(parents=True)
    (source / "data" / "a.txt").write_text("one\n")
    monkeypatch.chdir(source)
    text = TASK.format(replicas=1) + "envs:\n  DIR: null\nworkdir: ./$DIR\n"
    remote = RemoteController(Recording(home))
    path = _task_file(source, text)
    remote.create_service("web", with_inputs(load_task_file(path), (("DIR", "data"),), (), None))
    (source / "data" / "a.txt").write_text("two\n")
    # DIR is not given again: the host binds the current version's value, and the client reads the files there.
    version = remote.submit_update("web", load_task_file(path), UpdateMode.ROLLING)
    assert version.version == 2 and version.spec.workdir == "./data"
    files = version.files
    assert files is not None and files.workdir is not None
    assert {e.path for e in files.workdir.entries if e.digest} == {"a.txt"}


def test_blobs_collected_after_the_upload_are_uploaded_again(home: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "project"
    (source / "app").mkdir(parents=True)
    monkeypatch.chdir(source)  # relative paths resolve against the working directory
    (source / "app" / "main.py").write_text("print('hi')\n")
    transport = Recording(home)
    remote = RemoteController(transport)
    original_open = transport.open
    collected: list[int] = []

    def open_and_collect() -> Channel:
        # Just before the submission's own call, once: garbage collection on the host takes every blob.
        if transport.requests and transport.requests[-1]["method"] == "put_blobs" and not collected:
            shutil.rmtree(home / "blobs")
            collected.append(1)
        return original_open()

    transport.open = open_and_collect  # type: ignore[method-assign]
    service = remote.create_service("web", load_task_file(_task_file(source, WORKDIR_TASK)))
    assert service.name == "web"
    assert [r["method"] for r in transport.requests] == ["missing_blobs", "put_blobs", "create_service",
                                                         "put_blobs", "create_service"]
    files = remote.get_rollout_state("web").versions[0].files
    assert files is not None and all(blob_store_of(home).has(d) for d in files.blob_digests())


def test_a_retry_after_a_lost_answer_stores_one_version(harness: Harness, home: Path, tmp_path: Path) -> None:
    harness.create("web")
    transport = Recording(home)
    lost: list[str] = []
    original_open = transport.open

    def open_losing_the_first_submit() -> Channel:
        channel = original_open()
        assert isinstance(channel, _Tap)
        tap = channel
        original_read = tap._channel.stdout

        class LoseFirst:
            def readline(self, limit: int = -1) -> bytes:
                if transport.requests[-1]["method"] == "submit_update" and not lost:
                    lost.append("answer")
                    original_read.readline(limit)  # the server stored the version and answered...
                    tap.drop_answer()  # ...and the connection dropped before the answer arrived
                    return b""
                return original_read.readline(limit)

            def __getattr__(self, name: str) -> Any:
                return getattr(original_read, name)

        channel.stdout = LoseFirst()  # type: ignore[assignment]
        return channel

    transport.open = open_losing_the_first_submit  # type: ignore[method-assign]
    remote = RemoteController(transport, retry_pause_seconds=0)
    task = load_task_file(_task_file(tmp_path / "t", TASK.format(replicas=3)))
    version = remote.submit_update("web", task, UpdateMode.ROLLING)
    assert lost and version.version == 2
    submits = [r for r in transport.requests if r["method"] == "submit_update"]
    assert len(submits) == 2 and submits[0]["key"] == submits[1]["key"] is not None
    assert [v.version for v in harness.store.list_versions("web")] == [1, 2]


class _Failing:
    """A transport whose command ends without an answer, with this exit status and stderr."""

    def __init__(self, code: int, stderr: str) -> None:
        self.where = "ssh://root@203.0.113.9:22"
        self.code, self.stderr = code, stderr
        self.opened = 0

    def open(self) -> Channel:
        self.opened += 1
        failing = self

        class Dead:
            stdin: IO[bytes] = io.BytesIO()
            stdout: IO[bytes] = io.BytesIO(b"")

            def finish(self) -> tuple[int, str]:
                return failing.code, failing.stderr

            def kill(self) -> None:
                pass

        return Dead()


@pytest.mark.parametrize(("code", "stderr", "error", "message", "opened"), [
    (255, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.\n",
     HostKeyError, "not the one pinned", 1),
    (255, "ssh: connect to host 203.0.113.9 port 22: Connection refused\n", ControllerError,
     "lost the connection to the controller at ssh://root@203.0.113.9:22 3 times", 3),
    (-9, "", ControllerError, "lost the connection", 3),
    (127, "sh: 1: /home/u/.sky-lite/venv/bin/sky-lite: not found\n", ControllerError,
     r"failed \(exit 127\): sh: 1: /home/u/.sky-lite/venv/bin/sky-lite: not found", 1),
])
def test_a_command_that_ends_without_an_answer_is_named(code: int, stderr: str, error: type[Exception],
                                                        message: str, opened: int) -> None:
    transport = _Failing(code, stderr)
    with pytest.raises(error, match=message):
        RemoteController(transport, retry_pause_seconds=0).get_status()
    assert transport.opened == opened


def test_logs_stream_and_a_follow_stops_when_the_client_leaves(harness: Harness, home: Path) -> None:
    harness.create("web")
    log = home / "logs" / "controller.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"first line\n\xff not utf-8\n")
    remote = RemoteController(InProcessTransport(home))
    assert b"".join(remote.stream_log("web", None, controller=True)) == b"first line\n\xff not utf-8\n"
    chunks = remote.stream_log("web", None, controller=True, follow=True)
    assert next(chunks) == b"first line\n\xff not utf-8\n"
    with log.open("ab") as stream:
        stream.write(b"appended\n")
    assert next(chunks) == b"appended\n"
    started = time.monotonic()
    chunks.close()  # type: ignore[attr-defined,unused-ignore]  # the client leaves: the host's follow must end too
    assert time.monotonic() - started < 5, "closing waited for a follow that did not stop"
    with pytest.raises(NotFoundError, match="no log for replica 9"):
        list(remote.stream_log("web", 9))


def test_tail_and_since_cross_the_protocol_and_a_request_without_them_gets_everything(
        harness: Harness, home: Path) -> None:
    from skyserve_lite.supervisor import format_line_time

    harness.create("web")
    log = home / "logs" / "controller.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    now = time.time()  # the host's clock judges what is recent: the in-process host runs on this one
    old, recent, newest = (format_line_time(now - age) + text for age, text in
                           ((3600, b"an hour ago\n"), (60, b"a minute ago\n"), (1, b"just now\n")))
    log.write_bytes(old + recent + newest)
    remote = RemoteController(InProcessTransport(home))
    assert b"".join(remote.stream_log("web", None, controller=True, since_seconds=600)) == recent + newest
    assert b"".join(remote.stream_log("web", None, controller=True, tail=1)) == newest
    assert b"".join(remote.stream_log("web", None, controller=True, tail=1, since_seconds=600)) == newest

    # A client from before tail and since sends neither: the whole log, as it always got.
    request = protocol.make_request("stream_log", {"name": "web", "replica_id": None, "controller": True,
                                                   "load_balancer": False, "follow": False})
    out = io.BytesIO()
    RpcServer(home, io.BytesIO(json.dumps(request).encode() + b"\n"), out,
              LocalController(home, start_daemon=False)).serve()
    header, _, streamed = out.getvalue().partition(b"\n")
    assert json.loads(header)["stream"] is True
    assert streamed == old + recent + newest


def test_a_source_missing_here_is_named_before_anything_is_sent(home: Path, tmp_path: Path) -> None:
    transport = Recording(home)
    path = _task_file(tmp_path / "p", WORKDIR_TASK)
    with pytest.raises(SpecError, match="workdir"):
        RemoteController(transport).create_service("web", load_task_file(path))
    assert transport.requests == []
