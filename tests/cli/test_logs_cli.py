"""`serve logs`: follows by default, `--no-follow` prints and exits, `--tail N` and `--since DURATION` pick
what is shown first, and Ctrl-C ends a follow quietly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from skyserve_lite.api import Controller, LocalController
from skyserve_lite.cli.main import main
from skyserve_lite.clock import FakeClock
from skyserve_lite.spec.parse import load_task_file

from .runner import Cli

T0 = 1_796_146_200.0  # 2026-12-01T17:30:00Z


def at(offset: float, text: str) -> bytes:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z ", time.gmtime(T0 + offset)).encode() + text.encode() + b"\n"


class RecordingController:
    """Streams ``chunks`` (an exception in them is raised there) and records each ``stream_log`` call."""

    def __init__(self, chunks: list[bytes | BaseException]) -> None:
        self.chunks = chunks
        self.calls: list[dict[str, Any]] = []
        self.closed = False

    def stream_log(self, name: str, replica_id: int | None, **options: Any) -> Iterator[bytes]:
        self.calls.append({"name": name, "replica_id": replica_id, **options})
        return self._stream()

    def _stream(self) -> Iterator[bytes]:
        try:
            for chunk in self.chunks:
                if isinstance(chunk, BaseException):
                    raise chunk
                yield chunk
        finally:
            self.closed = True


def recording(chunks: list[bytes | BaseException]) -> tuple[Cli, RecordingController]:
    controller = RecordingController(chunks)
    return Cli(cast(Controller, controller)), controller


@pytest.mark.parametrize(
    ("args", "options"),
    [
        pytest.param([], {"follow": True, "tail": None, "since_seconds": None}, id="follows-by-default"),
        pytest.param(["--no-follow"], {"follow": False, "tail": None, "since_seconds": None}, id="no-follow"),
        pytest.param(["--follow", "--tail", "20"], {"follow": True, "tail": 20, "since_seconds": None}, id="tail"),
        pytest.param(["--since", "5m", "--no-follow"], {"follow": False, "tail": None, "since_seconds": 300.0},
                     id="since"),
        pytest.param(["--since", "1h30m", "--tail", "0"], {"follow": True, "tail": 0, "since_seconds": 5400.0},
                     id="both"),
    ],
)
def test_options_reach_the_controller(args: list[str], options: dict[str, Any]) -> None:
    cli, controller = recording([b"line\n"])
    code, stdout, stderr = cli("serve", "logs", "web", "2", *args)
    assert (code, stdout, stderr) == (0, "line\n", "")
    assert controller.calls == [{"name": "web", "replica_id": 2, "controller": False, "load_balancer": False,
                                 **options}]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--since", "5x"], "Error: --since: '5x' is not a duration", id="bad-duration"),
        pytest.param(["--since", "-5m"], "Error: --since: '-5m' is not a duration", id="negative-duration"),
        pytest.param(["--tail", "-1"], "Invalid value for '--tail'", id="negative-tail"),
        pytest.param(["--tail", "ten"], "Invalid value for '--tail'", id="tail-not-a-number"),
    ],
)
def test_bad_values_exit_2_naming_the_option(args: list[str], message: str) -> None:
    cli, controller = recording([])
    code, _stdout, stderr = cli("serve", "logs", "web", "1", *args)
    assert code == 2 and message in stderr and "Traceback" not in stderr
    assert controller.calls == []


def test_ctrl_c_while_following_exits_0_quietly_with_what_came() -> None:
    cli, controller = recording([b"first\n", b"", b"second\n", KeyboardInterrupt()])
    assert cli("serve", "logs", "web", "1") == (0, "first\nsecond\n", "")
    assert controller.closed


FOLLOWING = "; following it for new lines (Ctrl-C stops).\n"


@pytest.mark.parametrize(
    ("args", "chunks", "stdout", "stderr"),
    [
        pytest.param(["1", "--since", "10m", "--no-follow"], [], "",
                     "No line of the last 10m (--since) in the log of replica 1 of web.\n", id="since-nothing"),
        pytest.param(["--controller", "--no-follow"], [], "", "The controller's log is empty.\n",
                     id="empty-controller-log"),
        pytest.param(["--load-balancer", "--since", "1h30m", "--no-follow", "--tail", "5"], [b""], "",
                     "No line of the last 1h30m (--since) in the load balancer log of web.\n", id="lb-since-tail"),
        # Following: said at the first idle poll (everything there was read), before what comes next.
        pytest.param(["1", "--since", "10m"], [b"", b"", b"new\n", KeyboardInterrupt()], "new\n",
                     "No line of the last 10m (--since) in the log of replica 1 of web" + FOLLOWING,
                     id="follow-since-nothing"),
        pytest.param(["1"], [b"", b"new\n", KeyboardInterrupt()], "new\n",
                     "The log of replica 1 of web is empty" + FOLLOWING, id="follow-empty"),
        pytest.param(["1", "--since", "10m"], [b"old enough\n", b"", KeyboardInterrupt()], "old enough\n", "",
                     id="something-matched"),
        pytest.param(["1", "--tail", "0"], [b"", KeyboardInterrupt()], "", "", id="tail-0-asks-for-nothing"),
        # A follow through a controller host has no idle polls; Ctrl-C still ends it quietly.
        pytest.param(["1", "--since", "10m"], [KeyboardInterrupt()], "", "", id="ctrl-c-quiet"),
    ],
)
def test_nothing_to_show_is_said_on_stderr_and_exits_0(args: list[str], chunks: list[bytes | BaseException],
                                                       stdout: str, stderr: str) -> None:
    cli, _ = recording(chunks)
    assert cli("serve", "logs", "web", *args) == (0, stdout, stderr)


def test_the_follow_note_comes_before_the_new_lines() -> None:
    controller = RecordingController([b"", b"new\n", KeyboardInterrupt()])
    result = CliRunner().invoke(main, ["serve", "logs", "web", "1", "--since", "5m"], obj=controller)
    assert result.output == "No line of the last 5m (--since) in the log of replica 1 of web" + FOLLOWING + "new\n"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    task = tmp_path / "web.yaml"
    task.write_text("service:\n  replicas: 1\nrun: echo hi\n")
    LocalController(home, start_daemon=False).create_service("web", load_task_file(task))
    return home


def write_replica_log(home: Path, content: bytes) -> Path:
    log = home / "replicas" / "web" / "1-abc" / "replica.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(content)
    return log


LOG = at(0, "old") + at(100, "newer") + b"  a line that goes with it\n" + at(150, "newest")


@pytest.mark.parametrize(
    ("args", "expected", "said"),
    [
        pytest.param([], LOG, "", id="everything"),
        pytest.param(["--tail", "2"], LOG.split(b"\n", 2)[2], "", id="tail"),
        pytest.param(["--since", "90s"], LOG.split(b"\n", 1)[1], "", id="since"),
        pytest.param(["--since", "90s", "--tail", "1"], at(150, "newest"), "", id="since-and-tail"),
        pytest.param(["--since", "1s"], b"", "No line of the last 1s (--since) in the log of replica 1 of web.\n",
                     id="nothing-that-recent"),
        pytest.param(["--tail", "0"], b"", "", id="tail-0-asks-for-nothing"),
    ],
)
def test_a_replica_log_on_this_machine(home: Path, args: list[str], expected: bytes, said: str) -> None:
    write_replica_log(home, LOG)
    cli = Cli(LocalController(home, FakeClock(T0 + 180), start_daemon=False))
    code, stdout, stderr = cli("serve", "logs", "web", "1", "--no-follow", *args)
    assert (code, stderr) == (0, said)
    assert stdout.encode() == expected


class GrowingLogClock(FakeClock):
    """Each poll of a follow: the log grows by the next line; once they are all written, Ctrl-C."""

    def __init__(self, log: Path, lines: list[bytes]) -> None:
        super().__init__(T0 + 180)
        self.log = log
        self.lines = lines

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if not self.lines:
            raise KeyboardInterrupt
        with self.log.open("ab") as stream:
            stream.write(self.lines.pop(0))


def test_by_default_the_log_is_followed_as_it_grows_until_ctrl_c(home: Path) -> None:
    log = write_replica_log(home, LOG)
    clock = GrowingLogClock(log, [at(181, "later"), at(182, "later still")])
    code, stdout, stderr = Cli(LocalController(home, clock, start_daemon=False))("serve", "logs", "web", "1",
                                                                                 "--tail", "1")
    assert (code, stderr) == (0, "")
    assert stdout.encode() == at(150, "newest") + at(181, "later") + at(182, "later still")
    assert len(clock.sleeps) == 3  # polled until interrupted


def test_following_a_log_with_nothing_that_recent_says_so_then_prints_what_comes(home: Path) -> None:
    log = write_replica_log(home, LOG)
    clock = GrowingLogClock(log, [at(181, "later")])
    code, stdout, stderr = Cli(LocalController(home, clock, start_daemon=False))("serve", "logs", "web", "1",
                                                                                 "--since", "10s")
    assert code == 0
    assert stderr == "No line of the last 10s (--since) in the log of replica 1 of web" + FOLLOWING
    assert stdout.encode() == at(181, "later")
