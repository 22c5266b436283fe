"""`.skyignore` / `.gitignore` patterns, as a table: pattern, path, is it a directory -> ignored?"""

from __future__ import annotations

import pytest

from skyserve_lite.files.ignore import parse_ignore_rules


@pytest.mark.parametrize(("rules", "path", "is_dir", "ignored"), [
    pytest.param("*.pyc", "a.pyc", False, True, id="glob-at-root"),
    pytest.param("*.pyc", "pkg/sub/a.pyc", False, True, id="name-pattern-matches-at-any-depth"),
    pytest.param("*.pyc", "a.py", False, False, id="glob-miss"),
    pytest.param("/build", "build", True, True, id="anchored-at-root"),
    pytest.param("/build", "src/build", True, False, id="anchored-not-below"),
    pytest.param("logs/", "logs", True, True, id="dir-only-matches-dir"),
    pytest.param("logs/", "logs", False, False, id="dir-only-skips-file"),
    pytest.param("docs/*.md", "docs/a.md", False, True, id="slash-anchors-the-pattern"),
    pytest.param("docs/*.md", "x/docs/a.md", False, False, id="slash-pattern-not-at-depth"),
    pytest.param("docs/*.md", "docs/sub/a.md", False, False, id="star-does-not-cross-slash"),
    pytest.param("docs/**/*.md", "docs/sub/deep/a.md", False, True, id="double-star-crosses"),
    pytest.param("**/cache", "a/b/cache", True, True, id="leading-double-star"),
    pytest.param("*.log\n!keep.log", "keep.log", False, False, id="negation-re-includes"),
    pytest.param("*.log\n!keep.log", "other.log", False, True, id="negation-only-its-match"),
    pytest.param("# comment\n\n*.tmp", "x.tmp", False, True, id="comments-and-blank-lines"),
    pytest.param("data?.csv", "data1.csv", False, True, id="question-mark"),
    pytest.param("[ab].txt", "a.txt", False, True, id="character-class"),
    pytest.param("[!ab].txt", "a.txt", False, False, id="negated-character-class"),
    pytest.param(r"\#notes", "#notes", False, True, id="escaped-hash"),
])
def test_ignore_rules(rules: str, path: str, is_dir: bool, ignored: bool) -> None:
    assert parse_ignore_rules(rules).is_ignored(path, is_dir) is ignored
