"""`controller rpc` relaying to the loop's socket: the same answer as serving the call in-process, the
methods that must not run in the loop served by the caller, and no socket meaning "serve it yourself"."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.controller.loop import run_loop
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.remote import protocol
from skyserve_lite.remote.listener import RpcListener
from skyserve_lite.remote.relay import Prefixed, relay, socket_path
from skyserve_lite.remote.server import RpcServer
from tests.controller.conftest import Harness


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "h"
    harness = Harness(home)
    harness.create("web")
    harness.store.close()
    yield home


def _relay(home: Path, request: dict[str, Any]) -> tuple[int | None, bytes, bytes]:
    read_end, write_end = os.pipe()
    try:
        code, line = relay(home, io.BytesIO(json.dumps(request).encode() + b"\n"), write_end)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        return code, line, answer.read()


def _direct(home: Path, request: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    RpcServer(home, io.BytesIO(json.dumps(request).encode() + b"\n"), out).serve()
    return out.getvalue()


def _without_time(answer: bytes) -> Any:
    document = json.loads(answer)
    document["result"]["controller"].pop("checked_at")
    return document


def test_a_relayed_call_answers_what_serving_it_here_answers(home: Path) -> None:
    listener = RpcListener(home)
    assert listener.start()
    try:
        request = protocol.make_request("get_status_report", {"names": []})
        code, line, answer = _relay(home, request)
        assert (code, line) == (0, b"")
        assert _without_time(answer) == _without_time(_direct(home, request))
        assert json.loads(answer)["result"]["services"][0]["service"]["name"] == "web"
    finally:
        listener.close()
    assert not (home / "rpc.sock").exists()


def test_without_a_listening_loop_the_caller_serves_the_line_it_read(home: Path) -> None:
    request = protocol.make_request("get_status", {"names": []})
    code, line, answer = _relay(home, request)
    assert code is None and answer == b""
    assert json.loads(line) == request
    (home / "rpc.sock").write_text("")  # a dead loop's leftover: not a socket anyone listens on
    assert _relay(home, request)[0] is None


def test_force_down_is_never_run_inside_the_loop(home: Path) -> None:
    listener = RpcListener(home)
    assert listener.start()
    try:
        request = protocol.make_request("force_down", {"regions": []})
        code, line, _answer = _relay(home, request)
        assert code is None and json.loads(line)["method"] == "force_down"
    finally:
        listener.close()


def test_a_home_too_long_for_a_socket_is_served_without_one(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    assert socket_path(deep) is None
    assert RpcListener(deep).start() is False


def test_prefixed_gives_the_line_back_first() -> None:
    stream = Prefixed(b"line\n", io.BytesIO(b"rest\nmore"))
    assert stream.readline() == b"line\n" and stream.readline() == b"rest\n" and stream.read() == b"more"
    assert Prefixed(b"abc\n", io.BytesIO(b"de")).read(2) == b"ab"


def test_the_loop_listens_while_it_runs(tmp_path: Path) -> None:
    home = tmp_path / "empty"  # no service: the loop launches nothing
    stop = threading.Event()
    loop = threading.Thread(target=run_loop, args=(home, ControllerSettings(interval_seconds=0.1)),
                            kwargs={"stop": stop}, daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while not (home / "rpc.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        code, _line, answer = _relay(home, protocol.make_request("controller_status", {}))
        assert code == 0 and json.loads(answer)["result"]["running"] is True
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not (home / "rpc.sock").exists()
