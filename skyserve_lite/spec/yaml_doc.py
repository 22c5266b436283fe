"""Task YAML text to a document: PyYAML's safe loader, refusing a key given twice.

Apart from the parser (``spec.parse``) so that importing the parser's values and rules loads no YAML: a
status read takes each version's service section from its stored parsed form (``VersionRecord.service_spec``),
and PyYAML's import (its reader's and resolver's patterns compiled) was a twentieth of `serve status`.
"""

from __future__ import annotations

from typing import Any

import yaml

from skyserve_lite.errors import SpecError

# libyaml's parser when PyYAML was built with it (the wheels are): the same documents and errors, parsed
# six times faster, which `serve status` over 100 services (a parse per service) notices.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_SafeLoader):  # type: ignore[valid-type,misc]
    """A ``SafeLoader`` that rejects a key given twice in one mapping.

    Plain YAML keeps the last value, so a second ``run:`` further down a file would silently replace the
    first; here it is an error with the line of the repeated key.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` may be overridden by keys written out; that is its purpose
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key is reported by the base class
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def load_document(text: str, source: str) -> object:
    """The document of ``text``; ``SpecError`` (with the line and column) when it is not YAML."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(source, "", f"invalid YAML{where}: {problem}") from exc
