"""Settings every test runs with, and the PostgreSQL server the store's tests run on besides SQLite."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NoReturn

import pytest

from tests.postgres import PostgresServer, find_postgres_bin, start_postgres


def pytest_configure(config: pytest.Config) -> None:
    # No test may reach a cloud: without credentials boto3 and google-auth would ask the instance metadata
    # address (169.254.169.254) for some. AWS is moto and GCP a fake server on 127.0.0.1; a test that
    # reached for a real cloud fails on missing credentials instead.
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    os.environ.setdefault("NO_GCE_CHECK", "True")


def _unavailable(reason: str) -> NoReturn:
    """Skip where PostgreSQL is missing, but fail under CI, which installs it (`.ci/run`): there a skip would
    hide that the store's PostgreSQL half went untested."""
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):  # what .ci/run reads as CI too
        pytest.fail(f"{reason}, and CI=true: .ci/run should have installed it")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test session on 127.0.0.1 (tests/postgres.py), stopped and removed at
    its end. Each test makes its own database on it (``PostgresServer.create_database``)."""
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        _unavailable("PostgreSQL (initdb, pg_ctl) is not installed")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed (pip install 'skyserve-lite[postgres]')")
    server = start_postgres(bin_dir)
    try:
        yield server
    finally:
        server.stop()
