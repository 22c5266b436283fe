"""``SKY_LITE_DB_URL`` and ``db_url``: parsed once into typed parts, the password shown nowhere, bad URLs
refused naming where they came from."""

from __future__ import annotations

import json
import stat
import urllib.parse
from pathlib import Path

import pytest

from skyserve_lite.errors import UsageError
from skyserve_lite.state.dburl import (
    DatabaseUrl,
    Password,
    find_database_url,
    parse_database_url,
    passfile_line,
    write_passfile,
)

SECRET = "hunter2:@/x"


@pytest.mark.parametrize(("text", "parts", "shown"), [
    pytest.param("postgresql://sky@db.internal/state", ("sky", "db.internal", None, "state", None, ()),
                 "postgresql://sky@db.internal/state", id="minimal"),
    pytest.param("postgres://sky:pw@127.0.0.1:6432/state", ("sky", "127.0.0.1", 6432, "state", "pw", ()),
                 "postgresql://sky:***@127.0.0.1:6432/state", id="short-scheme-port-password"),
    pytest.param("postgresql://sky:hunter2%3A%40%2Fx@h/d", ("sky", "h", None, "d", SECRET, ()),
                 "postgresql://sky:***@h/d", id="escaped-password"),
    pytest.param("postgresql://a%40b@[::1]:5433/my%20db?sslmode=require",
                 ("a@b", "::1", 5433, "my db", None, (("sslmode", "require"),)),
                 "postgresql://a%40b@[::1]:5433/my%20db?sslmode=require", id="ipv6-escapes-option"),
])
def test_a_url_is_parsed_into_its_parts(text: str, parts: tuple[object, ...], shown: str) -> None:
    url = parse_database_url(text)
    password = url.password.reveal() if url.password is not None else None
    assert (url.user, url.host, url.port, url.database, password, url.options) == parts
    assert str(url) == shown
    assert parse_database_url(shown.replace("***", "pw")).user == url.user  # what is shown parses again


def test_the_password_is_in_no_rendering_of_the_url() -> None:
    url = parse_database_url(f"postgresql://sky:{urllib.parse.quote(SECRET, safe='')}@h/d")
    renderings = [str(url), repr(url), f"{url}", f"{url!r}", url.text_without_password(), repr(url.password),
                  str(url.password), repr(vars(url) if hasattr(url, "__dict__") else url.__repr__())]
    assert all("hunter2" not in rendering for rendering in renderings), renderings
    assert url.connect_arguments()["password"] == SECRET  # for libpq, and for libpq only


@pytest.mark.parametrize(("url", "text"), [
    pytest.param(DatabaseUrl("sky", "db.internal", "state", password=Password("pw")),
                 "postgresql://sky:pw@db.internal/state", id="plain"),
    pytest.param(DatabaseUrl("sky", "::1", "state", port=5433, password=Password("pw")),
                 "postgresql://sky:pw@[::1]:5433/state", id="ipv6-port"),
    pytest.param(DatabaseUrl("sky", "2001:db8::7", "state", password=Password("pw")),
                 "postgresql://sky:pw@[2001:db8::7]/state", id="ipv6-no-port"),
    pytest.param(DatabaseUrl("a@b:c", "h", "d", password=Password("pw")),
                 "postgresql://a%40b%3Ac:pw@h/d", id="escaped-user"),
    pytest.param(DatabaseUrl("sky", "h", "my db", password=Password(SECRET)),
                 "postgresql://sky:hunter2%3A%40%2Fx@h/my%20db", id="escaped-password-and-database"),
    pytest.param(DatabaseUrl("sky", "h", "d", password=Password("pw"),
                             options=(("sslmode", "require"), ("connect_timeout", "5"))),
                 "postgresql://sky:pw@h/d?sslmode=require&connect_timeout=5", id="options"),
    pytest.param(DatabaseUrl("sky", "h", "d", options=(("sslmode", "require"),)),
                 "postgresql://sky@h/d?sslmode=require", id="no-password"),
    pytest.param(DatabaseUrl("sky", "h", "d", passfile=Path("/nonexistent/pgpass")),
                 "postgresql://sky@h/d", id="password-in-a-passfile-stays-there"),
])
def test_the_whole_url_is_written_with_its_password_and_reads_back_the_same(url: DatabaseUrl, text: str) -> None:
    assert url.text_with_password() == text
    again = parse_database_url(text, url.origin)
    assert again == url  # user, host, port, database and options, each as it was
    assert again.password == url.password
    assert again.text_without_password() == url.text_without_password()


@pytest.mark.parametrize(("text", "problem"), [
    pytest.param("sqlite:///x.db", "the scheme must be postgresql://", id="other-scheme"),
    pytest.param("postgresql://sky:pw@/state", "no host", id="no-host"),
    pytest.param("postgresql://db.internal/state", "no user", id="no-user"),
    pytest.param("postgresql://:pw@db.internal/state", "no user", id="no-user-a-password"),
    pytest.param("postgresql://sky:pw@h", "no database name", id="no-database"),
    pytest.param("postgresql://sky:pw@h/a/b", "no database name", id="a-path"),
    pytest.param("postgresql://sky:pw@h:99999/d", "not a valid URL", id="bad-port"),
    pytest.param("postgresql://sky:pw@h/d?password=x", "unknown option 'password'", id="password-option"),
    pytest.param("postgresql://sky:pw@h/d#frag", "fragment", id="fragment"),
])
def test_a_bad_url_is_refused_naming_its_origin_and_never_the_password(text: str, problem: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_database_url(text, "db_url")
    message = str(caught.value)
    assert message.startswith("db_url: ") and problem in message
    assert ":pw@" not in message and caught.value.exit_code == 2
    assert caught.value.__cause__ is None


def test_the_environment_wins_over_the_setting_and_an_empty_one_is_unset(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"db_url": "postgresql://kept@h/d"}))
    assert find_database_url(tmp_path, {"SKY_LITE_DB_URL": "postgresql://env@h/d"}).user == "env"  # type: ignore[union-attr]
    kept = find_database_url(tmp_path, {"SKY_LITE_DB_URL": "  "})
    assert kept is not None and (kept.user, kept.origin, kept.passfile) == ("kept", "db_url", None)
    assert find_database_url(tmp_path / "nothing", {}) is None


def test_a_kept_password_is_libpqs_password_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"db_url": "postgresql://kept@h:6000/d"}))
    url = find_database_url(tmp_path, {})
    assert url is not None
    write_passfile(tmp_path / "pgpass", url, Password(SECRET))
    url = find_database_url(tmp_path, {})
    assert url is not None and url.passfile == tmp_path / "pgpass"
    assert stat.S_IMODE((tmp_path / "pgpass").stat().st_mode) == 0o600
    assert str(url) == "postgresql://kept:***@h:6000/d"
    arguments = url.connect_arguments()
    assert "password" not in arguments and arguments["passfile"] == str(tmp_path / "pgpass")


@pytest.mark.parametrize(("url", "password", "line"), [
    (DatabaseUrl("sky", "h", "d"), "pw", "h:5432:d:sky:pw\n"),
    (DatabaseUrl("s:k", "h", "d", port=6000), "a:b\\c", "h:6000:d:s\\:k:a\\:b\\\\c\n"),
])
def test_password_file_lines_escape_as_libpq_reads_them(url: DatabaseUrl, password: str, line: str) -> None:
    assert passfile_line(url, Password(password)) == line
