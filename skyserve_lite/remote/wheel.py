"""A wheel of the running sky-lite, built from its own files, for installing this exact version elsewhere.

The controller host must run the code the client runs (the protocol refuses anything else), whether this
sky-lite came from a wheel, an sdist or an editable checkout with local changes. So the wheel is made from
the package's files as they are on disk, with the installed distribution's metadata (its version and
dependencies): no build backend and no network. ``package_digest`` names that content; the host reports
its own, so `controller status` can tell an upgrade is due even when the version string is the same.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import skyserve_lite
from skyserve_lite import __version__
from skyserve_lite.errors import ControllerError

DISTRIBUTION = "skyserve-lite"
_ENTRY_POINTS = "[console_scripts]\nsky-lite = skyserve_lite.cli.entry:main\n"
_WHEEL = "Wheel-Version: 1.0\nGenerator: sky-lite\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed times: the same files make the same wheel
_LEFT_OUT = frozenset({".pyc", ".pyo", ".so", ".pyd"})


def package_root() -> Path:
    return Path(skyserve_lite.__file__).resolve().parent


def iter_package_files(root: Path | None = None) -> Iterator[tuple[str, Path]]:
    """(archive name, path) of every file of the package, sorted; compiled caches and compiled modules left
    out. The load balancer's modules compiled at install (setup.py) are for this machine's Python and need
    a library outside the package: the host gets their source, which runs the same (interpreted)."""
    root = root or package_root()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in _LEFT_OUT:
            yield f"skyserve_lite/{path.relative_to(root).as_posix()}", path


@cache
def package_digest(root: Path | None = None) -> str:
    """sha256 over the package's file names and bytes (what ``build_wheel`` ships)."""
    hasher = hashlib.sha256()
    for name, path in iter_package_files(root):
        hasher.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return hasher.hexdigest()


def installed_digest() -> str | None:
    try:
        return package_digest()
    except OSError:
        return None


def wheel_name() -> str:
    return f"skyserve_lite-{__version__}-py3-none-any.whl"


def build_wheel(directory: Path) -> Path:
    """Write the wheel of the running package into ``directory``; its path. Raises ``ControllerError``
    when the package's metadata cannot be found (it is not installed)."""
    from importlib import metadata

    # The installed distribution's METADATA (a stray egg-info in the working directory has none).
    meta = next((text for d in metadata.distributions(name=DISTRIBUTION) if (text := d.read_text("METADATA"))), None)
    if not meta:
        raise ControllerError(f"cannot build a wheel of sky-lite: the {DISTRIBUTION} distribution's metadata is "
                              "missing (install sky-lite with pip, e.g. `pip install -e .`)")
    dist_info = f"skyserve_lite-{__version__}.dist-info"
    path = directory / wheel_name()
    records: list[str] = []
    temporary = path.with_suffix(".tmp")
    with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{name},sha256={digest},{len(data)}")

        for name, file in iter_package_files():
            add(name, file.read_bytes())
        add(f"{dist_info}/METADATA", meta.encode())
        add(f"{dist_info}/WHEEL", _WHEEL.encode())
        add(f"{dist_info}/entry_points.txt", _ENTRY_POINTS.encode())
        record = "\n".join([*records, f"{dist_info}/RECORD,,"]) + "\n"
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=_EPOCH)
        info.external_attr = 0o644 << 16
        archive.writestr(info, record)
    temporary.replace(path)
    return path
