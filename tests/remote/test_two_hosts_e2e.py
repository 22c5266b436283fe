"""Two controller hosts on one PostgreSQL, end to end: two sshds on this machine at 127.0.0.2 and 127.0.0.3 (two
"hosts", each with an address of its own), `controller up --ssh ... --db-url -` installing this sky-lite on
each with its state in one database (the test server of tests/postgres.py, a user with a password), and every
command going through them.

What it shows, in order: both controllers listed live; the service's endpoint answering on both hosts;
`controller down HOST` handing the service over with nothing launched again; the host added again; the
owner's loop killed with its cron entry gone: the other host takes the service over within the lease TTL
while its endpoint keeps answering; and with the first host's sshd gone, the CLI moving to the other host.

The hosts' controllers name one directory for local replicas (``SKY_LITE_LOCAL_REPLICAS_DIR``), as two hosts of
one cloud list one account's instances: the local provider's inventory is its replica directories, and without a
shared one a controller taking a service over would see none of its replicas. Bootstrapping two hosts takes a
while (a virtual environment and its dependencies each), so it is one test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.controller.pidfile import read_controller_pid
from skyserve_lite.remote.config import load_records
from tests.controller.fake_crontab import write_fake_crontab
from tests.e2e.conftest import SkyLite, answering_run, http_get, wait_until
from tests.postgres import PASSWORD, PASSWORD_USER, PostgresServer
from tests.remote.sshd import SSHD, Sshd, start_sshd

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(SSHD is None, reason="needs OpenSSH's sshd (.ci/run installs it)")]

# The hosts' controllers: a pass every 0.5 s, leases of 4 s renewed every second, so a takeover is seconds.
TTL_SECONDS = 4
SESSION_ENV = {"SKY_LITE_CONTROLLER_INTERVAL_SECONDS": "0.5", "SKY_LITE_DRAIN_SECONDS": "1",
               "SKY_LITE_LEASE_TTL_SECONDS": str(TTL_SECONDS), "SKY_LITE_LEASE_RENEW_SECONDS": "1"}
TASK = """\
name: web
service:
  readiness_probe: /
  replicas: 1
