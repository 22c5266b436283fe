"""Run the load balancer's tests against its modules compiled as `pip install .` compiles them.

    python scripts/test_compiled_lb.py [PYTEST ARGS ...]

mypyc checks declared types as the compiled code runs, so the same source could answer differently
compiled: `.ci/run` runs this beside the README's test command. In a copy of the tree (the tests import the
tree they sit in, and a compiled module beside its source in the checkout would shadow edits to it), it
builds in place with setup.py, checks that every module of ``COMPILED_MODULES`` imports compiled, and runs
``pytest tests/lb`` there. Exits with pytest's status, or 1 naming what did not compile. Needs mypy (the
``dev`` extra) and a C compiler.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COPIED = ("skyserve_lite", "tests", "examples", "setup.py", "pyproject.toml", "README.md")


def compiled_modules(tree: Path) -> tuple[str, ...]:
    """setup.py's ``COMPILED_MODULES``, read from the file (running it would build)."""
    for node in ast.parse((tree / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "COMPILED_MODULES"
                                                for target in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise SystemExit("test_compiled_lb: setup.py names no COMPILED_MODULES")


def build_in_place(tree: Path) -> list[str]:
    """Build ``tree``'s compiled modules in place; the modules that do not import compiled (all when the
    build failed)."""
    environ = {key: value for key, value in os.environ.items() if key != "SKY_LITE_PURE_PYTHON"}
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, env=environ, check=False)
    modules = compiled_modules(tree)
    probe = ("import importlib, sys\n"
             "names = sys.argv[1:]\n"
             "print(' '.join(n for n in names if importlib.import_module('skyserve_lite.lb.' + n)"
             ".__file__.endswith('.py')))\n")
    found = subprocess.run([sys.executable, "-c", probe, *modules], cwd=tree, capture_output=True, text=True,
                           check=False)
    if found.returncode != 0:
        print(found.stderr, file=sys.stderr)
        return list(modules)
    return found.stdout.split()


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="sky-lite-compiled-") as tmp:
        tree = Path(tmp)
        for name in COPIED:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
            else:
                shutil.copy2(source, tree / name)
        interpreted = build_in_place(tree)
        if interpreted:
            print(f"test_compiled_lb: not compiled: {', '.join(interpreted)}", file=sys.stderr)
            return 1
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/lb", *argv],
                              cwd=tree, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
