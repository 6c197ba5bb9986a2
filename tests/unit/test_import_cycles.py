# SPDX-License-Identifier: GPL-3.0-or-later
"""No import cycle between the modules of src/gpuharden (issue 45 item 5).

The graph is every `import gpuharden.X` / `from gpuharden import X` / `from gpuharden.X import ...`, top-level or inside
a function alike: a lazy import only hides a cycle until the day the function runs first.  Each module is also imported
on its own, in a fresh interpreter, so one that only works when another was imported first fails here.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

from tests.unit.conftest import COLLECTIONS

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "src" / "gpuharden"


def import_graph(package=PACKAGE):
    """{module: {gpuharden modules it imports}} for the package's top-level modules."""
    modules = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    graph = {}
    for path in sorted(package.glob("*.py")):
        if path.stem == "__init__":
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "gpuharden" and not node.level:
                imported |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuharden.") and not node.level:
                imported.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("gpuharden.")}
        graph[path.stem] = imported & modules
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (or a module importing itself), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(name):
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in sorted(graph.get(name, ())):
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            if len(component) > 1 or name in graph.get(name, ()):
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def test_cycles_finds_a_cycle_of_two_and_a_longer_one():
    graph = {"drift": {"report_html", "coverage"}, "report_html": {"drift"}, "a": {"b"}, "b": {"c"}, "c": {"a"}, "coverage": set()}
    assert cycles(graph) == [["a", "b", "c"], ["drift", "report_html"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_the_graph_sees_lazy_imports(tmp_path):
    (tmp_path / "one.py").write_text("from gpuharden import two\n")
    (tmp_path / "two.py").write_text("def later():\n    from gpuharden.one import thing\n    return thing\n")
    assert cycles(import_graph(tmp_path)) == [["one", "two"]]


def test_no_import_cycle_in_src_gpuharden():
    graph = import_graph()
    assert "drift" in graph and "report_html" in graph  # the package was read
    assert cycles(graph) == []


@pytest.mark.parametrize("module", sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__"))
def test_each_module_imports_on_its_own(module):
    # with the collection where Ansible finds it (explain_rules imports its module_utils, as explain does once it found it)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(COLLECTIONS), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", "import gpuharden.%s" % module], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
