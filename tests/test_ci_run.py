"""`.ci/run`: under CI=true a missing sshd or cron fails the run (after trying to install them) instead of
skipping the tests that need them; lint and type checks run before the README's test command, which ends it.

The script runs for real, from a copy of the repository's `.ci/`, with every program it calls replaced by a
stub on PATH that records its arguments (apt-get installs nothing unless told to, pip/python/ruff/mypy do
nothing): so nothing is installed or downloaded. sshd and cron are hidden by mounting empty directories over
/usr/sbin and /usr/local/sbin in a mount namespace of the script's own (``unshare``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CI_RUN = REPO / ".ci" / "run"

APT_UPDATE = "apt-get update -qq"
APT_INSTALL = "apt-get install -y -qq --no-install-recommends openssh-server openssh-client cron"
CHECKS = [
    "python -m pip install --quiet --upgrade pip",
    "pip install --quiet .[dev]",
    "ruff check skyserve_lite tests benchmarks scripts noxfile.py setup.py",
    "mypy",
    "mypy --strict tests",
    "python scripts/test_compiled_lb.py",
    "pip install .[test]",
    "python -m pytest",
]

# Records "NAME ARGS" in $STUB_LOG; exits with $STUB_FAIL_<NAME> when set. apt-get, told to by
# $STUB_APT_INSTALLS, "installs" sshd, crontab and cron as stubs beside itself.
STUB = """#!/bin/sh
name=$(basename "$0" | tr -c 'a-z\\n' '_')
echo "$(basename "$0") $*" >> "$STUB_LOG"
if [ "$(basename "$0")" = apt-get ] && [ "$1" = install ] && [ "${STUB_APT_INSTALLS:-}" = 1 ]; then
  for tool in sshd crontab cron; do ln -sf "$0" "$(dirname "$0")/$tool"; done
fi
eval "code=\\${STUB_FAIL_$name:-0}"
exit "$code"
"""
HIDE_SBIN = ('mount --make-rprivate / && mount -t tmpfs none /usr/sbin && '
             '{ [ ! -d /usr/local/sbin ] || mount -t tmpfs none /usr/local/sbin; } && exec "$@"')


@dataclass(frozen=True)
class Run:
    code: int
    stderr: str
    calls: list[str]


def run_ci(tmp_path: Path, env: dict[str, str], *, tools_present: bool = False) -> Run:
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if unshare is None or mount is None:
        pytest.skip("unshare and mount (util-linux) are needed to hide this machine's sshd and cron")
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy2(CI_RUN, repo / ".ci" / "run")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("bash", "dirname", "id", "basename", "tr", "ln"):
        found = shutil.which(name)
        assert found is not None, name
        (stubs / name).symlink_to(found)
    (stubs / "stub").write_text(STUB)
    (stubs / "stub").chmod(0o755)
    for name in ("apt-get", "python", "pip", "ruff", "mypy", *(("sshd", "crontab", "cron") if tools_present else ())):
        (stubs / name).symlink_to(stubs / "stub")
    log = tmp_path / "calls.log"
    log.touch()
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    hidden = [unshare, *user, "--mount", "/bin/sh", "-c", HIDE_SBIN.replace("mount ", f"{mount} "), "hide-sbin"]
    probe = subprocess.run([*hidden, "/bin/sh", "-c", "! [ -e /usr/sbin/sshd ]"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"/usr/sbin cannot be hidden in a mount namespace here: {probe.stderr.strip()}")
    result = subprocess.run(
        [*hidden, str(repo / ".ci" / "run")], capture_output=True, text=True, timeout=60,
        env={"PATH": str(stubs), "STUB_LOG": str(log), "VIRTUAL_ENV": str(tmp_path / "venv"), **env})
    return Run(result.returncode, result.stderr, [line.rstrip() for line in log.read_text().splitlines()])


@dataclass(frozen=True)
class Case:
    env: dict[str, str]
    tools_present: bool
    code: int
    calls: list[str]
    said: str


CASES = [
    pytest.param(Case({"CI": "true"}, False, 1, [APT_UPDATE, APT_INSTALL],
                      "missing: sshd (openssh-server) cron and crontab (cron); CI=true: failing"),
                 id="ci-tools-missing-fails-before-anything-runs"),
    pytest.param(Case({"CI": "true", "STUB_APT_INSTALLS": "1"}, False, 0, [APT_UPDATE, APT_INSTALL, *CHECKS], ""),
                 id="ci-tools-installed-runs-all"),
    pytest.param(Case({"CI": "true"}, True, 0, CHECKS, ""), id="ci-tools-present-installs-nothing"),
    pytest.param(Case({}, False, 0, [APT_UPDATE, APT_INSTALL, *CHECKS],
                      "the tests that need them will be skipped (CI=true would fail here)"),
                 id="outside-ci-tools-missing-warns"),
    pytest.param(Case({"CI": "true", "STUB_FAIL_apt_get": "100"}, False, 1, [APT_UPDATE],
                      "installing openssh-server and cron failed"), id="ci-install-fails"),
    pytest.param(Case({"CI": "true", "STUB_FAIL_ruff": "1"}, True, 1, CHECKS[:3], ""), id="lint-fails-before-tests"),
    pytest.param(Case({"CI": "true", "STUB_FAIL_mypy": "1"}, True, 1, CHECKS[:4], ""),
                 id="typecheck-fails-before-tests"),
]


@pytest.mark.parametrize("case", CASES)
def test_ci_run(tmp_path: Path, case: Case) -> None:
    run = run_ci(tmp_path, case.env, tools_present=case.tools_present)
    assert run.code == case.code, run.stderr
    assert run.calls == case.calls
    assert case.said in run.stderr


def test_ci_run_ends_with_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    command = re.search(r"Install and run the tests:\n\n```bash\n(.*)\n```", readme)
    assert command is not None
    lines = [line for line in CI_RUN.read_text().splitlines() if line.strip()]
    assert lines[-1] == command.group(1) == "pip install '.[test]' && python -m pytest"
