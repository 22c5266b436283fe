"""The CLI of several controller hosts on one database: `controller up --db-url` checks the URL before anything
is touched (and warns when the first host keeps its state elsewhere), `controller status` lists every
controller sharing the database, `controller down HOST` hands a recorded host's services over (refused while
no other host's controller is live), and `serve status` shows a service's endpoint on every host (the host
side through the in-process transport; ssh to the host going down stood in for)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.cli.main import main
from skyserve_lite.controller.leases import LeaseSettings, plan_leases
from skyserve_lite.remote import config
from skyserve_lite.remote.client import RemoteController
from skyserve_lite.remote.config import ControllerRecord
from skyserve_lite.remote.ssh import SshTarget
from skyserve_lite.remote.transport import InProcessTransport
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.store import Store
from tests.controller.fake_crontab import install_fake_crontab

TASK = "service:\n  readiness_probe: /\n  replicas: 1\nrun: python -m http.server $PORT\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKY_LITE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SKY_LITE_CONTROLLER", raising=False)
    monkeypatch.delenv("SKY_LITE_DB_URL", raising=False)
    return tmp_path / "home"


@pytest.mark.parametrize(("url", "problem"), [
    ("mysql://sky:hunter2@db/serve", "the scheme must be postgresql://"),
    ("postgresql://sky:hunter2@db", "no database name"),
    ("postgresql://sky:hunter2@db/serve?password=x", "unknown option 'password'"),
])
def test_a_bad_db_url_is_refused_naming_the_argument_and_nothing_is_touched(home: Path, url: str,
                                                                           problem: str) -> None:
    result = CliRunner().invoke(main, ["controller", "up", "--ssh", "ops@127.0.0.3", "--db-url", url])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: --db-url: {problem}")
    assert "hunter2" not in result.stderr + result.stdout
    assert not home.exists()


def test_a_password_on_the_command_line_gets_a_note(home: Path) -> None:
    # A bad --remote-home: the run stops at that usage error, after the note and before any connection.
    result = CliRunner().invoke(main, ["controller", "up", "--ssh", "ops@127.0.0.3", "--remote-home", "-x",
                                       "--db-url", "postgresql://sky:hunter2@db/serve"])
    assert result.exit_code == 2
    note, error = result.stderr.splitlines()
    assert note == ("Note: a password on the command line can be seen by other users of this machine and in your "
                    "shell's history; `--db-url -` reads the URL from standard input.")
    assert error == "Error: --remote-home: '-x' is not a usable path" and "hunter2" not in result.stderr
    assert not home.exists()
    # Without a password, no note.
    result = CliRunner().invoke(main, ["controller", "up", "--ssh", "ops@127.0.0.3", "--remote-home", "-x",
                                       "--db-url", "postgresql://sky@db/serve"])
    assert result.stderr == "Error: --remote-home: '-x' is not a usable path\n"


def test_db_url_from_stdin_is_checked_too(home: Path) -> None:
    result = CliRunner().invoke(main, ["controller", "up", "--ssh", "ops@127.0.0.3", "--db-url", "-"],
                                input="postgresql://sky:hunter2@/serve\n")
    assert result.exit_code == 2 and result.stderr.startswith("Error: --db-url: no host")
    assert "hunter2" not in result.stderr and not home.exists()


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, RemoteController]]:
    """A host's state directory with one service and two controllers' rows: one live (it owns the service),
    one that stopped renewing a minute ago."""
    install_fake_crontab(tmp_path, monkeypatch)
    home = tmp_path / "host-home"
    store = Store.open(home)
    now = time.time()
    try:
        store.create_service("web", SubmittedTask(text=TASK, source="/t.yaml", spec=parse_task(TASK)), 30001, now)
        settings = LeaseSettings()
        for loop, host_address, at in (("gone-1-aaaaaa", "127.0.0.3", now - 60), ("live-2-bbbbbb", "127.0.0.2", now)):
            plan = plan_leases(store.list_leases(), at, loop, store.list_controllers(), settings)
            store.apply_leases(loop, host_address, plan, at, settings.ttl_seconds)
    finally:
        store.close()
    yield home, RemoteController(InProcessTransport(home))


def test_controller_status_lists_every_controller(host: tuple[Path, RemoteController]) -> None:
    _, remote = host
    result = CliRunner().invoke(main, ["controller", "status", "-o", "json"], obj=remote)
    assert result.exit_code == 0, result.stderr
    controllers = json.loads(result.stdout)["controllers"]
    assert [(c["id"], c["host"], c["services"], c["live"]) for c in controllers] == [
        ("live-2-bbbbbb", "127.0.0.2", ["web"], True), ("gone-1-aaaaaa", "127.0.0.3", [], False)]
    assert all(c["last_renewal"] for c in controllers)
    text = CliRunner().invoke(main, ["controller", "status"], obj=remote).stdout.splitlines()
    start = text.index("Controllers sharing the database (1 live):")
    assert text[start + 1].split() == ["ID", "HOST", "SERVICES", "LAST", "RENEWAL", "LIVE"]
    assert text[start + 2].split()[:3] == ["live-2-bbbbbb", "127.0.0.2", "web"] and text[start + 2].endswith("yes")
    assert text[start + 3].split()[:3] == ["gone-1-aaaaaa", "127.0.0.3", "-"] and text[start + 3].endswith("no")


def test_serve_status_shows_every_endpoint_and_which_are_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Live is answering as the service: the host whose loop stopped a minute ago still has its load balancer
    (they read the database and hold no state), the host whose controller renews has none at the port yet."""
    install_fake_crontab(tmp_path, monkeypatch)
    identity: list[bytes] = []

    class LoadBalancer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            assert self.path == "/.sky-lite/identity"
            self.send_response(200)
            self.send_header("Content-Length", str(len(identity[0])))
            self.end_headers()
            self.wfile.write(identity[0])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.3", 0), LoadBalancer)
    port = server.server_address[1]
    home = tmp_path / "host-home"
    store = Store.open(home)
    now = time.time()
    try:
        store.create_service("web", SubmittedTask(text=TASK, source="/t.yaml", spec=parse_task(TASK)), port, now)
        settings = LeaseSettings()
        for loop, host_address, at in (("gone-1-aaaaaa", "127.0.0.3", now - 60), ("live-2-bbbbbb", "127.0.0.2", now)):
            plan = plan_leases(store.list_leases(), at, loop, store.list_controllers(), settings)
            store.apply_leases(loop, host_address, plan, at, settings.ttl_seconds)
        identity.append(json.dumps({"service": "web", "controller_id": store.controller_id, "pid": 1}).encode())
    finally:
        store.close()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote = RemoteController(InProcessTransport(home))
    try:
        result = CliRunner().invoke(main, ["serve", "status", "web", "-o", "json"], obj=remote)
        assert result.exit_code == 0, result.stderr
        (service,) = json.loads(result.stdout)["services"]
        assert service["endpoints"] == [
            {"url": f"http://127.0.0.2:{port}", "live": False, "controller_live": True},
            {"url": f"http://127.0.0.3:{port}", "live": True, "controller_live": False}]
        text = CliRunner().invoke(main, ["serve", "status"], obj=remote).stdout
        assert f"Endpoints of web: http://127.0.0.2:{port} (not live), http://127.0.0.3:{port} (live)" in text
        identity[0] = identity[0].replace(b'"web"', b'"api"')  # another service's load balancer at the port
        result = CliRunner().invoke(main, ["serve", "status", "web", "-o", "json"], obj=remote)
        assert [e["live"] for e in json.loads(result.stdout)["services"][0]["endpoints"]] == [False, False]
    finally:
        server.shutdown()
        server.server_close()


