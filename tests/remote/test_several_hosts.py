"""Several controller hosts on one database, as this machine records them: the order of the hosts, their
pinned keys side by side, which one a name designates, the database URL reaching a host through ssh's stdin
only, and the client moving to the next host when one does not answer."""

from __future__ import annotations

import json
import stat
import sys
import urllib.parse
from pathlib import Path

import pytest

from skyserve_lite.controller.host import HostSettings
from skyserve_lite.errors import ControllerError, StateConflictError
from skyserve_lite.remote import bootstrap, config, hosting
from skyserve_lite.remote.client import RemoteController
from skyserve_lite.remote.config import ControllerRecord
from skyserve_lite.remote.ssh import SshTarget
from skyserve_lite.remote.transport import CommandTransport, InProcessTransport
from skyserve_lite.state.dburl import parse_database_url, passfile_line
from skyserve_lite.state.store import Store

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
PASSWORD = "s3cr:et@/x"


def record(host: str, port: int = 22, key: str = KEY_A, home: str = "/srv/sky") -> ControllerRecord:
    return ControllerRecord(target=SshTarget(host, port, "ops"), remote_home=home, host_keys=(f"{host} {key}",),
                            fingerprint="SHA256:x")


A, B, C = record("127.0.0.2"), record("127.0.0.3", key=KEY_B), record("127.0.0.4")


@pytest.mark.parametrize(("records", "saved", "add", "expected"), [
    ((), A, False, (A,)),
    ((A,), B, True, (A, B)),
    ((A, B), B, True, (A, B)),  # the host of B again: in its place
    ((A, B), record("127.0.0.3", home="/other"), False, (A, record("127.0.0.3", home="/other"))),
    ((A, B), C, False, (C, B)),  # not added: it replaces the first (a controller VM at a new address)
    ((A, B), C, True, (A, B, C)),
])
def test_plan_records(records: tuple[ControllerRecord, ...], saved: ControllerRecord, add: bool,
                      expected: tuple[ControllerRecord, ...]) -> None:
    assert config.plan_records(records, saved, add=add) == expected


def test_hosts_are_kept_in_order_with_every_pinned_key(tmp_path: Path) -> None:
    config.save_record(tmp_path, A)
    # One host: the record alone, as an older sky-lite wrote and reads it.
    assert json.loads(config.record_path(tmp_path).read_text())["target"]["host"] == "127.0.0.2"
    config.save_record(tmp_path, B, add=True)
    assert config.load_records(tmp_path) == (A, B)
    assert config.load_record(tmp_path) == A
    assert stat.S_IMODE(config.record_path(tmp_path).stat().st_mode) == 0o600
    known = config.known_hosts_path(tmp_path).read_text().splitlines()
    assert [line.split()[0] for line in known] == ["127.0.0.2", "127.0.0.3"]
    choice = config.choose_controller(tmp_path, {})
    assert (choice.record, choice.others) == (A, (B,))
    # SKY_LITE_CONTROLLER may name the second host: it is used alone.
    named = config.choose_controller(tmp_path, {config.SELECT_SETTING: "ssh://ops@127.0.0.3:22"})
    assert (named.record, named.others) == (B, ())
    config.remove_host(tmp_path, A)
    assert config.load_records(tmp_path) == (B,)
    assert [line.split()[0] for line in config.known_hosts_path(tmp_path).read_text().splitlines()] == ["127.0.0.3"]
    config.remove_host(tmp_path, B)
    assert config.load_records(tmp_path) == () and not config.record_path(tmp_path).exists()


@pytest.mark.parametrize(("name", "found"), [
    ("127.0.0.3", B), ("ops@127.0.0.3", B), ("127.0.0.3:22", B), ("ssh://ops@127.0.0.3:22", B),
    ("127.0.0.3:2222", None), ("root@127.0.0.3", None), ("127.0.0.9", None), ("127.0.0.2", A),
])
def test_find_record(name: str, found: ControllerRecord | None) -> None:
    assert config.find_record((A, B), name) == found


def test_another_host_without_db_url_is_refused_before_any_connection(tmp_path: Path) -> None:
    config.save_record(tmp_path, A)
    request = hosting.UpRequest(target=SshTarget("127.0.0.3", 22, "ops"), cloud=None)
    with pytest.raises(StateConflictError, match="--db-url"):
        hosting.bring_up(tmp_path, request, say=lambda _line: None)
    assert config.load_records(tmp_path) == (A,)


@pytest.mark.parametrize(("host", "lb_host", "endpoint_host"), [
    ("127.0.0.2", "127.0.0.2", "127.0.0.2"),  # one of several controllers on one machine: its own address
    ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
    ("localhost", "127.0.0.1", "localhost"),
    ("::1", "::1", "::1"),  # load balancers bind where the endpoints say they are
    ("10.0.0.1", "0.0.0.0", "10.0.0.1"),
    ("203.0.113.5", "0.0.0.0", "203.0.113.5"),
])
def test_host_settings_of_an_ssh_host(host: str, lb_host: str, endpoint_host: str) -> None:
    assert hosting.host_settings_of(record(host)) == HostSettings(lb_host=lb_host, endpoint_host=endpoint_host)


class RecordingShell:
    """A ``RemoteShell`` that records each command line and what went to its stdin."""

    def __init__(self) -> None:
        self.target = SshTarget("127.0.0.3", 22, "ops")
        self.calls: list[tuple[str, bytes | None]] = []

    def run(self, command: str, *, what: str, stdin: bytes | None = None, timeout_seconds: float = 900) -> str:
        self.calls.append((command, stdin))
        return ""


