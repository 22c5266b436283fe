"""`.skyignore` / `.gitignore` rules for a workdir, as SkyPilot applies them. Pure.

The workdir's own `.skyignore` is used if it exists, else its `.gitignore` (only the file at the workdir's
root). Pattern rules follow gitignore: blank lines and ``#`` comments are skipped; ``!`` re-includes; a
trailing ``/`` matches directories only; a pattern with a ``/`` elsewhere is anchored at the root, one
without matches a name at any depth; ``*`` and ``?`` do not cross ``/``, ``**`` does. The last matching
pattern wins, and an ignored directory is not entered, so nothing below it can be re-included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

IGNORE_FILES = (".skyignore", ".gitignore")


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern[str]
    negate: bool
    directory_only: bool


@dataclass(frozen=True)
class IgnoreRules:
    rules: tuple[Rule, ...] = ()
    source: str | None = None  # the file they came from

    def is_ignored(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (relative, "/"-separated) is left out."""
        ignored = False
        for rule in self.rules:
            if rule.directory_only and not is_dir:
                continue
            if rule.regex.fullmatch(path):
                ignored = not rule.negate
        return ignored


def parse_ignore_rules(text: str, source: str | None = None) -> IgnoreRules:
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        if line.startswith("\\"):
            line = line[1:]
        directory_only = line.endswith("/")
        line = line.strip("/") if directory_only else line
        anchored = "/" in line.rstrip("/")
        line = line.lstrip("/")
        if not line:
            continue
        body = _translate(line)
        regex = re.compile(body if anchored else f"(?:.*/)?{body}")
        rules.append(Rule(regex, negate, directory_only))
    return IgnoreRules(tuple(rules), source)


def _translate(pattern: str) -> str:
    out = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(char))
                i += 1
            else:
                inner = pattern[i + 1:end]
                out.append("[" + ("^" + inner[1:] if inner.startswith("!") else inner) + "]")
                i = end + 1
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)
