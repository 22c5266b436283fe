"""The store's tests run on both engines.

Every test here that takes ``tmp_path`` or ``store`` runs twice, ``[sqlite]`` and ``[postgresql]``, unless
it is marked ``sqlite_only`` with its reason (file modes, WAL, a read-only home, a damaged file: what only
the SQLite file has) or ``postgresql_only`` (advisory locks, logins, a lost connection). On PostgreSQL the
test gets a fresh database of the session's server, named by ``SKY_LITE_DB_URL``, so ``Store.open(home)``
opens it as a user's would; dropped at the test's end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

ENGINES = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_engine" not in metafunc.fixturenames:
        return
    only = metafunc.definition.get_closest_marker("sqlite_only")
    if only is not None and not (only.kwargs.get("reason") or only.args):
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: sqlite_only needs a reason")
    if metafunc.definition.get_closest_marker("postgresql_only") is not None:
        metafunc.parametrize("store_engine", ["postgresql"], indirect=True)
    elif only is None and {"tmp_path", "store"} & set(metafunc.fixturenames):
        metafunc.parametrize("store_engine", ENGINES, indirect=True)


@pytest.fixture(autouse=True)
def store_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The engine this test's stores open on (``sqlite`` unless parametrized)."""
    engine = str(getattr(request, "param", "sqlite"))
    monkeypatch.delenv("SKY_LITE_DB_URL", raising=False)
    if engine != "postgresql":
        yield engine
        return
    server = request.getfixturevalue("postgres_server")
    database = server.create_database()
    monkeypatch.setenv("SKY_LITE_DB_URL", server.url(database))
    yield engine
    server.drop_database(database)
