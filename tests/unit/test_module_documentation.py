# SPDX-License-Identifier: GPL-3.0-or-later
"""Every module file's DOCUMENTATION, EXAMPLES and RETURN is YAML that parses, in a second rather than in ansible-test
sanity's minutes: a colon followed by a space inside a plain scalar (``is no finding: the node``) made ansible-doc and
the collection's documentation fail twice (795cee7, and a post-check text later)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted((REPO / "plugins" / "modules").glob("*.py"))
BLOCKS = ("DOCUMENTATION", "EXAMPLES", "RETURN")


def _blocks(path):
    found = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) in BLOCKS:
            found[node.targets[0].id] = node.value.value
    return found


@pytest.mark.parametrize("path", MODULES, ids=[path.stem for path in MODULES])
def test_the_documentation_blocks_parse(path):
    blocks = _blocks(path)
    assert set(blocks) == set(BLOCKS), "%s lacks %s" % (path.name, sorted(set(BLOCKS) - set(blocks)))
    for name, text in blocks.items():
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as error:
            pytest.fail("%s: %s is not YAML: %s" % (path.name, name, " ".join(str(error).split())))
    documentation = yaml.safe_load(blocks["DOCUMENTATION"])
    assert documentation["module"] == path.stem
    # a colon on an item's first line parses, as a mapping: a description is text
    assert all(isinstance(line, str) for line in _lines(documentation["description"])), "%s: a description entry is not text" % path.name


def _lines(description):
    return description if isinstance(description, list) else [description]


def test_a_colon_in_a_plain_scalar_is_caught():
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load("description:\n  - A LIST that fails\n    is no finding: the node's topology\n")
    first_line = yaml.safe_load("description:\n  - A LIST that fails is no finding: the node's topology\n")["description"]
    assert not all(isinstance(line, str) for line in _lines(first_line))
