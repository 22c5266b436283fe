"""The controller on an SSH host, end to end: a real sshd on 127.0.0.1, `controller up --ssh` installing
this sky-lite there, and every `serve` command going through it.

The "remote" host is this machine with its own state directory (``--remote-home``), reached only through
ssh: the local state directory holds nothing but the record of the host. Bootstrapping takes a while (a
virtual environment and its dependencies from the package index), so one host serves the whole module and
the tests run in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from skyserve_lite.controller.pidfile import read_controller_pid
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.remote.client import RemoteController
from skyserve_lite.remote.config import Choice, load_record
from skyserve_lite.remote.connect import record_shell, ssh_transport
from skyserve_lite.remote.transport import Channel
from skyserve_lite.spec.parse import load_task_file
from skyserve_lite.state.store import Store
from tests.controller.fake_crontab import write_fake_crontab
from tests.e2e.conftest import SkyLite, http_get, wait_until
from tests.remote.sshd import SSHD, Sshd, start_sshd

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(SSHD is None, reason="needs OpenSSH's sshd (.ci/run installs it)")]

TASK = """\
name: web
service:
  readiness_probe: /
  replicas: {replicas}
envs:
  GREETING: {greeting}
run: |
  exec python3 -u -c '
  import http.server, os
  replica, greeting = os.environ["SKY_LITE_REPLICA_ID"], os.environ["GREETING"]
  class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):
          body = f"{{greeting}} from replica {{replica}}\\n".encode()
          self.send_response(200)
          self.send_header("Content-Length", str(len(body)))
          self.end_headers()
          self.wfile.write(body)
      def log_message(self, fmt, *args):
          print("served", fmt % args, flush=True)
  http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
  '
