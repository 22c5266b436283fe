"""Where the state lives when it is not the SQLite file of the home: a PostgreSQL database, named by a URL.

``SKY_LITE_DB_URL`` (the environment) or ``db_url`` (``sky-lite config set db_url``, kept in the home) holds
``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=...]``; without either, the state is SQLite in
the home (``state.db``), as it always was.

The URL is parsed once, here, into a ``DatabaseUrl``: typed parts, the password wrapped in ``Password`` so
that no ``repr``, ``str``, f-string or log line of the value, nor of anything holding it, ever shows it
(``postgresql://user:***@host/db``). The password reaches libpq only as a keyword argument of the connection
or through libpq's own password file (``PASSFILE``: ``config set db_url`` keeps a given password there, 0600,
never in ``config.json``); never in a command line or a message.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from skyserve_lite.errors import UsageError
from skyserve_lite.netaddr import url_host

ENV_VAR = "SKY_LITE_DB_URL"
CONFIG_KEY = "db_url"
# libpq's password file of a home whose `db_url` was set with a password (``hostname:port:database:username:
# password``, one line, mode 0600: libpq ignores a password file others can read).
PASSFILE = "pgpass"
DEFAULT_PORT = 5432
# What libpq waits for a server that does not answer at all (its own default is forever).
DEFAULT_CONNECT_TIMEOUT = "10"
_SCHEMES = ("postgresql", "postgres")
# Connection options a URL may carry (TLS towards a managed database, how long to wait). Any other is refused
# rather than passed on unread: `?password=...` in particular would bypass the redaction.
QUERY_OPTIONS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "application_name")


class Password:
    """A password that never shows itself: ``repr`` and ``str`` are ``***``. ``reveal`` is for libpq only."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Password('***')"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Password) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed ``postgresql://`` URL. ``str`` is the URL with ``***`` for a password: safe to print and log.

    ``origin`` names where it came from (``SKY_LITE_DB_URL``, ``db_url``) for messages; ``passfile`` is the
    libpq password file that holds its password when the URL itself has none (``config set db_url`` with a
    password; None when there is no such file)."""

    user: str
    host: str
    database: str
    port: int | None = None
    password: Password | None = field(default=None, compare=False)
    options: tuple[tuple[str, str], ...] = ()
    origin: str = ENV_VAR
    passfile: Path | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return self._render(":***" if self.password is not None or self.passfile is not None else "")

    def text_without_password(self) -> str:
        """The URL as ``config.json`` keeps it: everything but the password."""
        return self._render("")

    def text_with_password(self) -> str:
        """The URL whole, its password included (percent-encoded, so that ``parse_database_url`` reads back
        the same value): only for a channel nobody else reads, such as the stdin of the ssh command that runs
        `config set db_url -` on a controller host. With no password in the value (none given, or one kept
        in ``passfile``, which stays there), the same as ``text_without_password``."""
        if self.password is None:
            return self._render("")
        return self._render(f":{urllib.parse.quote(self.password.reveal(), safe='')}")

    def _render(self, secret: str) -> str:
        user = urllib.parse.quote(self.user, safe="")
        host = url_host(self.host)
        port = f":{self.port}" if self.port is not None else ""
        query = f"?{urllib.parse.urlencode(self.options)}" if self.options else ""
        return f"postgresql://{user}{secret}@{host}{port}/{urllib.parse.quote(self.database, safe='')}{query}"

    def connect_arguments(self) -> dict[str, str]:
        """libpq's keyword arguments for this database, the password among them when the URL had one (never
        a conninfo string to log or a command line)."""
        arguments = {"host": self.host, "port": str(self.port or DEFAULT_PORT), "user": self.user,
                     "dbname": self.database, "connect_timeout": DEFAULT_CONNECT_TIMEOUT,
                     "application_name": "sky-lite", **dict(self.options)}
        if self.password is not None:
            arguments["password"] = self.password.reveal()
        elif self.passfile is not None:
            arguments["passfile"] = str(self.passfile)
        return arguments


def parse_database_url(text: str, origin: str = ENV_VAR) -> DatabaseUrl:
    """``text`` parsed, or ``UsageError`` naming ``origin`` and what is wrong (never echoing the password)."""
    def refuse(problem: str) -> UsageError:
        return UsageError(f"{origin}: {problem}; expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE")

    try:
        parts = urllib.parse.urlsplit(text.strip())
        port = parts.port
    except ValueError:
        # urllib's message may quote the text, password included: say what is wrong in our own words, and
        # leave its exception out of the chain.
        raise refuse("not a valid URL (its port or address cannot be read)") from None
    if parts.scheme not in _SCHEMES:
        shown = parts.scheme or "none"
        raise refuse(f"the scheme must be postgresql:// (got {shown!r}); SQLite needs no URL: unset {origin}")
    if not parts.hostname:
        raise refuse("no host")
    if not parts.username:
        raise refuse("no user")
    database = urllib.parse.unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise refuse("no database name (the path after the host)")
    if parts.fragment:
        raise refuse("a URL fragment (#...) means nothing here")
    options = tuple(urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    unknown = sorted({name for name, _ in options} - set(QUERY_OPTIONS))
    if unknown:
        raise refuse(f"unknown option {unknown[0]!r} (known: {', '.join(QUERY_OPTIONS)})")
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return DatabaseUrl(user=urllib.parse.unquote(parts.username), host=parts.hostname, database=database,
                       port=port, password=Password(password) if password else None, options=options,
                       origin=origin)


def find_database_url(home: Path, environ: Mapping[str, str]) -> DatabaseUrl | None:
    """The PostgreSQL database the state of ``home`` lives in, or None for SQLite in the home.

    ``SKY_LITE_DB_URL`` wins over the home's ``db_url`` setting (whose password, if it was given one, is in
    the home's ``PASSFILE``). An empty variable counts as unset. A bad URL is a ``UsageError``."""
    text = environ.get(ENV_VAR, "").strip()
    if text:
        return parse_database_url(text, ENV_VAR)
    from skyserve_lite.userconfig import load_config

    stored = load_config(home).get(CONFIG_KEY)
    if not stored:
        return None
    url = parse_database_url(stored, CONFIG_KEY)
    passfile = home / PASSFILE
    return DatabaseUrl(user=url.user, host=url.host, database=url.database, port=url.port, options=url.options,
                       origin=CONFIG_KEY, passfile=passfile if passfile.is_file() else None)


def passfile_line(url: DatabaseUrl, password: Password) -> str:
    """``url``'s entry in a libpq password file: ``host:port:database:user:password``, with ``:`` and ``\\``
    escaped as libpq reads them."""
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace(":", "\\:")

    fields = (url.host, str(url.port or DEFAULT_PORT), url.database, url.user, password.reveal())
    return ":".join(escape(value) for value in fields) + "\n"


def write_passfile(path: Path, url: DatabaseUrl, password: Password) -> None:
    """Write ``path`` (0600 from its creation, replaced whole) with ``url``'s one password entry."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(passfile_line(url, password))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
