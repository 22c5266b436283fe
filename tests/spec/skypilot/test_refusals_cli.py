"""The SkyPilot habits of issue 24 through the real CLI, one row each way per habit: `sky-lite serve up FILE
--dry-run` (click's ``CliRunner``, in this process, as ``test_corpus_dry_run.py`` runs it) from a temporary
repository that is the working directory. An accepted file prints its plan and exits 0; a refused one prints
exactly one line, ``Error: FILE: FIELD: why``, naming the field, and exits 2. No secret value shows, and a
dry run stores no service."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.cli.main import main as cli_main
from tests.spec.skypilot.test_corpus_dry_run import find_stored_services

SECRET = "sk-cli-2f7d41"


@dataclasses.dataclass(frozen=True)
class Row:
    """A task file (``tasks/svc.yaml`` of the repository) and the files beside it, the options given, and
    what the run says: the refused field (None: accepted) and a fragment of its output."""

    text: str
    refused: str | None
    says: str
    options: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # folders made below the repository ("tasks/app")


SERVICE = "run: python -m http.server $PORT\nservice:\n  replicas: 1\n"

ROWS = [
    # 1. relative paths: from the directory sky-lite runs in
    pytest.param(Row(SERVICE + "workdir: tasks/app\n", None, "Dry run: nothing was stored", files=("tasks/app",)),
                 id="1-paths-from-the-working-directory"),
    pytest.param(Row(SERVICE + "workdir: app\n", "workdir", "write 'tasks/app', or run sky-lite from",
                     files=("tasks/app",)), id="1-paths-beside-the-task-file-refused"),
    # 2. accelerator sets
    pytest.param(Row(SERVICE + "resources:\n  accelerators: {L4:1, A10g:1}\n", None, "L4:1 -> g6.xlarge",
                     ("--infra", "aws")), id="2-accelerator-set"),
    pytest.param(Row(SERVICE + 'resources:\n  accelerators: {"A100:1": 2}\n', "resources.accelerators.A100:1",
                     "give the count once"), id="2-accelerator-count-twice-refused"),
    # 3. $VAR references: envs filled in, a secret only into the probe's headers and body
    pytest.param(Row("run: python -m http.server $PORT\nsecrets: {API_KEY: null}\nservice:\n  replicas: 1\n"
                     "  readiness_probe:\n    path: /health\n    headers: {Authorization: Bearer $API_KEY}\n",
                     None, "Dry run: nothing was stored", ("--secret", f"API_KEY={SECRET}")),
                 id="3-secret-in-a-probe-header"),
    pytest.param(Row("run: python -m http.server $PORT\nsecrets: {API_KEY: null}\nworkdir: $API_KEY/app\n"
                     "service:\n  replicas: 1\n", "workdir", "a secret is not filled into paths",
                     ("--secret", f"API_KEY={SECRET}")), id="3-secret-in-a-path-refused"),
    # 4. wildcard infra
    pytest.param(Row(SERVICE + "resources:\n  infra: gcp/*/us-central1-a\n", None, "us-central1/us-central1-a"),
                 id="4-infra-wildcard-region"),
    pytest.param(Row(SERVICE + "resources:\n  infra: gcp/*/bogus\n", "resources.infra", "not named like a zone of gcp"),
                 id="4-infra-bogus-zone-refused"),
    # 5. sizing as SkyPilot sizes
    pytest.param(Row(SERVICE + "resources:\n  cpus: 2+\n", None, "memory not given: 4 GiB per vCPU",
                     ("--infra", "aws")), id="5-sizing-rule-shown"),
    pytest.param(Row(SERVICE + "resources:\n  cpus: 1\n", "resources.cpus", "write 1+ for at least",
                     ("--infra", "aws")), id="5-sizing-exact-cpus-refused"),
    # 6. the cheapest installed cloud when none is named
    pytest.param(Row(SERVICE + "resources:\n  accelerators: L4\n", None, "Note: chose gcp, the cheapest"),
                 id="6-cloud-chosen"),
    pytest.param(Row(SERVICE + "resources:\n  accelerators: Bogus:1\n", "resources.accelerators",
                     "no cloud sky-lite offers can run this task"), id="6-no-cloud-can-refused"),
    # 7. SkyServe's service rules
    pytest.param(Row("run: python -m http.server $PORT\nresources: {use_spot: true}\nservice:\n  replica_policy:\n"
                     "    min_replicas: 1\n    spot_placer: dynamic_fallback\n", None, "Dry run: nothing was stored",
                     ("--infra", "aws")), id="7-spot-placer"),
    pytest.param(Row(SERVICE + "  ports: '8080'\n", "service.ports", "write it without quotes"),
                 id="7-service-ports-string-refused"),
]


@pytest.mark.parametrize("row", ROWS)
def test_serve_up_dry_run(row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, home = tmp_path / "repo", tmp_path / "home"
    (repo / "tasks").mkdir(parents=True)
    for folder in row.files:
        (repo / folder).mkdir(parents=True)
        (repo / folder / "server.py").write_text("print('hello')\n")
    (repo / "tasks" / "svc.yaml").write_text(row.text)
    monkeypatch.chdir(repo)
    environment: dict[str, str | None] = {"SKY_LITE_HOME": str(home), "SKY_LITE_CONTROLLER": "local",
                                          "AWS_DEFAULT_REGION": None, "AWS_REGION": None, "SKY_LITE_GCP_REGION": None}
    result = CliRunner(env=environment).invoke(cli_main, ["serve", "up", "tasks/svc.yaml", "--dry-run",
                                                          *row.options])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    output = result.stdout + result.stderr
    assert SECRET not in output
    assert "Traceback" not in output
    if row.refused is None:
        assert (result.exit_code, result.stderr) == (0, ""), result.stderr
        assert row.says in result.stdout
    else:
        source = str((repo / "tasks" / "svc.yaml").resolve())
        assert result.exit_code == 2
        assert result.stdout == ""
        assert result.stderr.startswith(f"Error: {source}: {row.refused}: ")
        assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n")
        assert row.says in result.stderr
    assert find_stored_services(home) == []
