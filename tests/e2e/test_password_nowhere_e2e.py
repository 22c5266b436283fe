"""The state in PostgreSQL with a password, end to end: a real controller, load balancer and replica of the
local provider, and the password searched for everywhere a user or another process could read it.

Searched: every file below the home but its libpq password file (the logs, the settings, controller.json if
any, the replicas' directories), what `serve status` and `controller status` print (text and JSON), and the
command line of every process started for the home. Environments: a replica gets a bare one, so never the
password; with the password in ``pgpass`` (``config set db_url -``) no process has it in its environment;
given as ``SKY_LITE_DB_URL`` it is in the controller's environment, which its load balancers inherit (they
open the same database), and nowhere else.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres import PASSWORD, PASSWORD_USER, PostgresServer

from .conftest import SkyLite, answering_run, http_get, wait_until

TASK = "service:\n  readiness_probe: /\n  replicas: 1\n" + answering_run('"ok"')
# A part of the password with no character any writing of it escapes (libpq's password file escapes ":" and
# "\\", JSON and repr "\\"), as given and as percent-encoded in a URL: either found is the password shown.
FRAGMENT = "with@odd/chars"
NEEDLES = (FRAGMENT.encode(), urllib.parse.quote(FRAGMENT, safe="").encode())
assert FRAGMENT in PASSWORD


def started_processes(home: Path) -> dict[int, tuple[bytes, bytes]]:
    """Every live process started for ``home`` (its environment names the home, or, for a replica and its
    descendants, a replica directory below it): pid -> (command line, environment)."""
    markers = (f"SKY_LITE_HOME={home}".encode(), f"SKY_LITE_REPLICA_DIR={home}/".encode())
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(variable.startswith(marker) for variable in environ.split(b"\0") for marker in markers):
            found[int(entry.name)] = (cmdline, environ)
    return found


def holds_password(data: bytes) -> bool:
    return any(needle in data for needle in NEEDLES)


@pytest.fixture
def database(postgres_server: PostgresServer) -> Iterator[str]:
    name = postgres_server.create_database(owner=PASSWORD_USER)
    yield postgres_server.url(name, PASSWORD_USER, PASSWORD)
    postgres_server.drop_database(name)


@pytest.fixture
def sky(tmp_path: Path) -> Iterator[SkyLite]:
    instance = SkyLite(tmp_path / "home")
    instance.env.pop("SKY_LITE_DB_URL", None)
    instance.env.pop("SKY_LITE_CONTROLLER", None)
    instance.env["SKY_LITE_LOCAL_REPLICAS_DIR"] = str(instance.home / "replicas")
    yield instance
    instance.cleanup()


@pytest.mark.parametrize("given", ["pgpass", "environment"])
def test_the_password_is_in_no_file_output_or_command_line(sky: SkyLite, database: str, given: str) -> None:
    if given == "pgpass":
        # `-`: the URL is read from stdin, so that the command line never holds it either.
        said = subprocess.run([sys.executable, "-m", "skyserve_lite", "config", "set", "db_url", "-"], env=sky.env,
                              input=database + "\n", capture_output=True, text=True, timeout=60)
        assert said.returncode == 0, said.stderr
        assert not holds_password((said.stdout + said.stderr).encode())
        assert stat.S_IMODE((sky.home / "pgpass").stat().st_mode) == 0o600
    else:
        sky.env["SKY_LITE_DB_URL"] = database
    task = sky.home.parent / "task.yaml"
    task.write_text(TASK)
    outputs = [sky.run("serve", "up", str(task), "--name", "web", timeout=180)]
    wait_until(lambda: sky.status("web")["services"][0]["status"] == "READY", 120, "web READY")
    endpoint = sky.status("web")["services"][0]["endpoint"]
    wait_until(lambda: http_get(endpoint)[0] == 200, 60, "the endpoint to answer")
    assert not (sky.home / "state.db").exists()  # the state is in PostgreSQL

    outputs += [sky.run(*args) for args in (
        ("serve", "status"), ("serve", "status", "-o", "json"), ("serve", "status", "web"),
        ("serve", "logs", "web", "--controller", "--no-follow"),
        ("serve", "logs", "web", "--load-balancer", "--no-follow"),
        ("controller", "status"), ("controller", "status", "-o", "json"), ("config", "list"))]
    for result in outputs:
        assert not holds_password((result.stdout + result.stderr).encode()), result.args

    files = [path for path in sky.home.rglob("*") if path.is_file() and not path.is_symlink()]
    assert any(path.parent.name == "logs" for path in files), files  # the controller's log was searched
    assert [path.name for path in files if holds_password(path.read_bytes())] == (
        ["pgpass"] if given == "pgpass" else [])

    processes = started_processes(sky.home)
    assert {kind(cmdline) for cmdline, _environ in processes.values()} == {"controller", "lb", "replica"}, processes
    assert [pid for pid, (cmdline, _environ) in processes.items() if holds_password(cmdline)] == []
    # The controller and the load balancer (each of its processes: its workers open the store too), never a
    # replica.
    assert {kind(cmdline) for cmdline, environ in processes.values() if holds_password(environ)} == (
        set() if given == "pgpass" else {"controller", "lb"})


def kind(cmdline: bytes) -> str:
    """What a process started for the home is, by its command line (a replica's are whatever its run starts)."""
    if b"skyserve_lite\0controller\0run" in cmdline:
        return "controller"
    return "lb" if b"skyserve_lite.lb" in cmdline else "replica"
