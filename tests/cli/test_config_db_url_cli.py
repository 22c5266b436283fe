"""`config set db_url`: the state in PostgreSQL, its password kept in a 0600 file and shown as *** by every
command; a bad URL, or a home whose SQLite store holds services, refused with nothing changed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.cli.common import has_no_state
from skyserve_lite.clock import FakeClock
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.store import Store
from tests.postgres import PASSWORD, PASSWORD_USER, PostgresServer

from .runner import Cli

URL = "postgresql://sky:s3cret-pw@127.0.0.1:1/state"
SHOWN = "postgresql://sky:***@127.0.0.1:1/state"
TEXT = "service:\n  replicas: 1\nrun: echo hi\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("SKY_LITE_HOME", str(home))
    monkeypatch.delenv("SKY_LITE_DB_URL", raising=False)
    return home


@pytest.fixture
def cli(home: Path) -> Cli:
    return Cli(LocalController(home, FakeClock(), start_daemon=False))


def files(home: Path) -> dict[str, str]:
    return {p.name: p.read_bytes().hex() for p in sorted(home.iterdir()) if p.is_file()} if home.exists() else {}


@pytest.mark.parametrize("from_stdin", [False, True], ids=["argument", "stdin"])
def test_a_password_is_kept_in_a_private_file_and_shown_as_stars(cli: Cli, home: Path, from_stdin: bool) -> None:
    args = ("config", "set", "db_url", "-") if from_stdin else ("config", "set", "db_url", URL)
    code, stdout, stderr = cli(*args, input=URL + "\n" if from_stdin else None)
    assert (code, stdout) == (0, f"db_url = {SHOWN}\n")
    # A password on the command line is seen by `ps` and shell histories: said, with the way around it.
    assert ("config set db_url -" in stderr) is not from_stdin
    assert json.loads((home / "config.json").read_text()) == {"db_url": "postgresql://sky@127.0.0.1:1/state"}
    assert (home / "pgpass").read_text() == "127.0.0.1:1:state:sky:s3cret-pw\n"
    assert stat.S_IMODE((home / "pgpass").stat().st_mode) == 0o600
    code, stdout, _ = cli("config", "list")
    assert code == 0 and f"db_url = {SHOWN}    # the PostgreSQL database" in stdout
    assert "s3cret-pw" not in stdout + stderr


def test_a_url_without_password_removes_the_kept_one_and_unset_removes_both(cli: Cli, home: Path) -> None:
    assert cli("config", "set", "db_url", URL)[0] == 0
    code, stdout, stderr = cli("config", "set", "db_url", "postgresql://sky@127.0.0.1:1/state")
    assert (code, stdout, stderr) == (0, "db_url = postgresql://sky@127.0.0.1:1/state\n", "")
    assert not (home / "pgpass").exists()
    assert cli("config", "set", "db_url", URL)[0] == 0
    assert cli("config", "unset", "db_url") == (0, "db_url unset\n", "")
    assert not (home / "pgpass").exists() and json.loads((home / "config.json").read_text()) == {}
    assert "db_url = (unset)" in cli("config", "list")[1]


@pytest.mark.parametrize(("url", "problem"), [
    ("mysql://sky:s3cret-pw@h/state", "db_url: the scheme must be postgresql://"),
    ("postgresql://sky:s3cret-pw@h", "db_url: no database name"),
    ("postgresql://sky:s3cret-pw@h:port/state", "db_url: not a valid URL"),
])
def test_a_bad_url_is_refused_naming_the_setting_and_changes_nothing(cli: Cli, home: Path, url: str,
                                                                      problem: str) -> None:
    assert cli("config", "set", "default_infra", "local")[0] == 0
    before = files(home)
    code, stdout, stderr = cli("config", "set", "db_url", url)
    assert code == 2 and stdout == "" and f"Error: {problem}" in stderr
    assert "s3cret-pw" not in stderr
    assert files(home) == before


def test_moving_a_home_whose_sqlite_store_holds_services_is_refused(cli: Cli, home: Path) -> None:
    store = Store.open(home)
    store.create_service("web", SubmittedTask(TEXT, "/t.yaml", parse_task(TEXT)), 30001, now=1.0)
    store.close()
    before = files(home)
    code, _, stderr = cli("config", "set", "db_url", URL)
    assert code == 2 and "holds 1 service(s) (web)" in stderr and "serve down --all" in stderr
    assert files(home) == before


@pytest.mark.parametrize(("settings", "env", "expected"), [
    pytest.param(None, {"SKY_LITE_DB_URL": URL}, False, id="url-in-the-environment"),
    pytest.param({"db_url": "postgresql://sky@h/d"}, {}, False, id="url-in-the-settings"),
    pytest.param({"default_infra": "local"}, {}, True, id="other-settings"),
    pytest.param(None, {"SKY_LITE_DB_URL": " "}, True, id="empty-url"),
])
def test_a_home_whose_state_is_in_postgresql_is_never_taken_for_empty(
        tmp_path: Path, settings: dict[str, str] | None, env: dict[str, str], expected: bool) -> None:
    if settings is not None:
        tmp_path.joinpath("config.json").write_text(json.dumps(settings))
    assert has_no_state(tmp_path, env) is expected


@pytest.fixture
def password_database(postgres_server: PostgresServer) -> Iterator[str]:
    name = postgres_server.create_database(owner=PASSWORD_USER)
    yield name
    postgres_server.drop_database(name)


def test_serve_status_reads_the_state_in_postgresql_and_never_shows_the_password(
        tmp_path: Path, postgres_server: PostgresServer, password_database: str) -> None:
    home = tmp_path / "home"
    url = postgres_server.url(password_database, PASSWORD_USER, PASSWORD)
    env = {**os.environ, "SKY_LITE_HOME": str(home), "SKY_LITE_DB_URL": url}
    env.pop("SKY_LITE_CONTROLLER", None)
    # The service is stored by another process with the same environment, as a `serve up` would.
    opener = subprocess.run([sys.executable, "-c", (
        "from pathlib import Path; from skyserve_lite.state.store import Store; "
        "from skyserve_lite.spec.model import SubmittedTask; from skyserve_lite.spec.parse import parse_task; "
        f"t = {TEXT!r}; s = Store.open(Path({str(home)!r})); "
        "s.create_service('web', SubmittedTask(t, '/t.yaml', parse_task(t)), 30001, now=1.0); s.close()")],
        env=env, capture_output=True, text=True)
    assert opener.returncode == 0, opener.stderr
    assert not (home / "state.db").exists()

    said = subprocess.run([sys.executable, "-m", "skyserve_lite", "serve", "status"], env=env,
                          capture_output=True, text=True)
    assert said.returncode == 0, said.stderr
    assert "web" in said.stdout and "No service is running" not in said.stdout
    assert PASSWORD not in said.stdout + said.stderr
