"""The build's one step beyond pyproject.toml: the load balancer's request-path modules compiled with mypyc.

Compiled, the load balancer spends about a quarter less CPU per request, and with two worker processes it
serves 0.82x nginx's requests/s against 0.72x interpreted (docs/benchmarks.md, "fifth pass"). The same
source runs either way. The build is all or nothing: where there is no mypyc (not CPython), mypyc refuses a
module, or a compile or link fails (no C compiler), none of the compiled files is installed and the modules
are the plain Python they are; ``SKY_LITE_PURE_PYTHON=1`` asks for that on purpose (and then mypy is not
fetched for the build). An editable install (``pip install -e .``) is never compiled: a compiled module
next to its source is imported instead of it, and edits to the source would silently do nothing. Only the
steps that build (a wheel, ``build_ext``) compile; the metadata steps do not run mypy.
``python -m skyserve_lite.lb`` logs which it runs.

mypy type-checks the modules for mypyc on its own defaults (not the project's strict settings) and without
the installed packages (``--no-site-packages``), so every environment compiles the same code: the types of
aiohttp, httptools and multidict are Any there, which compiles to the same calls the interpreter makes. The
compiled modules share one library inside the package (``skyserve_lite/lb/_native__mypyc``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Modules of skyserve_lite/lb compiled (benchmarks/lb_bench.py and scripts/test_compiled_lb.py read it).
COMPILED_MODULES = (
    "http1", "guard", "policies", "outcomes", "records", "metrics", "proxy", "pooled_upstream", "server",
    "upstream", "outliers", "split", "buckets",
)
PURE_VARIABLE = "SKY_LITE_PURE_PYTHON"
MYPY = "mypy==2.4.1"  # the dev extra's pin: the checker the code is typed against
GROUP = "skyserve_lite.lb._native"
# The setup.py commands that build the package's files ("editable_wheel" is not one: see above).
_BUILDING = frozenset({"bdist_wheel", "build", "build_ext", "install"})


def wants_compiling() -> bool:
    return os.environ.get(PURE_VARIABLE, "").strip() in ("", "0") and sys.implementation.name == "cpython"


def compiled_extensions() -> list[Any]:
    """The mypyc extensions to build; none when compiling is not possible, not wanted or not this step's."""
    if not wants_compiling() or not _BUILDING.intersection(sys.argv[1:]):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("skyserve-lite: mypyc is not installed; the load balancer is installed as pure Python", file=sys.stderr)
        return []
    paths = [f"skyserve_lite/lb/{name}.py" for name in COMPILED_MODULES]
    try:
        return list(mypycify(["--config-file=", "--no-site-packages", "--ignore-missing-imports", *paths],
                             opt_level="3", group_name=GROUP))
    except (Exception, SystemExit) as exc:  # mypy's errors end in SystemExit
        print(f"skyserve-lite: mypyc cannot compile the load balancer ({exc}); installing it as pure Python",
              file=sys.stderr)
        return []


class BuildExtOrPure(build_ext):
    """``build_ext`` that builds every compiled module or none: a failure anywhere (no compiler, a link
    error) removes what was built, so that no module is left importing a shared library that was not, and
    compiled files left in the build folder by an earlier build never ship with newer source."""

    def run(self) -> None:
        self._remove_compiled()
        try:
            super().run()
        except Exception as exc:
            self._remove_compiled()
            print(f"skyserve-lite: compiling the load balancer failed ({exc}); installing it as pure Python",
                  file=sys.stderr)

    def _remove_compiled(self) -> None:
        roots = {Path(self.build_lib)} | ({Path.cwd()} if self.inplace else set())
        for root in roots:
            for name in [*COMPILED_MODULES, "_native__mypyc"]:
                for path in (root / "skyserve_lite" / "lb").glob(f"{name}.*"):
                    if path.suffix in (".so", ".pyd"):
                        path.unlink()


setup(
    ext_modules=compiled_extensions(),
    cmdclass={"build_ext": BuildExtOrPure},
    # Asked of the build front end before building (setuptools' get_requires_for_build_*): mypy only when
    # the build will compile.
    setup_requires=[MYPY] if wants_compiling() else [],
)
