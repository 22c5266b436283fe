"""The task's envs reach an AWS instance as data: hostile values never run as commands in the boot script."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from skyserve_lite.providers.aws_userdata import render_user_data
from skyserve_lite.providers.boot_script import BOOT_ROOT, BootBatch
from skyserve_lite.spec.parse import parse_task

# Each would create a file in the working directory if any part of it ran as shell text.
HOSTILE = {
    "SUBSTITUTION": "$(touch substitution-ran)",
    "BACKTICKS": "`touch backticks-ran`",
    "SINGLE_QUOTES": "it's '$(touch single-ran)'",
    "DOUBLE_QUOTES": '"$(touch double-ran)"',
    "NEWLINES": "first\ntouch newline-ran\n$(touch newline-subst-ran)\n",
    "SEMICOLON": "; touch semicolon-ran; ",
    "EXPANSIONS": "$HOME ${PATH:-x} $((1 + 1)) ~ * ?",
    "BACKSLASHES": "a\\b\\\\c\\",
    "HEREDOC_MARKER": "EOF\nUNIT\n'EOF'",
    "EMPTY": "",
}


def env_file_of(user_data: str) -> str:
    """The text of ``env.sh`` as the boot script writes it (base64 through ``base64 -d``)."""
    match = re.search(rf"^\(umask 077 && echo (\S+) \| base64 -d > {re.escape(BOOT_ROOT)}/env\.sh\)$", user_data,
                      re.MULTILINE)
    assert match is not None, user_data
    return base64.b64decode(match.group(1)).decode()


def source_in_sandbox(env_file: str, sandbox: Path) -> tuple[dict[str, str], list[str]]:
    """Source ``env_file`` in bash with ``sandbox`` as the working directory: the environment it leaves, and
    the files that appeared in the sandbox."""
    sandbox.mkdir()
    script = sandbox.parent / f"{sandbox.name}.env.sh"
    script.write_text(env_file)
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    result = subprocess.run(
        ["bash", "-c", f'set -eu; . {script}; exec "$0" -c "$1"', sys.executable, dump],
        cwd=sandbox, env={"PATH": "/usr/bin:/bin", "HOME": str(sandbox.parent)}, capture_output=True, text=True,
        check=True, timeout=30)
    return json.loads(result.stdout), sorted(path.name for path in sandbox.iterdir())


def test_the_sandbox_sees_a_command_that_runs(tmp_path: Path) -> None:
    assert source_in_sandbox("export X=$(touch ran)\n", tmp_path / "control")[1] == ["ran"]


def test_hostile_env_values_come_through_unchanged_and_run_nothing(tmp_path: Path) -> None:
    text = yaml.safe_dump({"run": "python -m http.server $PORT", "service": {"replicas": 1},
                           "resources": {"cloud": "aws", "image_id": "ami-1"}, "envs": HOSTILE})
    spec = parse_task(text)
    batch = BootBatch(service="svc", version=1, replica_ids=(1,), envs=spec.envs, setup=None, run=spec.run,
                      port=8080)
    seen, ran = source_in_sandbox(env_file_of(render_user_data(batch)), tmp_path / "rendered")
    assert ran == []  # no command in any value ran
    assert {name: seen.get(name) for name in HOSTILE} == HOSTILE
    assert seen["PORT"] == "8080" and seen["SKY_LITE_SERVICE"] == "svc"


def test_the_environment_file_is_written_readable_by_its_owner_only(tmp_path: Path) -> None:
    text = yaml.safe_dump({"run": "serve", "service": {"replicas": 1}, "resources": {"cloud": "aws"},
                           "secrets": {"TOKEN": None}})
    spec = parse_task(text)
    batch = BootBatch(service="svc", version=1, replica_ids=(1,), envs=(("TOKEN", "v"),), setup=None,
                      run=spec.run, port=8080)
    line = next(line for line in render_user_data(batch).splitlines() if "/env.sh)" in line)
    target = tmp_path / "boot"
    target.mkdir()
    subprocess.run(["bash", "-c", line.replace(BOOT_ROOT, str(target))], check=True, timeout=30)
    written = target / "env.sh"
    assert written.stat().st_mode & 0o777 == 0o600
    assert "export TOKEN=v" in written.read_text()
