"""The home's own settings, set with `sky-lite config set KEY VALUE` and kept in ``$SKY_LITE_HOME/config.json``.

Each key has a reader that validates its value when it is set, so a bad value is refused then, with the
key named, and never found later by a command that depends on it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from skyserve_lite.errors import SpecError, UsageError

CONFIG_FILE = "config.json"


def _check_infra(value: str) -> str:
    from skyserve_lite.spec.parse import parse_infra

    try:
        return parse_infra(value, "default_infra", "sky-lite config").describe()
    except SpecError as exc:
        raise UsageError(f"default_infra: {exc.problem}") from None


# key -> (what it means, validator returning the value to keep)
KEYS: Mapping[str, tuple[str, Callable[[str], str]]] = {
    "default_infra": ("where a task that names no cloud runs (CLOUD[/REGION[/ZONE]]); unset: local",
                      _check_infra),
}


def _path(home: Path) -> Path:
    return home / CONFIG_FILE


def load_config(home: Path) -> dict[str, str]:
    """The settings of ``home``; none when the file does not exist. A damaged file is a ``UsageError``."""
    try:
        doc = json.loads(_path(home).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"{_path(home)}: cannot read the settings ({exc}); fix or delete the file") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"{_path(home)}: not a JSON object; fix or delete the file")
    return {str(k): str(v) for k, v in doc.items() if k in KEYS}


def set_config(home: Path, key: str, value: str | None) -> str | None:
    """Set (or with ``None`` unset) ``key``; returns the value kept. Raises ``UsageError`` for an unknown key
    or a bad value, changing nothing."""
    if key not in KEYS:
        raise UsageError(f"unknown setting {key!r}; settings: {', '.join(KEYS)}")
    config = load_config(home)
    kept = KEYS[key][1](value) if value is not None else None
    if kept is None:
        config.pop(key, None)
    else:
        config[key] = kept
    home.mkdir(parents=True, exist_ok=True)
    temporary = _path(home).with_name(f".{CONFIG_FILE}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, _path(home))
    return kept