""" + answering_run('"hello from replica " + os.environ["SKY_LITE_REPLICA_ID"]')


@dataclass
class Host:
    sshd: Sshd
    home: Path  # its state directory (looked at, and cleaned up, from here)
    crontab: Path  # what its fake `crontab` keeps: its cron entry

    @property
    def address(self) -> str:
        return self.sshd.address

    def loop_pid(self) -> int | None:
        return read_controller_pid(self.home)


@dataclass
class Setup:
    local: SkyLite
    hosts: dict[str, Host]  # by address
    db_url: str

    def up(self, host: Host) -> subprocess.CompletedProcess[str]:
        """`controller up --ssh HOST --db-url -`, the URL with its password on stdin."""
        argv = [sys.executable, "-m", "skyserve_lite", "controller", "up", "--ssh", host.sshd.target,
                "-i", str(host.sshd.client_key), "--remote-home", str(host.home),
                "--remote-python", str(getattr(sys, "_base_executable", sys.executable)), "--db-url", "-"]
        result = subprocess.run(argv, input=self.db_url + "\n", env=self.local.env, capture_output=True, text=True,
                                timeout=900, check=False)
        assert result.returncode == 0, result.stderr
        return result

    def controllers(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = json.loads(self.local.run("controller", "status", "-o", "json").stdout)[
            "controllers"]
        return result

    def owner(self, service: str) -> str | None:
        """The address of the live controller that owns ``service``."""
        return next((c["host"] for c in self.controllers() if c["live"] and service in c["services"]), None)

    def service(self) -> dict[str, Any]:
        result: dict[str, Any] = self.local.status("web")["services"][0]
        return result


@pytest.fixture
def setup(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[Setup]:
    database = postgres_server.create_database(owner=PASSWORD_USER)
    replicas = tmp_path / "replicas"
    replicas.mkdir(mode=0o700)
    hosts: dict[str, Host] = {}
    for address in ("127.0.0.2", "127.0.0.3"):
        folder = tmp_path / f"host-{address}"
        server = start_sshd(folder / "sshd", session_env={**SESSION_ENV, "SKY_LITE_LOCAL_REPLICAS_DIR": str(replicas)},
                            address=address)
        crontab = folder / "crontab.txt"
        write_fake_crontab(server.bin_dir, crontab)
        hosts[address] = Host(server, folder / "state", crontab)
    found = Setup(SkyLite(tmp_path / "local-home"), hosts,
                  postgres_server.url(database, PASSWORD_USER, PASSWORD))
    try:
        yield found
    finally:
        for host in hosts.values():
            for pid in SkyLite(host.home).processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            host.sshd.stop()
        postgres_server.drop_database(database)


def test_two_hosts_share_one_database(setup: Setup) -> None:
    a, b = setup.hosts["127.0.0.2"], setup.hosts["127.0.0.3"]
    setup.up(a)
    added = setup.up(b)
    assert "another database" not in added.stderr  # the first host's state is in the same database
    assert "too" in added.stdout and [r.target.host for r in load_records(setup.local.home)] == ["127.0.0.2",
                                                                                               "127.0.0.3"]
    # The password is in each host's libpq password file only: not in a settings file, nor in the record here.
    for host in (a, b):
        assert PASSWORD not in (host.home / "config.json").read_text()
        assert stat.S_IMODE((host.home / "pgpass").stat().st_mode) == 0o600
    assert PASSWORD not in (setup.local.home / "controller.json").read_text()
    wait_until(lambda: [c["live"] for c in setup.controllers()] == [True, True], 60, "both controllers live")
    assert sorted(c["host"] for c in setup.controllers()) == ["127.0.0.2", "127.0.0.3"]

    setup.local.run("serve", "up", str(_task(setup)), "--timeout", "180", timeout=240)
    wait_until(lambda: setup.service()["status"] == "READY", 60, "web READY")
    # Every host answers at the service's port, on its own address.
    port = setup.service()["endpoint"].rsplit(":", 1)[1]
    endpoints = {f"http://{address}:{port}" for address in setup.hosts}
    wait_until(lambda: {e["url"] for e in setup.service()["endpoints"] if e["live"]} == endpoints, 30,
               "both endpoints live in serve status")
    for url in endpoints:
        wait_until(lambda url=url: answer(url) == 200, 60, f"{url} to answer")
    (replica,) = [r["replica_id"] for r in setup.service()["replicas"]]

    # `controller down HOST` hands the service over before it stops: the other host owns it, and the replica
    # that served it serves on (nothing launched again).
    first_owner = wait_until(lambda: setup.owner("web"), 30, "an owner of web")
    other = next(address for address in setup.hosts if address != first_owner)
    down = setup.local.run("controller", "down", first_owner, "-y", "--timeout", "60", timeout=120)
    assert f"web -> {other}" in down.stdout
    assert setup.owner("web") == other
    assert [r["replica_id"] for r in setup.service()["replicas"]] == [replica]
    assert setup.hosts[first_owner].loop_pid() is None
    assert [r.target.host for r in load_records(setup.local.home)] == [other]
    assert answer(f"http://{other}:{port}") == 200

    # The host comes back (it is second in the record now); the owner's loop is then killed and its cron entry
    # removed, as a host that is gone: the other takes the service over within the lease TTL, and its endpoint
    # answers all along.
    setup.up(setup.hosts[first_owner])
    wait_until(lambda: all(c["live"] for c in setup.controllers()) and len(setup.controllers()) == 2, 60,
               "both controllers live again")
    owner = setup.hosts[other]
    survivor = setup.hosts[first_owner]
    assert setup.owner("web") == other  # it kept the service: 1 service, 2 controllers, nothing to spread
    owner.crontab.unlink()
    pid = owner.loop_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    answers: list[int] = []

    def taken_over() -> bool:
        answers.append(answer(f"http://{survivor.address}:{port}"))
        return setup.owner("web") == survivor.address

    wait_until(taken_over, 60, "the other host to take web over")
    took = time.monotonic() - killed_at
    print(f"takeover after kill -9: {took:.1f}s (lease TTL {TTL_SECONDS}s)")
    assert set(answers) == {200}, answers
    assert [r["replica_id"] for r in setup.service()["replicas"]] == [replica]
    # The killed loop's load balancer serves on (it reads the database): its endpoint is live, its controller
    # is not.
    assert answer(f"http://{owner.address}:{port}") == 200
    wait_until(lambda: sorted((e["url"], e["live"], e["controller_live"]) for e in setup.service()["endpoints"]) == [
        (f"http://{address}:{port}", True, address == survivor.address) for address in sorted(setup.hosts)], 30,
        "the killed host's endpoint live with its controller not")

    # The first recorded host is gone for good: the CLI moves to the other and says so.
    owner.sshd.stop()
    result = setup.local.run("serve", "status", "web", "-o", "json")
    assert json.loads(result.stdout)["services"][0]["status"] == "READY"
    assert f"ssh://{owner.sshd.target.split('@')[0]}@{owner.address}:{owner.sshd.port}" in result.stderr
    assert f"did not answer; ssh://{survivor.sshd.target.split('@')[0]}@{survivor.address}:" in result.stderr
    assert answer(f"http://{survivor.address}:{port}") == 200


def answer(url: str) -> int:
    """The status ``url`` answers with; 0 when nothing listens there (yet)."""
    try:
        return http_get(url)[0]
    except OSError:
        return 0


def _task(setup: Setup) -> Path:
    path = setup.local.home.parent / "task.yaml"
    path.write_text(TASK)
    return path
