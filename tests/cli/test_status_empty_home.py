"""`serve status` where there is no state: the same answer, without loading what reads state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.cli import common
from skyserve_lite.cli.common import NO_SERVICES, has_no_state
from skyserve_lite.clock import FakeClock
from skyserve_lite.spec.parse import load_task_file
from skyserve_lite.state.store import Store

from .runner import Cli

# What answering "no service" does not need: the api (and with it the store, the spec parser, the
# controller's modules), SQLite, the renderers and rich, the choice of a remote controller.
HEAVY = ("skyserve_lite.api", "skyserve_lite.state.store", "skyserve_lite.spec.parse", "sqlite3",
         "skyserve_lite.cli.render", "rich", "skyserve_lite.remote.connect", "skyserve_lite.remote.config")

# Runs `sky-lite serve status` in a fresh interpreter; prints its exit code, output and the heavy modules
# it imported, as JSON.
PROBE = f"""\
import contextlib, io, json, sys
from skyserve_lite.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(['serve', 'status'], standalone_mode=False)
heavy = sorted(m for m in sys.modules if m in {HEAVY!r} or m.startswith(tuple(h + '.' for h in {HEAVY!r})))
print(json.dumps({{"code": code, "stdout": out.getvalue(), "heavy": heavy}}))
"""


def status_env(home: Path) -> dict[str, str]:
    env = {**os.environ, "SKY_LITE_HOME": str(home)}
    env.pop("SKY_LITE_CONTROLLER", None)
    return env


def probe(home: Path) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                            env=status_env(home))
    assert result.stderr == ""
    return dict(json.loads(result.stdout))


def contents(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else ["(absent)"]


@pytest.mark.parametrize("files", [
    pytest.param(None, id="no-directory"),
    pytest.param([], id="empty-directory"),
    pytest.param(["config.json"], id="settings-only"),
])
def test_status_of_a_home_without_state_loads_none_of_what_reads_state(tmp_path: Path,
                                                                      files: list[str] | None) -> None:
    home = tmp_path / "home"
    if files is not None:
        home.mkdir()
        for name in files:
            (home / name).write_text("{}")
    before = contents(home)

    answer = probe(home)

    assert answer == {"code": None, "stdout": NO_SERVICES + "\n", "heavy": []}
    assert contents(home) == before  # and it writes nothing: no store is created to say there is none


def test_status_of_a_home_without_state_says_what_an_empty_store_says(tmp_path: Path) -> None:
    without, empty = tmp_path / "without", tmp_path / "empty"
    Store.open(empty).close()  # a store with no service: read through the api and rendered by rich
    said = [subprocess.run([sys.executable, "-m", "skyserve_lite", "serve", "status"], capture_output=True,
                           text=True, env=status_env(home)) for home in (without, empty)]
    assert [(r.returncode, r.stdout, r.stderr) for r in said] == [(0, NO_SERVICES + "\n", "")] * 2
    heavy = probe(empty)["heavy"]
    assert isinstance(heavy, list) and "skyserve_lite.api" in heavy  # the second answer came the long way


def test_a_controller_given_to_the_command_is_asked_whatever_the_home(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKY_LITE_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("SKY_LITE_CONTROLLER", raising=False)
    elsewhere = tmp_path / "elsewhere"
    task = tmp_path / "web.yaml"
    task.write_text("service:\n  replicas: 1\nrun: echo hi\n")
    controller = LocalController(elsewhere, FakeClock(), start_daemon=False)
    controller.create_service("web", load_task_file(task))

    code, stdout, _stderr = Cli(controller)("serve", "status")

    assert code == 0 and "web" in stdout and NO_SERVICES not in stdout


@pytest.mark.parametrize(("files", "setting", "expected"), [
    pytest.param([], None, True, id="nothing"),
    pytest.param(["config.json"], None, True, id="settings-only"),
    pytest.param(["state.db"], None, False, id="a-store"),
    pytest.param(["controller.json"], None, False, id="a-remote-controller"),
    pytest.param(["controller.json"], "local", True, id="remote-recorded-local-chosen"),
    pytest.param(["state.db", "controller.json"], "local", False, id="local-chosen-with-a-store"),
    pytest.param([], "ssh://me@example.test:22", False, id="a-remote-chosen"),
    pytest.param([], "nonsense", False, id="a-setting-not-understood"),
    pytest.param([], " local ", True, id="local-with-blanks"),
])
def test_has_no_state(tmp_path: Path, files: list[str], setting: str | None, expected: bool) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for name in files:
        (home / name).write_text("")
    env = {} if setting is None else {"SKY_LITE_CONTROLLER": setting}
    assert has_no_state(home, env) is expected


def test_has_no_state_is_sure_or_says_no(tmp_path: Path) -> None:
    assert has_no_state(tmp_path / "missing", {}) is True
    (tmp_path / "file").write_text("")
    assert has_no_state(tmp_path / "file", {}) is False  # the long way says what is wrong with such a home
    (tmp_path / "dangling").mkdir()
    (tmp_path / "dangling" / "state.db").symlink_to(tmp_path / "nowhere")
    assert has_no_state(tmp_path / "dangling", {}) is False


def test_the_names_it_checks_are_the_ones_their_modules_use() -> None:
    from skyserve_lite.remote import config
    from skyserve_lite.state import store

    assert (common.STORE_FILE, common.REMOTE_RECORD_FILE, common.CONTROLLER_SETTING) == (
        store.DB_NAME, config.RECORD_FILE, config.SELECT_SETTING)
