"""Shell completion of service names and replica ids (what `eval "$(_SKY_LITE_COMPLETE=bash_source
sky-lite)"` wires into bash), through click's completion protocol as bash calls it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.api import LocalController
from skyserve_lite.cli.main import main

from ..controller.conftest import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "home")
    for name in ("web", "worker", "api"):
        h.create(name, replicas=2)
    h.tick()
    yield h
    h.store.close()


def complete(home: Path, line: str, shell: str = "bash") -> list[str]:
    """What the shell gets back for the words of ``line`` (a trailing space: completing a new word)."""
    words = line.split()
    cword = len(words) if line.endswith(" ") else len(words) - 1
    result = CliRunner().invoke(main, [], prog_name="sky-lite", obj=LocalController(home, start_daemon=False),
                                env={"_SKY_LITE_COMPLETE": f"{shell}_complete", "COMP_WORDS": line,
                                     "COMP_CWORD": str(cword)})
    assert result.exit_code == 0, result.output
    return [row.split(",", 1)[1] for row in result.stdout.splitlines() if row]


@pytest.mark.parametrize(("line", "expected"), [
    ("sky-lite serve status ", ["api", "web", "worker"]),
    ("sky-lite serve status w", ["web", "worker"]),
    ("sky-lite serve status web ", ["api", "worker"]),  # one already on the line is not offered again
    ("sky-lite serve logs wo", ["worker"]),
    ("sky-lite serve update a", ["api"]),
    ("sky-lite serve down ", ["api", "web", "worker"]),
    ("sky-lite serve wait x", []),
])
def test_service_names_complete(harness: Harness, line: str, expected: list[str]) -> None:
    assert complete(harness.home, line) == expected


def test_replica_ids_complete_for_the_service_named_on_the_line(harness: Harness) -> None:
    web = [str(r.replica_id) for r in harness.replicas("web")]
    assert complete(harness.home, "sky-lite serve logs web ") == web
    assert complete(harness.home, "sky-lite serve down web --replica-id ") == web
    assert complete(harness.home, "sky-lite serve logs nope ") == []  # an unknown service completes nothing


def test_zsh_gets_each_replicas_status_as_help(harness: Harness) -> None:
    result = CliRunner().invoke(main, [], prog_name="sky-lite", obj=LocalController(harness.home, start_daemon=False),
                                env={"_SKY_LITE_COMPLETE": "zsh_complete", "COMP_WORDS": "sky-lite serve logs web ",
                                     "COMP_CWORD": "4"})
    assert "PROVISIONING, version 1" in result.stdout


def test_completion_without_a_state_directory_completes_nothing(tmp_path: Path) -> None:
    (tmp_path / "home").write_text("a file, not a directory")  # opening the store fails
    assert complete(tmp_path / "home", "sky-lite serve status ") == []