def quoted(password: str) -> str:
    return urllib.parse.quote(password, safe="")


def test_the_database_url_reaches_the_host_on_stdin_only(tmp_path: Path) -> None:
    url = parse_database_url(f"postgresql://sky:{quoted(PASSWORD)}@db.internal:6432/serve?sslmode=verify-full",
                             "--db-url")
    shell = RecordingShell()
    wheel = tmp_path / "sky.whl"
    wheel.write_bytes(b"wheel")
    plan = bootstrap.HostPlan(remote_home="/srv/sky", extras=("postgres",), database=url)
    bootstrap.install(shell, plan, "/srv/sky", wheel, restart=False)  # type: ignore[arg-type]
    commands = [command for command, _ in shell.calls]
    assert not any(PASSWORD in command or "s3cr" in command for command in commands)
    (setting,) = [(command, stdin) for command, stdin in shell.calls if "db_url" in command]
    assert setting[0].endswith("config set db_url -")
    assert setting[1] is not None
    sent = parse_database_url(setting[1].decode().strip(), "--db-url")
    assert sent == url and sent.password is not None and sent.password.reveal() == PASSWORD
    # Set before the loop starts: its first pass already runs on the database.
    assert commands.index(setting[0]) < next(i for i, c in enumerate(commands) if "controller ensure" in c)
    assert "[postgres]" in next(command for command in commands if "pip" in command)


def test_the_host_keeps_the_password_in_its_pgpass(tmp_path: Path) -> None:
    """What `config set db_url -` on the host makes of what ``install`` sends: the password in the libpq
    password file (0600), the URL without it in the settings."""
    from click.testing import CliRunner

    from skyserve_lite.cli.main import main
    from skyserve_lite.state.dburl import Password, find_database_url

    url = parse_database_url(f"postgresql://sky:{quoted(PASSWORD)}@db.internal/serve", "--db-url")
    result = CliRunner().invoke(main, ["config", "set", "db_url", "-"], input=url.text_with_password() + "\n",
                                env={"SKY_LITE_HOME": str(tmp_path), "SKY_LITE_DB_URL": ""})
    assert result.exit_code == 0, result.stderr
    assert PASSWORD not in (tmp_path / "config.json").read_text()
    assert (tmp_path / "pgpass").read_text() == passfile_line(url, Password(PASSWORD))
    assert stat.S_IMODE((tmp_path / "pgpass").stat().st_mode) == 0o600
    found = find_database_url(tmp_path, {})
    assert found is not None and found.text_without_password() == url.text_without_password()
    assert found.passfile == tmp_path / "pgpass" and found.password is None


def test_the_client_moves_to_the_next_host_when_one_does_not_answer(tmp_path: Path) -> None:
    """ssh exits 255 when it cannot reach a host: the next host on the database answers at once, and the
    user is told which did not and which did."""
    home = tmp_path / "host-b"
    Store.open(home).close()
    unreachable = CommandTransport([sys.executable, "-c", "import sys; sys.stderr.write("
                                    "'ssh: connect to host 127.0.0.2 port 22: Connection refused\\n'); sys.exit(255)"],
                                   where="ssh://ops@127.0.0.2:22")
    said: list[str] = []
    client = RemoteController(unreachable, retry_pause_seconds=0, say=said.append,
                              fallbacks=[InProcessTransport(home)])
    assert client.describe().home == str(home)
    assert said == [f"The controller at ssh://ops@127.0.0.2:22 (exit 255: ssh: connect to host 127.0.0.2 port 22: "
                    f"Connection refused) did not answer; in-process controller of {home} answered."]
    # The rest of the command stays with the host that answered.
    assert client.transport.where == f"in-process controller of {home}"
    assert client.list_controllers() == []


def test_with_no_host_answering_the_error_names_every_one(tmp_path: Path) -> None:
    def down(where: str) -> CommandTransport:
        return CommandTransport([sys.executable, "-c", "import sys; sys.exit(255)"], where=where)

    client = RemoteController(down("ssh://a:22"), retry_pause_seconds=0, fallbacks=[down("ssh://b:22")])
    with pytest.raises(ControllerError, match=r"at ssh://b:22 3 times \(exit 255: no answer\) \(and ssh://a:22 "):
        client.describe()


def test_a_submission_whose_host_dropped_is_asked_of_the_next_host_and_stored_once(tmp_path: Path) -> None:
    """The first host stored `serve up` and its answer was lost: the next host (same database) is asked what
    became of it before anything is sent again, and answers with the version stored, storing none."""
    from tests.remote.test_reconnect import WHERE, Lossy, _task

    home = tmp_path / "db-home"
    Store.open(home).close()
    first = Lossy(home, fate=lambda request, _n: "after" if request["method"] == "create_service" else None)
    said: list[str] = []
    client = RemoteController(first, retry_pause_seconds=0, submission_secret=bytes(range(32)), say=said.append,
                              fallbacks=[InProcessTransport(home)])
    service = client.create_service("web", _task(tmp_path / "task", 1))
    assert service.name == "web" and service.current_version == 1
    store = Store.open(home, create=False)
    try:
        assert [v.version for v in store.list_versions("web")] == [1]
    finally:
        store.close()
    assert f"The connection to {WHERE} dropped before its answer arrived; the controller had stored it (version " \
           "1). Asking for its answer again." in said
    assert any(line.startswith(f"The controller at {WHERE} (") and "did not answer; in-process controller" in line
               for line in said), said
