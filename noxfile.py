"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s typecheck`."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]


@nox.session
def tests(session: nox.Session) -> None:
    session.install(".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "skyserve_lite", "tests", "benchmarks", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install(".[dev]")
    session.run("mypy")  # the package, strict (pyproject.toml)
    session.run("mypy", "--strict", "tests")
