"""The files in examples/ are tasks `serve up` accepts, each listed in the README, and the README's dry run of
`examples/serve/llm.yaml` is what the command prints.

Every file in examples/ must have a row in ``SUBMIT``, so that an example cannot be added (or the README's
one left out, as `llm.yaml` was) without being checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.spec.parse import load_task_file

from .runner import Cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
README = ROOT / "README.md"

# file (below examples/) -> what its `serve up` needs besides the file (the README's own words for llm.yaml)
SUBMIT = {
    "serve/minimal.yaml": [],
    "serve/autoscaling.yaml": [],
    "serve/probe_post.yaml": [],
    "serve/llm.yaml": ["--infra", "aws", "--secret", "HF_TOKEN"],
}
TOKEN = "hf_example_token_1234"  # what the test passes as the secret: never printed


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's reader: a token in the environment, the cloud libraries installed (the dry run plans a
    cloud whose library is missing too, adding a note), no AWS region or terminal width of their own."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr("skyserve_lite.providers._has_module", lambda _name: True)
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def dry_run(tmp_path: Path, example: str, args: list[str]) -> tuple[int, str, str]:
    home = tmp_path / "home"
    result = Cli(LocalController(home, FakeClock(), start_daemon=False))(
        "serve", "up", str(EXAMPLES / example), *args, "--dry-run")
    assert not home.exists()  # a dry run stores nothing
    return result


def test_every_file_in_examples_has_a_row() -> None:
    files = sorted(str(path.relative_to(EXAMPLES)) for path in EXAMPLES.rglob("*") if path.is_file())
    assert files == sorted(SUBMIT)


@pytest.mark.parametrize("example", sorted(SUBMIT))
def test_every_example_parses_and_serve_up_accepts_it(example: str, tmp_path: Path) -> None:
    assert load_task_file(EXAMPLES / example).spec.run.strip()
    code, stdout, stderr = dry_run(tmp_path, example, SUBMIT[example])
    assert code == 0, stderr
    assert stdout.rstrip().endswith("Dry run: nothing was stored or launched.")
    assert TOKEN not in stdout + stderr


@pytest.mark.parametrize("example", sorted(SUBMIT))
def test_the_readme_lists_every_example(example: str) -> None:
    (listing,) = [line for line in README.read_text().splitlines() if line.startswith("- [examples/serve/]")]
    assert f"`{Path(example).name}`" in listing


def console_block(command: str) -> list[str]:
    """The lines the README shows under ``$ command`` (up to the next command or the block's end)."""
    lines = README.read_text().splitlines()
    start = lines.index(f"$ {command}") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("$ ", "```")))
    return lines[start:end]


def test_the_readme_dry_run_of_llm_yaml_is_what_it_prints(tmp_path: Path) -> None:
    """Line for line, in order; where the README cuts (a line of `...`, or `...` ending a line) any lines or
    the rest of the line may follow."""
    shown = console_block("sky-lite serve up examples/serve/llm.yaml --infra aws --secret HF_TOKEN --dry-run")
    assert shown[0] == "Launch llm on aws: 2 replicas"
    pattern = "".join(r"(?:.*\n)*?" if line == "..." else re.escape(line.removesuffix("...")) + r".*\n"
                      if line.endswith("...") else re.escape(line) + r"\n" for line in shown)
    code, stdout, stderr = dry_run(tmp_path, "serve/llm.yaml", SUBMIT["serve/llm.yaml"])
    assert code == 0, stderr
    assert re.match(pattern, stdout), stdout
