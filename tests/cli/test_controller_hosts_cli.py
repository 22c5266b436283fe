"""The CLI of several controller hosts on one database: `controller up --db-url` checks the URL before anything
is touched, `controller status` lists every controller sharing the database, `controller down HOST` names a
recorded host, and `serve status` shows a service's endpoint on every host (the host side through the
in-process transport)."""

from __future__ import annotations

import json
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


def test_serve_status_shows_every_endpoint_and_which_are_live(host: tuple[Path, RemoteController]) -> None:
    _, remote = host
    result = CliRunner().invoke(main, ["serve", "status", "web", "-o", "json"], obj=remote)
    assert result.exit_code == 0, result.stderr
    (service,) = json.loads(result.stdout)["services"]
    assert service["endpoints"] == [{"url": "http://127.0.0.2:30001", "live": True},
                                    {"url": "http://127.0.0.3:30001", "live": False}]
    text = CliRunner().invoke(main, ["serve", "status"], obj=remote).stdout
    assert "Endpoints of web: http://127.0.0.2:30001 (live), http://127.0.0.3:30001 (not live)" in text


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
