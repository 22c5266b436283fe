"""The build's one step beyond pyproject.toml: the load balancer's request-path modules compiled with mypyc.

Compiled, the load balancer spends about a quarter less CPU per request; with two worker processes it comes
to 0.76-0.80x nginx's requests/s against 0.59-0.69x interpreted (docs/benchmarks.md, "fifth pass"). The
same source runs either way: where there is no mypyc (not CPython), no C compiler, or mypyc refuses a
module, the modules are installed as the plain Python they are; ``SKY_LITE_PURE_PYTHON=1`` asks for that on
purpose. An editable install (``pip install -e .``) is never compiled: a compiled module next to its source
is imported instead of it, and edits to the source would silently do nothing. Only the steps that build
(a wheel, ``build_ext``) compile; the metadata steps do not run mypy. ``python -m skyserve_lite.lb`` logs
which it runs.

mypy type-checks the modules for mypyc on its own defaults, not the project's strict settings, and without
the runtime dependencies (the build environment has only setuptools and mypy): their types are Any there,
which compiles to the same calls the interpreter makes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup

# Modules of skyserve_lite/lb compiled (benchmarks/lb_bench.py builds its --compiled copy with this file).
COMPILED_MODULES = (
    "http1", "guard", "policies", "outcomes", "records", "metrics", "proxy", "pooled_upstream", "server",
    "upstream", "outliers", "split", "buckets",
)
PURE_VARIABLE = "SKY_LITE_PURE_PYTHON"
# The setup.py commands that build the package's files ("editable_wheel" is not one: see above).
_BUILDING = frozenset({"bdist_wheel", "build", "build_ext", "install"})


def compiled_extensions() -> list[Any]:
    """The mypyc extensions to build, each optional (a failed compile keeps the module's Python); none
    when compiling is not possible or not wanted."""
    if os.environ.get(PURE_VARIABLE, "").strip() not in ("", "0"):
        return []
    if not _BUILDING.intersection(sys.argv[1:]):  # metadata, an sdist, an editable install
        return []
    if sys.implementation.name != "cpython":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("skyserve-lite: mypyc is not installed; the load balancer is installed as pure Python", file=sys.stderr)
        return []
    paths = [f"skyserve_lite/lb/{name}.py" for name in COMPILED_MODULES]
    try:
        extensions = mypycify(["--config-file=", "--ignore-missing-imports", *paths], opt_level="3")
    except (Exception, SystemExit) as exc:  # mypy's errors end in SystemExit
        print(f"skyserve-lite: mypyc cannot compile the load balancer ({exc}); installing it as pure Python",
              file=sys.stderr)
        return []
    for extension in extensions:
        extension.optional = True
    return extensions


setup(ext_modules=compiled_extensions())