"""


@dataclass
class Host:
    sshd: Sshd
    local: SkyLite  # commands run here, against the recorded host
    remote: SkyLite  # the host's state directory (only to look at, and to clean up)
    crontab: Path
    folder: Path

    def task(self, replicas: int, greeting: str, name: str = "task.yaml") -> Path:
        path = self.folder / name
        path.write_text(TASK.format(replicas=replicas, greeting=greeting))
        return path

    def remote_controller(self) -> RemoteController:
        record = load_record(self.local.home)
        assert record is not None
        return RemoteController(ssh_transport(self.local.home, Choice(record=record)))

    def remote_pid(self) -> int | None:
        return read_controller_pid(self.remote.home)


def _base_python() -> str:
    return str(getattr(sys, "_base_executable", sys.executable))


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    folder = tmp_path_factory.mktemp("ssh-host")
    server = start_sshd(folder / "sshd", session_env={"SKY_LITE_CONTROLLER_INTERVAL_SECONDS": "0.5",
                                                      "SKY_LITE_DRAIN_SECONDS": "1"})
    crontab = folder / "crontab.txt"
    write_fake_crontab(server.bin_dir, crontab)
    local, remote = SkyLite(folder / "local-home"), SkyLite(folder / "remote-home")
    result = local.run("controller", "up", "--ssh", server.target, "-i", str(server.client_key),
                       "--remote-home", str(remote.home), "--remote-python", _base_python(), timeout=600)
    assert "pinned" in result.stdout
    found = Host(server, local, remote, crontab, folder)
    record = load_record(local.home)
    assert record is not None
    try:
        yield found
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired, AssertionError):
            local.run("controller", "down", "--force", "-y", check=False, timeout=120)
        record_shell(local.home, record).close()  # the shared connection, whatever state the tests left
        remote.cleanup()
        server.stop()


def test_controller_up_installs_records_and_supervises(host: Host) -> None:
    record = load_record(host.local.home)
    assert record is not None and record.remote_home == str(host.remote.home)
    assert record.fingerprint.startswith("SHA256:")
    # The local home holds the record and the pinned key, no state of its own.
    assert not (host.local.home / "state.db").exists()
    assert (host.remote.home / "venv" / "bin" / "sky-lite").is_file()
    cron = host.crontab.read_text()
    ensure_lines = [line for line in cron.splitlines() if line.endswith("controller.log 2>&1")]
    assert [line.split(" SKY_LITE_HOME")[0] for line in ensure_lines] == ["@reboot", "* * * * *"]
    assert all(f"SKY_LITE_HOME={host.remote.home} " in line for line in ensure_lines)
    status = json.loads(host.local.run("controller", "status", "-o", "json").stdout)
    assert status["where"] == record.target.url
    assert status["running"] is True and status["cron_installed"] is True
    assert status["home"] == str(host.remote.home) and status["services"] == []
    # Idempotent: running it again changes nothing on a complete install...
    again = host.local.run("controller", "up", "--ssh", host.sshd.target, "-i", str(host.sshd.client_key),
                           "--remote-home", str(host.remote.home), "--remote-python", _base_python(), timeout=600)
    assert "pinned" in again.stdout
    assert host.crontab.read_text() == cron
    # ...and repairs a half-done one: cron lines lost, loop stopped.
    host.crontab.unlink()
    subprocess.run([str(host.remote.home / "venv" / "bin" / "sky-lite"), "controller", "stop"], check=True,
                   env=dict(os.environ, SKY_LITE_HOME=str(host.remote.home)), capture_output=True)
    host.local.run("controller", "up", "--ssh", host.sshd.target, "-i", str(host.sshd.client_key),
                   "--remote-home", str(host.remote.home), "--remote-python", _base_python(), timeout=600)
    assert host.crontab.read_text() == cron
    assert json.loads(host.local.run("controller", "status", "-o", "json").stdout)["running"] is True


@pytest.mark.timeout(900)  # its waits, each generous under load, add up past the default 300 s
def test_serve_lifecycle_through_the_host(host: Host) -> None:
    sky = host.local
    sky.run("serve", "up", str(host.task(2, "hello")), "--timeout", "120", timeout=180)
    status = sky.status("web")
    (service,) = status["services"]
    assert service["status"] == "READY"
    code, body = http_get(service["endpoint"])
    assert code == 200 and body.startswith("hello from replica")
    # The state lives on the host.
    assert (host.remote.home / "state.db").exists() and not (sky.home / "state.db").exists()

    # Scale-only: the two replicas are kept, their version bumped; one more is launched.
    plan = json.loads(sky.run("serve", "update", "web", str(host.task(3, "hello", "scaled.yaml")), "--dry-run",
                              "-o", "json").stdout)
    assert [r["action"] for r in plan["replicas"]] == ["reuse", "reuse"]
    sky.run("serve", "update", "web", str(host.task(3, "hello", "scaled.yaml")), "-y")
    # Generous: each look is a `serve status` through ssh, and under the whole suite's load one update took
    # longer than 90 s here (25 s alone).
    wait_until(lambda: _ready_ids(sky) == {1, 2, 3} and _versions(sky) == {2}, 180, "3 READY replicas at v2")

    # Replacing: the env changed, so every replica is replaced.
    sky.run("serve", "update", "web", str(host.task(3, "bonjour", "replaced.yaml")), "-y")
    wait_until(lambda: _versions(sky) == {3} and len(_ready_ids(sky)) == 3 and not _ready_ids(sky) & {1, 2, 3},
               180, "3 new READY replicas at v3")
    assert http_get(sky.status("web")["services"][0]["endpoint"])[1].startswith("bonjour")

    # Rollback goes back to version 2's task through the host: a new version, replicas replaced again.
    sky.run("serve", "rollback", "web", "-y")
    wait_until(lambda: _versions(sky) == {4} and len(_ready_ids(sky)) == 3, 180, "3 READY replicas at v4")
    assert http_get(sky.status("web")["services"][0]["endpoint"])[1].startswith("hello")

    # History and logs come from the host; --follow streams until stopped.
    history = json.loads(sky.run("serve", "history", "web", "-o", "json").stdout)
    assert [v["version"] for v in history["versions"]] == [1, 2, 3, 4]
    assert history["versions"][3]["note"] == "rollback to version 2"
    assert "controller" in sky.run("serve", "logs", "web", "--controller", "--no-follow").stdout
    replica = min(_ready_ids(sky))
    assert "served" in sky.run("serve", "logs", "web", str(replica), "--no-follow").stdout
    assert sky.run("serve", "logs", "web", str(replica), "--no-follow", "--tail", "1").stdout.count("\n") == 1
    follower = subprocess.Popen([sys.executable, "-m", "skyserve_lite", "serve", "logs", "web", str(replica),
                                 "--follow"], env=sky.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        endpoint = sky.status("web")["services"][0]["endpoint"]
        marker = "/followed-path"
        assert follower.stdout is not None
        os.set_blocking(follower.stdout.fileno(), False)
        seen = b""

        def streamed() -> bool:
            nonlocal seen
            http_get(endpoint + marker)
            seen += follower.stdout.read() or b""  # type: ignore[union-attr]
            return marker.encode() in seen

        wait_until(streamed, 30, "a new request in the followed log")
    finally:
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=15)
    wait_until(lambda: not _remote_followers(host), 15, "the host's follow to stop once the client left")

    sky.run("serve", "down", "web", "-y", timeout=120)
    assert sky.status()["services"] == []


def test_a_killed_controller_is_back_from_the_cron_line(host: Host) -> None:
    pid = wait_until(host.remote_pid, 30, "the host's controller pid")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not json.loads(host.local.run("controller", "status", "-o", "json").stdout)["running"], 15,
               "the controller to be seen dead")
    line = next(ln for ln in host.crontab.read_text().splitlines() if ln.startswith("* * * * *"))
    command = line.split(" ", 5)[5]
    subprocess.run(["env", "-i", "/bin/sh", "-c", command], check=True, timeout=60)
    status = json.loads(host.local.run("controller", "status", "-o", "json").stdout)
    assert status["running"] is True and status["pid"] != pid


def test_a_dropped_connection_during_an_update_stores_one_version(host: Host) -> None:
    sky = host.local
    sky.run("serve", "up", str(host.task(1, "hi", "one.yaml")), "-n", "drop", "--no-wait")
    controller = host.remote_controller()
    inner = controller.transport
    killed: list[int] = []

    class DropFirstSubmit:
        where = inner.where

        def open(self) -> Channel:
            channel = inner.open()
            original_close = channel.stdin.close

            def close_then_drop() -> None:
                original_close()
                if killed:
                    return
                # The request is on its way: let the host store the version, then cut the connection
                # before the answer is read, as a network failure would.
                wait_until(lambda: _stored_versions(host, "drop") == 2, 30, "the host to store version 2")
                channel.kill()
                killed.append(1)

            channel.stdin.close = close_then_drop  # type: ignore[method-assign]
            return channel

    controller.transport = DropFirstSubmit()
    task = load_task_file(host.task(1, "hi again", "two.yaml"))
    version = controller.submit_update("drop", task, UpdateMode.ROLLING)
    assert killed, "the first attempt's connection was cut"
    assert version.version == 2
    assert _stored_versions(host, "drop") == 2
    history = json.loads(sky.run("serve", "history", "drop", "-o", "json").stdout)
    assert [v["version"] for v in history["versions"]] == [1, 2]
    sky.run("serve", "down", "drop", "-y", timeout=120)


def test_a_version_mismatch_is_refused_until_upgrade_which_keeps_serving(host: Host) -> None:
    sky = host.local
    sky.run("serve", "up", str(host.task(1, "steady", "steady.yaml")), "-n", "steady", "--timeout", "120",
            timeout=180)
    (service,) = sky.status("steady")["services"]
    before = {r["instance_id"] for r in service["replicas"]}

    # The host's sky-lite becomes another version (its loop restarted on it).
    init = next((host.remote.home / "venv" / "lib").glob("python*/site-packages/skyserve_lite/__init__.py"))
    original = init.read_text()
    init.write_text(original.replace('__version__ = "', '__version__ = "9.9.'))
    host_sky_lite = [str(host.remote.home / "venv" / "bin" / "sky-lite"), "controller"]
    host_env = dict(os.environ, SKY_LITE_HOME=str(host.remote.home))
    for command in ("stop", "ensure"):
        subprocess.run([*host_sky_lite, command], env=host_env, check=True, capture_output=True, timeout=60)
    result = sky.run("serve", "status", check=False)
    assert result.returncode == 1
    assert "sky-lite controller upgrade" in result.stderr and "9.9." in result.stderr
    status = json.loads(sky.run("controller", "status", "-o", "json").stdout)  # describe still answers
    assert status["sky_lite"].startswith("9.9.")

    # Upgrading restarts the loop only: the service answers throughout, on the same replicas.
    failures: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            code, _body = http_get(service["endpoint"])
            if code != 200:
                failures.append(str(code))
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        sky.run("controller", "upgrade", "--remote-python", _base_python(), timeout=600)
    finally:
        stop.set()
        poller.join(timeout=10)
    assert failures == []
    assert init.read_text() == original
    status = json.loads(sky.run("controller", "status", "-o", "json").stdout)
    assert status["sky_lite"] == status["client_sky_lite"] and status["running"] is True
    (after,) = sky.status("steady")["services"]
    assert {r["instance_id"] for r in after["replicas"]} == before and after["status"] == "READY"
    sky.run("serve", "down", "steady", "-y", timeout=120)


def test_a_changed_host_key_is_refused(host: Host) -> None:
    saved = {name: (host.sshd.folder / name).read_bytes() for name in ("host_ed25519", "host_ed25519.pub")}
    host.sshd.restart(new_host_key=True)
    try:
        result = host.local.run("serve", "status", check=False)
        assert result.returncode == 1
        assert "host key" in result.stderr and "pinned" in result.stderr.lower()
        again = host.local.run("controller", "up", "--ssh", host.sshd.target, "-i", str(host.sshd.client_key),
                               "--remote-home", str(host.remote.home), check=False)
        assert again.returncode == 1 and "changed" in again.stderr
    finally:
        host.sshd.stop()
        for name, data in saved.items():
            (host.sshd.folder / name).write_bytes(data)
            (host.sshd.folder / name).chmod(0o600)
        host.sshd.start()
    assert host.local.run("serve", "status").returncode == 0


def test_controller_down_removes_its_lines_and_stops_it(host: Host) -> None:
    host.crontab.write_text("MAILTO=me\n" + host.crontab.read_text())
    host.local.run("serve", "up", str(host.task(1, "hi", "last.yaml")), "-n", "last", "--no-wait")
    refused = host.local.run("controller", "down", "-y", check=False)
    assert refused.returncode == 1 and "last" in refused.stderr
    # `serve down --all --force` runs on the host: it stops what the host's home started, loop included.
    forced = host.local.run("serve", "down", "--all", "--force", "-y")
    assert "Stopped the controller" in forced.stdout and host.remote_pid() is None
    host.local.run("controller", "down", "-y", "--force", timeout=180)
    assert host.crontab.read_text() == "MAILTO=me\n"
    assert load_record(host.local.home) is None
    wait_until(lambda: not host.remote.processes(), 30, "every process of the host's home to stop")


def serve_one_through_the_host(sky: SkyLite, folder: Path) -> None:
    """Up a one-replica service through the recorded host, answer through its endpoint, take it down."""
    task = folder / "task.yaml"
    task.write_text(TASK.format(replicas=1, greeting="hello"))
    sky.run("serve", "up", str(task), "--timeout", "120", timeout=180)
    (service,) = sky.status("web")["services"]
    assert http_get(service["endpoint"])[1].startswith("hello from replica")
    sky.run("serve", "down", "web", "-y", timeout=120)


def _ready_ids(sky: SkyLite) -> set[int]:
    (service,) = sky.status("web")["services"]
    return {r["replica_id"] for r in service["replicas"] if r["status"] == "READY"}


def _versions(sky: SkyLite) -> set[int]:
    (service,) = sky.status("web")["services"]
    return {r["version"] for r in service["replicas"] if r["status"] == "READY"}


def _stored_versions(host: Host, name: str) -> int:
    store = Store.open(host.remote.home, create=False)
    try:
        return len(store.list_versions(name))
    finally:
        store.close()


def _remote_followers(host: Host) -> list[int]:
    found = []
    for pid in host.remote.processes():
        with contextlib.suppress(OSError):
            if b"rpc" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found

