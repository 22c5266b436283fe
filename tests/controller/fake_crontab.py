"""A stand-in for crontab(1) that tests put first on PATH, so no test reads or writes the real user's crontab."""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

import pytest

SCRIPT = """\
#!/bin/sh
# A stand-in for crontab(1): the table lives in {store}.
case "$1" in
  -l) if [ -f {store} ]; then cat {store}; else echo "no crontab for $(id -un)" >&2; exit 1; fi ;;
  -) cat > {store} ;;
  *) echo "fake crontab: unsupported $*" >&2; exit 2 ;;
esac
"""


def write_fake_crontab(bin_dir: Path, store: Path) -> None:
    """Write the fake as ``bin_dir``/crontab (executable), its table in ``store``; whoever runs `crontab`
    with ``bin_dir`` first on PATH (this process, an sshd's sessions) gets it."""
    script = bin_dir / "crontab"
    script.write_text(SCRIPT.format(store=shlex.quote(str(store))))
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def install_fake_crontab(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put a fake `crontab` in ``directory``/fake-bin, first on PATH; return the file holding its table
    (absent until written: "no crontab for USER", as the real one says)."""
    bin_dir = directory / "fake-bin"
    bin_dir.mkdir()
    store = directory / "crontab.txt"
    write_fake_crontab(bin_dir, store)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return store
