# SPDX-License-Identifier: GPL-3.0-or-later
"""Count what the orchestration still decides in Jinja (issue 45: one engine in Python, thin playbooks).

Three figures over every YAML file of ``playbooks/`` and ``roles/`` (templates, ``*.j2``, are not orchestration and
are not counted):

- internal variables: distinct names that start with ``__``;
- Jinja lines: a line holding ``{{`` or ``{%``, a conditional key with its expression on the line (``when``,
  ``failed_when``, ``changed_when``, ``until``: Ansible templates these bare), or an item of such a key's list or of an
  assert's ``that`` list;
- spanning expressions: a ``{{ }}``/``{% %}`` expression, or a conditional, written over more than one line.

``python tools/orchestration_counts.py`` prints the three totals and the files that hold the most; ``--json`` prints them
as JSON.  tests/unit/test_orchestration_budget.py holds the ceilings.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INTERNAL_VARIABLE = re.compile(r"(?<![A-Za-z0-9_])__[A-Za-z0-9_]+")
JINJA_MARK = re.compile(r"\{\{|\{%")
JINJA_EXPRESSION = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)
CONDITIONAL_KEYS = ("when", "failed_when", "changed_when", "until")
LIST_KEYS = CONDITIONAL_KEYS + ("that",)
KEY_LINE = re.compile(r"^(?P<indent>\s*)(?:- )?(?P<key>[A-Za-z_]+):(?P<rest>.*)$")
BLOCK_SCALAR = re.compile(r"^\s*[>|][+-]?\s*(#.*)?$")


def orchestration_files(root: Path = REPO) -> list[Path]:
    files = []
    for top in ("playbooks", "roles"):
        files.extend(path for path in (root / top).rglob("*") if path.suffix in (".yml", ".yaml") and path.is_file())
    return sorted(files)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def count_file(text: str) -> dict:
    """The figures of one file: its internal variable names, Jinja lines and spanning expressions."""
    lines = text.splitlines()
    jinja_lines = 0
    spanning = sum(1 for match in JINJA_EXPRESSION.finditer(text) if "\n" in match.group(0))
    list_owner_indent = None  # the indent of a conditional/that key whose items follow on their own lines
    block_owner_indent = None  # the indent of a conditional written as a block scalar
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = _indent(line)
        if block_owner_indent is not None:
            if indent > block_owner_indent:
                jinja_lines += 1
                continue
            block_owner_indent = None
        if list_owner_indent is not None:
            if indent >= list_owner_indent and stripped.startswith("- ") and not KEY_LINE.match(line):
                jinja_lines += 1
                continue
            if indent > list_owner_indent:
                jinja_lines += 1
                continue
            list_owner_indent = None
        key_line = KEY_LINE.match(line)
        if key_line and key_line.group("key") in LIST_KEYS:
            rest = key_line.group("rest").strip()
            if not rest:
                list_owner_indent = len(key_line.group("indent"))
                continue
            if BLOCK_SCALAR.match(rest):
                if key_line.group("key") in CONDITIONAL_KEYS:
                    spanning += 1
                block_owner_indent = len(key_line.group("indent"))
                jinja_lines += 1
                continue
            if key_line.group("key") in CONDITIONAL_KEYS or JINJA_MARK.search(line):
                jinja_lines += 1
                continue
        if JINJA_MARK.search(line):
            jinja_lines += 1
    return {
        "internal_variables": sorted(set(INTERNAL_VARIABLE.findall(text))),
        "jinja_lines": jinja_lines,
        "spanning_expressions": spanning,
    }


def count(root: Path = REPO) -> dict:
    per_file = {}
    names: set[str] = set()
    for path in orchestration_files(root):
        figures = count_file(path.read_text(encoding="utf-8"))
        names.update(figures["internal_variables"])
        per_file[str(path.relative_to(root))] = figures
    return {
        "internal_variables": len(names),
        "jinja_lines": sum(figures["jinja_lines"] for figures in per_file.values()),
        "spanning_expressions": sum(figures["spanning_expressions"] for figures in per_file.values()),
        "names": sorted(names),
        "files": {
            name: {"internal_variables": len(figures["internal_variables"]), "jinja_lines": figures["jinja_lines"],
                   "spanning_expressions": figures["spanning_expressions"]}
            for name, figures in per_file.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--top", type=int, default=15, help="how many files to list (the most Jinja lines first)")
    args = parser.parse_args(argv)
    figures = count()
    if args.json:
        json.dump(figures, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0
    print("internal variables: %d   Jinja lines: %d   spanning expressions: %d"
          % (figures["internal_variables"], figures["jinja_lines"], figures["spanning_expressions"]))
    ranked = sorted(figures["files"].items(), key=lambda item: (-item[1]["jinja_lines"], item[0]))
    for name, file_figures in ranked[: args.top]:
        if file_figures["jinja_lines"] or file_figures["internal_variables"]:
            print("  %4d Jinja lines  %3d __ names  %2d spanning  %s" % (
                file_figures["jinja_lines"], file_figures["internal_variables"], file_figures["spanning_expressions"], name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
