# SPDX-License-Identifier: GPL-3.0-or-later
"""`make test` runs the `sandbox` tests beside the lab tests (Makefile: test-checks and test-lab), which is safe only
while no sandbox test brings up or uses the lab.  A test that does so must carry the `lab` marker: lab wins."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB_NAMES = {"running_lab", "lab_lock", "manager"}  # the lab's fixtures and its manager (up, down, ssh)


def _marks(decorators: list[ast.expr]) -> set[str]:
    found = set()
    for decorator in decorators:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute) and target.value.attr == "mark":
            found.add(target.attr)
    return found


def _module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            return _marks(values)
    return set()


def _names(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}


def _uses(function: ast.FunctionDef, fixtures: dict[str, ast.FunctionDef]) -> set[str]:
    """The names a test or fixture uses, through the module's fixtures it asks for, however deep."""
    used, seen, pending = set(), set(), [function]
    while pending:
        current = pending.pop()
        used |= _names(current)
        for arg in current.args.args:
            if arg.arg in fixtures and arg.arg not in seen:
                seen.add(arg.arg)
                pending.append(fixtures[arg.arg])
    return used


def sandbox_tests_using_the_lab(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    module_marks = _module_marks(tree)
    fixtures = {node.name: node for node in tree.body
                if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list)}
    wrong = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        marks = module_marks | _marks(node.decorator_list)
        if "sandbox" not in marks or "lab" in marks:
            continue
        if _uses(node, fixtures) & LAB_NAMES:
            wrong.append("%s::%s" % (path.name, node.name))
    return wrong


def test_no_sandbox_test_uses_the_lab():
    files = sorted((REPO / "tests").rglob("test_*.py"))
    sandboxed = [path for path in files if "mark.sandbox" in path.read_text()]
    assert len(sandboxed) >= 3, sandboxed  # test_pods, test_standins, test_device_cgroup_audit
    assert [wrong for path in sandboxed for wrong in sandbox_tests_using_the_lab(path)] == []


def test_the_check_finds_a_sandbox_test_that_brings_the_lab_up(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import pytest\nfrom tests.labfixtures import running_lab\npytestmark = pytest.mark.sandbox\n\n"
        "@pytest.fixture\ndef lab():\n    with running_lab('healthy') as state:\n        yield state\n\n"
        "@pytest.fixture\ndef nodes(lab):\n    return lab['nodes']\n\n"
        "def test_via_fixture(lab):\n    pass\n\n"
        "def test_via_two_fixtures(nodes):\n    pass\n\n"
        "def test_direct():\n    with running_lab('healthy'):\n        pass\n\n"
        "@pytest.mark.lab\ndef test_marked():\n    with running_lab('healthy'):\n        pass\n\n"
        "def test_clean(tmp_path):\n    pass\n"
    )
    assert sandbox_tests_using_the_lab(probe) == ["test_probe.py::test_via_fixture", "test_probe.py::test_via_two_fixtures",
                                                  "test_probe.py::test_direct"]


def test_make_test_runs_sandbox_beside_the_lab_and_lab_wins():
    makefile = (REPO / "Makefile").read_text()
    checks = next(line for line in makefile.splitlines() if line.startswith("test-checks:"))
    lab = next(line for line in makefile.splitlines() if line.startswith("test-lab:"))
    assert "sandbox" in checks.split() and "sandbox" not in lab.split()
    assert '-m "sandbox and not lab"' in makefile
    assert '-m "not lab and not real and not sandbox"' in makefile