def record(host: str) -> ControllerRecord:
    return ControllerRecord(target=SshTarget(host, 22, "ops"), remote_home="/srv/sky",
                            host_keys=(f"{host} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAaaaaaaaaaaaa",),
                            fingerprint="SHA256:x")


def test_down_names_the_host_to_stop_among_several(home: Path) -> None:
    config.save_record(home, record("127.0.0.2"))
    config.save_record(home, record("127.0.0.3"), add=True)
    result = CliRunner().invoke(main, ["controller", "down", "-y"])
    assert result.exit_code == 2
    assert result.stderr == ("Error: HOST: several controller hosts are recorded (ssh://ops@127.0.0.2:22, "
                             "ssh://ops@127.0.0.3:22); name the one to stop\n")
    assert len(config.load_records(home)) == 2


class HandOver:
    """Stands in for ssh to the host going down (``bootstrap.hand_over``): records the call and does what the
    host's loop does as it stops, releasing its leases; then the live controller's next pass claims them."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.calls: list[str] = []

    def __call__(self, shell: object, remote_home: str) -> None:
        self.calls.append(remote_home)
        store = Store.open(self.home)
        try:
            settings, now = LeaseSettings(), time.time()
            stopping = plan_leases(store.list_leases(), now, "gone-1-aaaaaa", {}, settings, stopping=True)
            store.apply_leases("gone-1-aaaaaa", "127.0.0.3", stopping, now, settings.ttl_seconds)
            store.forget_controller("gone-1-aaaaaa")
            claim = plan_leases(store.list_leases(), now, "live-2-bbbbbb", store.list_controllers(), settings)
            store.apply_leases("live-2-bbbbbb", "127.0.0.2", claim, now, settings.ttl_seconds)
        finally:
            store.close()


@pytest.fixture
def two_hosts(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, HandOver]:
    """Two recorded hosts on one database (the in-process host's): 127.0.0.3 owns web, 127.0.0.2 is live."""
    from skyserve_lite.cli import host_commands
    from skyserve_lite.remote import bootstrap

    install_fake_crontab(tmp_path, monkeypatch)
    state = tmp_path / "db-home"
    store = Store.open(state)
    try:
        now = time.time()
        store.create_service("web", SubmittedTask(text=TASK, source="/t.yaml", spec=parse_task(TASK)), 30001, now)
        settings = LeaseSettings()
        for loop, address in (("gone-1-aaaaaa", "127.0.0.3"), ("live-2-bbbbbb", "127.0.0.2")):
            plan = plan_leases(store.list_leases(), now, loop, store.list_controllers(), settings)
            store.apply_leases(loop, address, plan, now, settings.ttl_seconds)
    finally:
        store.close()
    config.save_record(home, record("127.0.0.2"))
    config.save_record(home, record("127.0.0.3"), add=True)
    handed = HandOver(state)
    monkeypatch.setattr(host_commands, "_open_hosts",
                        lambda _home, _records: RemoteController(InProcessTransport(state)))
    monkeypatch.setattr(bootstrap, "hand_over", handed)
    return state, handed


def test_down_host_hands_its_services_over_and_forgets_it(home: Path, two_hosts: tuple[Path, HandOver]) -> None:
    _, handed = two_hosts
    result = CliRunner().invoke(main, ["controller", "down", "127.0.0.3", "-y", "--timeout", "5"])
    assert result.exit_code == 0, result.stderr
    assert handed.calls == ["/srv/sky"]
    assert result.stdout == ("The controller on ssh://ops@127.0.0.3:22 is stopped; its services were handed over "
                             "(web -> 127.0.0.2).\n")
    assert [r.target.host for r in config.load_records(home)] == ["127.0.0.2"]


def test_down_host_by_controller_id(home: Path, two_hosts: tuple[Path, HandOver]) -> None:
    result = CliRunner().invoke(main, ["controller", "down", "gone-1-aaaaaa", "-y", "--timeout", "5"])
    assert result.exit_code == 0, result.stderr
    assert [r.target.host for r in config.load_records(home)] == ["127.0.0.2"]


def test_down_host_is_refused_while_no_other_host_is_live(home: Path, two_hosts: tuple[Path, HandOver]) -> None:
    state, handed = two_hosts
    store = Store.open(state)
    try:
        store.forget_controller("live-2-bbbbbb")  # the other host's controller is gone too
    finally:
        store.close()
    result = CliRunner().invoke(main, ["controller", "down", "127.0.0.3", "-y"])
    assert result.exit_code == 1
    assert result.stderr == ("Error: no controller of another host is live to take web over from "
                             "ssh://ops@127.0.0.3:22; start one first (`sky-lite controller status` lists them)\n")
    assert handed.calls == [] and len(config.load_records(home)) == 2


def test_down_names_an_unknown_host(home: Path, two_hosts: tuple[Path, HandOver]) -> None:
    result = CliRunner().invoke(main, ["controller", "down", "127.0.0.9", "-y"])
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: HOST: '127.0.0.9' is neither a recorded controller host (recorded: "
                                    "ssh://ops@127.0.0.2:22, ssh://ops@127.0.0.3:22)")


@pytest.mark.parametrize(("theirs", "warned"), [("0123456789ab", False), ("ba9876543210", True), (None, False)])
def test_adding_a_host_warns_when_the_first_keeps_its_state_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], theirs: str | None,
        warned: bool) -> None:
    """The first host's store says its controller id (the database's): another than the added host's means
    another database, and the two would not share their services."""
    from skyserve_lite.cli.host_commands import _warn_if_elsewhere
    from skyserve_lite.remote import connect

    class Described:
        controller_id = theirs

    class First:
        def describe(self) -> Described:
            return Described()

    monkeypatch.setattr(connect, "open_remote", lambda _home, _record: First())
    _warn_if_elsewhere(tmp_path, record("127.0.0.2"), "0123456789ab")
    err = capsys.readouterr().err
    assert ("another database" in err) is warned
    if warned:
        assert err.startswith("Warning: ssh://ops@127.0.0.2:22 keeps its state in another database (controller id "
                              "ba9876543210, this host's 0123456789ab)")


def test_a_host_that_does_not_answer_is_forgotten_only_with_force(home: Path, two_hosts: tuple[Path, HandOver],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from skyserve_lite.errors import ControllerError
    from skyserve_lite.remote import bootstrap

    def unreachable(shell: object, remote_home: str) -> None:
        raise ControllerError("removing the cron lines on ssh://ops@127.0.0.3:22 failed (exit 255): Connection refused")

    monkeypatch.setattr(bootstrap, "hand_over", unreachable)
    result = CliRunner().invoke(main, ["controller", "down", "127.0.0.3", "-y", "--timeout", "0"])
    assert result.exit_code == 1
    assert result.stderr.endswith("Connection refused; nothing changed (pass --force to forget the host: its services "
                                  "then move to the others after the lease TTL)\n")
    assert len(config.load_records(home)) == 2
    result = CliRunner().invoke(main, ["controller", "down", "127.0.0.3", "-y", "--force", "--timeout", "0"])
    assert result.exit_code == 0, result.stderr
    assert "forgetting it" in result.stderr
    assert [r.target.host for r in config.load_records(home)] == ["127.0.0.2"]
