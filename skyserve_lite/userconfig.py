"""The home's own settings, set with `sky-lite config set KEY VALUE` and kept in ``$SKY_LITE_HOME/config.json``.

Each key has a reader that validates its value when it is set, so a bad value is refused then, with the
key named, and never found later by a command that depends on it.

``db_url`` (where the state lives: ``state.dburl``) may carry a password: that is never written to
``config.json``, nor shown. It goes to libpq's password file of the home (``pgpass``, 0600), which the store
hands to libpq; the URL is kept without it and shown as ``postgresql://user:***@host/db``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from skyserve_lite.errors import SpecError, UsageError

CONFIG_FILE = "config.json"
DB_URL = "db_url"
# Must match state.store.DB_NAME and state.dburl.PASSFILE (imported only where a URL is set or read).
_SQLITE_FILE = "state.db"
_PASSFILE = "pgpass"


def _check_infra(value: str) -> str:
    from skyserve_lite.spec.parse import parse_infra

    try:
        return parse_infra(value, "default_infra", "sky-lite config").describe()
    except SpecError as exc:
        raise UsageError(f"default_infra: {exc.problem}") from None


def _check_db_url(value: str) -> str:
    from skyserve_lite.state.dburl import parse_database_url

    return parse_database_url(value, DB_URL).text_without_password()


# key -> (what it means, validator returning the value to keep)
KEYS: Mapping[str, tuple[str, Callable[[str], str]]] = {
    "default_infra": ("where a task that names no cloud runs (CLOUD[/REGION[/ZONE]]); unset: local",
                      _check_infra),
    DB_URL: ("the PostgreSQL database holding the state (postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE; "
             "a password is kept in pgpass, 0600); unset: SQLite in this directory (SKY_LITE_DB_URL wins)",
             _check_db_url),
}


def _path(home: Path) -> Path:
    return home / CONFIG_FILE


def load_config(home: Path) -> dict[str, str]:
    """The settings of ``home``; none when the file does not exist. A damaged file is a ``UsageError``."""
    try:
        doc = json.loads(_path(home).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):  # a home that is a file: the store's checks say so
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"{_path(home)}: cannot read the settings ({exc}); fix or delete the file") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"{_path(home)}: not a JSON object; fix or delete the file")
    return {str(k): str(v) for k, v in doc.items() if k in KEYS}


def show_config(home: Path) -> dict[str, str]:
    """The settings of ``home`` as `config list` prints them: ``db_url`` with ``***`` for a kept password."""
    config = load_config(home)
    if DB_URL in config:
        config[DB_URL] = _shown_db_url(home, config[DB_URL])
    return config


def _shown_db_url(home: Path, kept: str) -> str:
    from skyserve_lite.state.dburl import find_database_url

    url = find_database_url(home, {})
    return str(url) if url is not None else kept


def set_config(home: Path, key: str, value: str | None) -> str | None:
    """Set (or with ``None`` unset) ``key``; returns the value kept, as it is shown (a password as ``***``).
    Raises ``UsageError`` for an unknown key or a bad value, changing nothing."""
    if key not in KEYS:
        raise UsageError(f"unknown setting {key!r}; settings: {', '.join(KEYS)}")
    config = load_config(home)
    kept = KEYS[key][1](value) if value is not None else None
    if key == DB_URL:
        _check_no_sqlite_services(home, value)
    if kept is None:
        config.pop(key, None)
    else:
        config[key] = kept
    home.mkdir(parents=True, exist_ok=True)
    if key == DB_URL:
        _keep_password(home, value)
    temporary = _path(home).with_name(f".{CONFIG_FILE}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, _path(home))
    return _shown_db_url(home, kept) if key == DB_URL and kept is not None else kept


def _keep_password(home: Path, value: str | None) -> None:
    """Write the password of the URL ``value`` into the home's libpq password file, or remove the file when
    there is none (it belonged to the URL set before)."""
    from skyserve_lite.state.dburl import parse_database_url, write_passfile

    url = parse_database_url(value, DB_URL) if value is not None else None
    if url is not None and url.password is not None:
        write_passfile(home / _PASSFILE, url, url.password)
    else:
        (home / _PASSFILE).unlink(missing_ok=True)


def _check_no_sqlite_services(home: Path, value: str | None) -> None:
    """Refuse to move the state to PostgreSQL while this home's SQLite store holds services: sky-lite does
    not copy state between engines, and the services' replicas would run on with no store that knows them."""
    if value is None or not (home / _SQLITE_FILE).exists():
        return
    from skyserve_lite.state.store import Store

    store = Store.open_sqlite(home, create=False)
    try:
        names = [service.name for service in store.list_services()]
    finally:
        store.close()
    if names:
        raise UsageError(f"{DB_URL}: this state directory's SQLite store holds {len(names)} service(s) "
                         f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); sky-lite does not move "
                         "state between databases: take them down first (`sky-lite serve down --all`)")
