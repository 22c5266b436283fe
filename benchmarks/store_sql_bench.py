"""The store's SQL hand-written, against the same statements through SQLAlchemy Core, on both engines.

What decided that the store keeps its hand-written SQL (docs/benchmarks.md, "The store on PostgreSQL"):
the three kinds of statement that make a controller pass's cost at fleet scale, each timed (CPU of this
process, and wall time) through the store's own connection and through SQLAlchemy Core over the same
database and schema (tables reflected from it; upserts through each dialect's ``insert().on_conflict_do_update``,
since Core has no engine-neutral upsert):

- *point reads*: 1,000 times the one-row read a steady pass is made of (``meta``'s generation counters);
- *read every replica*: all rows of ``replicas`` at 10,000 replicas, into a dict keyed by row (as the store
  keeps them, to decode only the rows that changed);
- *upsert every replica*: 10,000 replica rows written in one transaction (a launch or readiness pass).

SQLAlchemy is not a dependency of sky-lite: ``pip install sqlalchemy`` to run this. PostgreSQL is a throwaway
server on 127.0.0.1 (tests/postgres.py, as `controller_bench.py --engine postgresql` starts it).

    python benchmarks/store_sql_bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state import store as store_module
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store

REPO = Path(__file__).resolve().parents[1]
SERVICES, PER_SERVICE, POINT_READS = 100, 100, 1000
TASK = "service:\n  replicas: 1\nrun: echo hi\n"


def fill(store: Store) -> list[ReplicaRecord]:
    task = SubmittedTask(TASK, "/bench.yaml", parse_task(TASK))
    template = ReplicaRecord(service="", replica_id=0, version=1, status=ReplicaStatus.PROVISIONING, cloud="local",
                             launched_at=1.0, status_since=1.0, launch_token="token", instance_id="i-0")
    for index in range(SERVICES):
        store.create_service(f"svc-{index}", task, 30001 + index, 1.0)
    added = store.add_replica_batches([(f"svc-{index}", PER_SERVICE, template) for index in range(SERVICES)])
    return [row for rows in added if rows for row in rows]


def timed(func: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median CPU and wall milliseconds of ``func`` over ``rounds``."""
    cpu, wall = [], []
    for _ in range(rounds):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        func()
        cpu.append((time.process_time() - start_cpu) * 1000)
        wall.append((time.perf_counter() - start_wall) * 1000)
    return statistics.median(cpu), statistics.median(wall)


def hand_written(store: Store, records: list[ReplicaRecord]) -> dict[str, Callable[[], object]]:
    db = store._db
    columns = ", ".join(store_module._REPLICA_COLUMNS)
    rows = [store_module._replica_values(record) for record in records]

    def point_reads() -> None:
        for _ in range(POINT_READS):
            db.execute("SELECT value FROM meta WHERE key = 'services_generation'").fetchone()

    def read_all() -> None:
        fetched = db.execute(f"SELECT {columns} FROM replicas ORDER BY service, replica_id").fetchall()
        assert len({row: None for row in fetched}) == len(records)

    def upsert_all() -> None:
        with store._write(store_module.UNFENCED) as tx:
            tx.db.executemany(store_module._PUT_REPLICA, rows)

    return {"point reads": point_reads, "read every replica": read_all, "upsert every replica": upsert_all}


def core(url: str, engine_name: str, records: list[ReplicaRecord]) -> tuple[dict[str, Callable[[], object]], Any]:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql, sqlite

    engine = sa.create_engine(url)
    metadata = sa.MetaData()
    metadata.reflect(engine, only=["meta", "replicas"])
    meta, replicas = metadata.tables["meta"], metadata.tables["replicas"]
    columns = store_module._REPLICA_COLUMNS
    # The schema's flags are integers (is_spot): a bool is sent as one, as the store's connections send it.
    values = [{name: int(value) if isinstance(value, bool) else value
               for name, value in zip(columns, store_module._replica_values(record), strict=True)}
              for record in records]
    insert = (sqlite if engine_name == "sqlite" else postgresql).insert(replicas)
    upsert = insert.on_conflict_do_update(
        index_elements=[replicas.c.service, replicas.c.replica_id],
        set_={name: insert.excluded[name] for name in columns if name not in ("service", "replica_id")})
    point = sa.select(meta.c.value).where(meta.c.key == "services_generation")
    every = sa.select(*[replicas.c[name] for name in columns]).order_by(replicas.c.service, replicas.c.replica_id)
    connection = engine.connect()

    def point_reads() -> None:
        for _ in range(POINT_READS):
            connection.execute(point).fetchone()
        connection.rollback()

    def read_all() -> None:
        fetched = connection.execute(every).fetchall()
        assert len({row: None for row in fetched}) == len(records)
        connection.rollback()

    def upsert_all() -> None:
        with connection.begin():
            connection.execute(upsert, values)

    return {"point reads": point_reads, "read every replica": read_all, "upsert every replica": upsert_all}, engine


@contextmanager
def databases() -> Iterator[list[tuple[str, Path, str | None, str]]]:
    """(engine, home, SKY_LITE_DB_URL or None, SQLAlchemy URL) for each engine; PostgreSQL on a throwaway
    server, stopped on the way out."""
    sys.path.insert(0, str(REPO))
    from tests.postgres import find_postgres_bin, start_postgres

    bin_dir = find_postgres_bin()
    if bin_dir is None:
        sys.exit("PostgreSQL (initdb, pg_ctl) is not installed (Debian: apt-get install postgresql)")
    server = start_postgres(bin_dir, durable=True)
    try:
        with tempfile.TemporaryDirectory() as root:
            name = server.create_database()
            yield [("sqlite", Path(root) / "sqlite", None, f"sqlite:///{Path(root) / 'sqlite' / 'state.db'}"),
                   ("postgresql", Path(root) / "pg", server.url(name),
                    server.url(name).replace("postgresql://", "postgresql+psycopg://"))]
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lines = ["| engine | statements | hand-written CPU / wall | SQLAlchemy Core CPU / wall | Core / hand-written CPU |",
             "| --- | --- | ---: | ---: | ---: |"]
    with databases() as engines:
        for engine_name, home, db_url, sa_url in engines:
            os.environ.pop("SKY_LITE_DB_URL", None)
            if db_url is not None:
                os.environ["SKY_LITE_DB_URL"] = db_url
            store = Store.open(home)
            records = fill(store)
            mine = hand_written(store, records)
            theirs, engine = core(sa_url, engine_name, records)
            for kind, func in mine.items():
                ours, alchemy = timed(func, args.rounds), timed(theirs[kind], args.rounds)
                lines.append(f"| {engine_name} | {kind} | {ours[0]:,.1f} / {ours[1]:,.1f} ms "
                             f"| {alchemy[0]:,.1f} / {alchemy[1]:,.1f} ms | {alchemy[0] / ours[0]:.1f}x |")
                print(f"{engine_name} {kind}: done", file=sys.stderr)
            engine.dispose()
            store.close()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
