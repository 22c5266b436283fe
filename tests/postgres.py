"""A throwaway PostgreSQL server on 127.0.0.1: what the tests run the store on (``postgres_server`` in
tests/conftest.py), and what `benchmarks/controller_bench.py --engine postgresql` measures against.

``initdb`` and ``pg_ctl`` into a fresh temporary directory, a free port on 127.0.0.1 only (and a socket in that
directory), fsync off (a test server loses nothing worth keeping). Authentication: trust on 127.0.0.1 for
every user but ``PASSWORD_USER``, who must give ``PASSWORD`` (scram-sha-256): the tests of password handling
log in as that user. PostgreSQL refuses to run as root: as root, every server command runs as the
``postgres`` OS user (Debian's package makes it), owner of the directory.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPERUSER = "postgres"
PASSWORD_USER = "sky_password"
# Characters a URL must escape and a libpq password file must escape: both are exercised.
PASSWORD = "pw:with@odd/chars\\and%more"

_HBA = f"""\
local all all trust
host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 trust
"""


def find_postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: Debian's newest /usr/lib/postgresql/N/bin, else the
    one on PATH; None when PostgreSQL is not installed."""
    def version(path: Path) -> int:
        return int(path.parent.name) if path.parent.name.isdigit() else 0

    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    for candidate in candidates:
        if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostgresServer:
    """A running server (``start_postgres``); ``stop`` ends it and removes its directory."""

    bin_dir: Path
    root: Path
    port: int
    os_user: str | None  # the OS user the server runs as, when not this process's
    _names: Any = field(default_factory=lambda: itertools.count(1))

    def url(self, database: str, user: str = SUPERUSER, password: str | None = None) -> str:
        """A ``postgresql://`` URL of ``database`` on this server, as ``SKY_LITE_DB_URL`` takes it."""
        secret = f":{urllib.parse.quote(password, safe='')}" if password is not None else ""
        return f"postgresql://{urllib.parse.quote(user, safe='')}{secret}@127.0.0.1:{self.port}/{database}"

    def admin(self, database: str = "postgres") -> Any:
        """A psycopg connection as the superuser, in autocommit."""
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=database,
                               autocommit=True)

    def create_database(self, owner: str = SUPERUSER) -> str:
        """A new, empty database (its name): each test gets a fresh one, as it gets a fresh home."""
        name = f"t{os.getpid()}_{next(self._names)}"
        with self.admin() as admin:
            # A copy of the template's files: with fsync off, several times faster than the WAL-logged
            # copy PostgreSQL 15 makes by default.
            strategy = " STRATEGY file_copy" if admin.info.server_version >= 150000 else ""
            admin.execute(f'CREATE DATABASE {name} OWNER "{owner}"{strategy}')
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending any connection a test left open to it."""
        with self.admin() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _run(self, "pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def _run(server: PostgresServer, program: str, *args: str) -> subprocess.CompletedProcess[str]:
    user = server.os_user
    return subprocess.run([str(server.bin_dir / program), *args], check=True, capture_output=True, text=True,
                          cwd=server.root, user=user, group=pwd.getpwnam(user).pw_gid if user else None,
                          extra_groups=[] if user else None, timeout=120)


def start_postgres(bin_dir: Path, attempts: int = 3, *, durable: bool = False) -> PostgresServer:
    """A fresh server from ``bin_dir``'s ``initdb`` and ``pg_ctl``, listening on 127.0.0.1 only, with
    ``PASSWORD_USER`` made. Another free port is tried when the one chosen was taken meanwhile. Raises
    ``RuntimeError`` with the server's log when it does not start.

    ``durable``: fsync and full-page writes on, as a production server has them (the benchmark's); commits
    still do not wait for their WAL flush (``synchronous_commit=off``), as SQLite's ``synchronous=NORMAL`` in
    WAL mode does not. Else everything off: a test server loses nothing worth keeping."""
    os_user = SUPERUSER if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="sky-lite-pg-"))
    if os_user is not None:
        entry = pwd.getpwnam(os_user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    server = PostgresServer(bin_dir, root, 0, os_user)
    try:
        _run(server, "initdb", "-D", str(root / "data"), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8",
             "--locale=C", "--no-sync")
        (root / "data" / "pg_hba.conf").write_text(_HBA)
        log = root / "server.log"
        for _ in range(attempts):
            server.port = _free_port()
            settings = (f"-c port={server.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={root}"
                        " -c synchronous_commit=off -c max_connections=200")
            if not durable:
                settings += " -c fsync=off -c full_page_writes=off"
            try:
                _run(server, "pg_ctl", "-D", str(root / "data"), "-l", str(log), "-o", settings, "-w", "-t", "30",
                     "start")
                break
            except subprocess.CalledProcessError:
                text = log.read_text() if log.exists() else ""
                if not re.search(r"could not bind|Address already in use", text):
                    raise RuntimeError(f"PostgreSQL did not start:\n{text[-3000:]}") from None
        else:
            raise RuntimeError(f"PostgreSQL found no free port in {attempts} attempts")
        with server.admin() as admin:
            password = PASSWORD.replace("'", "''")
            admin.execute(f"CREATE ROLE {PASSWORD_USER} LOGIN PASSWORD '{password}'")
    except BaseException:
        server.stop()
        raise
    return server
