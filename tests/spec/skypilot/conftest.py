"""The SkyPilot corpus's count in the terminal summary of every run that ran it (`python -m pytest` included),
so the number of accepted files is seen without `-s` and without reading the table."""

from __future__ import annotations

from collections.abc import Callable

import pytest

CORPUS_SUMMARY = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def report_corpus(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """A function that sets the corpus's summary line (the last call wins)."""
    def report(line: str) -> None:
        pytestconfig.stash[CORPUS_SUMMARY] = line

    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    line = config.stash.get(CORPUS_SUMMARY, None)
    if line is not None:
        terminalreporter.write_sep("-", "SkyPilot corpus")
        terminalreporter.write_line(line)
