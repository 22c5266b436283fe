"""What every command module of the CLI shares: the state directory, the controller, error output.

Light to import (click and the standard library): `sky-lite --help` and every command's module import this,
and what a command needs (the api, rich) is imported when it runs.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from skyserve_lite.errors import SkyLiteError
from skyserve_lite.paths import home_dir

if TYPE_CHECKING:
    from rich.console import Console

    from skyserve_lite import api

__all__ = ["NO_SERVICES", "errors", "get_controller", "has_no_state", "has_nothing_to_show", "home_dir",
           "one_shot_collection", "stderr"]

# What `serve status` says when there is no service at all (``render.status_renderable`` and ``has_no_state``).
NO_SERVICES = "No service is running. Start one with `sky-lite serve up TASK.yaml`."

# The files whose absence means a state directory holds nothing to show: the store (``state.store.DB_NAME``)
# and the record of a remote controller (``remote.config.RECORD_FILE``; the choice, ``SELECT_SETTING``).
# Spelled out, not imported: those modules are what ``has_no_state`` spares (tests/cli holds them equal).
STORE_FILE = "state.db"
REMOTE_RECORD_FILE = "controller.json"
CONTROLLER_SETTING = "SKY_LITE_CONTROLLER"
# A store in PostgreSQL (``state.dburl``): named by the environment or by the home's settings file.
DB_URL_SETTING = "SKY_LITE_DB_URL"
SETTINGS_FILE = "config.json"


def get_controller(ctx: click.Context | None = None) -> api.Controller:
    """The controller the command talks to: the context object tests pass as ``obj``, else this machine's
    or the recorded host's (``remote.config``), opened on first use so that commands that run the
    controller itself never depend on how to reach it. ``ctx``: the context, where click passes one
    (completion); by default the current one."""
    root = (ctx or click.get_current_context()).find_root()
    if root.obj is None:
        from skyserve_lite.remote.connect import open_controller

        root.obj = open_controller(home_dir(), os.environ)
    return root.obj  # type: ignore[no-any-return]


def has_nothing_to_show() -> bool:
    """``has_no_state`` for the running command: this machine's state directory and environment, unless
    the command was given its controller (the context object, as tests give one)."""
    return click.get_current_context().find_root().obj is None and has_no_state(home_dir(), os.environ)


def has_no_state(home: Path, env: Mapping[str, str]) -> bool:
    """True when a command would read this machine's state directory ``home`` and it holds no store, so
    there is nothing to show: then the store, the api and the renderers need not be loaded to say so (they
    are most of `serve status`'s start, ``docs/benchmarks.md``). Only a few ``lstat`` calls.

    "This machine's": ``SKY_LITE_CONTROLLER`` unset with no ``controller.json`` in ``home``, or ``local``.
    False for a store in PostgreSQL (``SKY_LITE_DB_URL``, or ``db_url`` in the settings), and whenever in
    doubt (a remote controller chosen, a setting it does not understand, a path it cannot look at: a home
    that is a file, a permission), so that the full path answers, with its errors."""
    setting = env.get(CONTROLLER_SETTING, "").strip()
    if setting not in ("", "local"):
        return False
    if setting == "" and not _is_absent(home / REMOTE_RECORD_FILE):
        return False
    if env.get(DB_URL_SETTING, "").strip() or _may_name_a_database(home / SETTINGS_FILE):
        return False  # the state is in PostgreSQL: only the store can tell whether it holds anything
    return _is_absent(home / STORE_FILE)


def _may_name_a_database(settings: Path) -> bool:
    """Whether the settings file may set ``db_url`` (a look at its bytes, no JSON: True when in doubt)."""
    try:
        return b'"db_url"' in settings.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True


def _is_absent(path: Path) -> bool:
    """Whether ``path`` certainly does not exist (a dangling symlink exists; an error other than "no such
    file" is no certainty)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


@contextmanager
def errors() -> Iterator[None]:
    """Turn sky-lite's own errors into one line on stderr and their exit code; no traceback. So too a file
    of the state directory it refused (``state.access.find_refusal_in_home``: a read-only home)."""
    try:
        yield
    except SkyLiteError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        from skyserve_lite.state.access import find_refusal_in_home

        refusal = find_refusal_in_home(exc, home_dir())
        if refusal is None:
            raise
        click.echo(f"Error: {refusal}", err=True)
        sys.exit(refusal.exit_code)


@contextmanager
def one_shot_collection() -> Iterator[None]:
    """No automatic garbage collection inside: for a command that reads a fleet once, prints it and exits.

    Its values (rows, views, table cells) hold no reference cycles, so a collection frees none of them, yet
    CPython starts one every 700 new objects and walks the young ones again each time, and now and then
    every object the imports left: at 10,000 replicas that was a tenth of `serve status`'s instructions and
    more of its time. The state is restored on the way out (tests call commands in one process)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True)
