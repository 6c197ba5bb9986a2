# SPDX-License-Identifier: GPL-3.0-or-later
"""The one resource table (plugins/module_utils/k8s/_resources.py): the paths it builds are the API server's, and no API
path, apiVersion or RBAC resource name is spelled anywhere else in plugins/ or src/."""

from __future__ import annotations

import ast
import pathlib

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s_access, _resources

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE = REPO_ROOT / "plugins" / "module_utils" / "k8s" / "_resources.py"
# "file: spelling" where a spelling outside the table is right: none.
ALLOWED = set()


@pytest.mark.parametrize(("kind", "options", "expected"), [
    # as k8s.io/apiserver v0.36.3 pkg/endpoints/installer.go routes them: core under /api/v1, groups under /apis/G/V
    ("Node", {}, ("/api/v1/nodes",)),
    ("Node", {"named": True}, ("/api/v1/nodes/{name}", "name")),
    ("Pod", {"all_namespaces": True}, ("/api/v1/pods",)),
    ("Pod", {}, ("/api/v1/namespaces/{namespace}/pods", "namespace")),
    ("Pod", {"named": True}, ("/api/v1/namespaces/{namespace}/pods/{name}", "name", "namespace")),
    ("Eviction", {}, ("/api/v1/namespaces/{namespace}/pods/{name}/eviction", "name", "namespace")),
    ("TokenRequest", {}, ("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", "name", "namespace")),
    ("DaemonSet", {"named": True}, ("/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}", "name", "namespace")),
    ("PodDisruptionBudget", {"all_namespaces": True}, ("/apis/policy/v1/poddisruptionbudgets",)),
    ("RuntimeClass", {"named": True}, ("/apis/node.k8s.io/v1/runtimeclasses/{name}", "name")),
    ("RuntimeClass", {"all_namespaces": True}, ("/apis/node.k8s.io/v1/runtimeclasses",)),  # cluster-scoped: no namespace either way
    ("ClusterPolicy", {}, ("/apis/nvidia.com/v1/clusterpolicies",)),
    ("CronJob", {"all_namespaces": True}, ("/apis/batch/v1/cronjobs",)),
])
def test_template_is_the_api_servers_route(kind, options, expected):
    assert _resources.template(kind, **options) == expected


def test_path_quotes_names_and_lists_across_namespaces_without_one():
    assert _resources.path("Pod", "p 1", "ml") == "/api/v1/namespaces/ml/pods/p%201"
    assert _resources.path("Pod") == "/api/v1/pods"
    assert _resources.path("Event", namespace="ml") == "/api/v1/namespaces/ml/events"
    assert _resources.path("Node", "gpu/0") == "/api/v1/nodes/gpu%2F0"


def test_api_versions_and_rbac_names():
    assert [_resources.api_version(kind) for kind in ("Node", "DaemonSet", "RuntimeClass", "Eviction", "TokenRequest")] == [
        "v1", "apps/v1", "node.k8s.io/v1", "policy/v1", "authentication.k8s.io/v1"]
    # a subresource is named in RBAC under its parent's group: pods/eviction in the core group, as before the table
    assert _resources.rbac("Eviction") == ("pods/eviction", "") and _resources.rbac("PodDisruptionBudget") == ("poddisruptionbudgets", "policy")
    target = _k8s_access.Target.of("create", "Eviction", "ml", "p")
    assert target.as_dict() == {"verb": "create", "resource": "pods/eviction", "group": "", "namespace": "ml", "name": "p"}
    with pytest.raises(KeyError):
        _resources.template("Widget")


def _spellings():
    """(value, what) of every spelling the table owns, and the kinds' plurals (as RBAC resource names)."""
    paths = ("/api/", "/apis/")
    versions = {_resources.api_version(kind) for kind in _resources.RESOURCES} - {"v1"}  # bare "v1" is too common to own
    plurals = {entry.plural for entry in _resources.RESOURCES.values()}
    return paths, versions, plurals


def _docstrings(tree):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def offences(path, label):
    """Where ``path`` spells what the table owns: a string constant (not a docstring: prose may name a path) that is an
    API path or a group's apiVersion, and any ``Target(...)`` built from a resource name instead of ``Target.of``."""
    paths, versions, plurals = _spellings()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        owned = isinstance(node, ast.Constant) and isinstance(node.value, str) and (node.value.startswith(paths) or node.value in versions)
        if owned and id(node) not in docstrings:
            found.append("%s:%d: %r" % (label, node.lineno, node.value))
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            literal = [arg.value for arg in node.args[:3] if isinstance(arg, ast.Constant) and arg.value in plurals]
            if name == "Target" and literal:
                found.append("%s:%d: Target(%r...)" % (label, node.lineno, literal[0]))
    return found


def test_no_api_path_is_spelled_outside_the_table():
    found = []
    for root in ("plugins", "src"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            if path != TABLE:
                label = str(path.relative_to(REPO_ROOT))
                found.extend(item for item in offences(path, label) if item.split(":", 1)[0] + ":" + item.split(": ", 1)[1] not in ALLOWED)
    assert found == [], "spelled outside plugins/module_utils/k8s/_resources.py (use _resources.template/path/api_version, Target.of):\n" + "\n".join(found)


def test_the_scan_finds_a_spelling(tmp_path):
    """The scan is not blind: each kind of spelling it forbids is found in a file that has it."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""Prose may say /api/v1/nodes."""\n'
                      'PATH = "/apis/apps/v1/daemonsets"\n'
                      'BODY = {"apiVersion": "policy/v1"}\n'
                      'T = Target("list", "nodes")\n'
                      'U = Target.of("list", "Node")\n', encoding="utf-8")
    assert sorted(offences(sample, "sample.py")) == ["sample.py:2: '/apis/apps/v1/daemonsets'", "sample.py:3: 'policy/v1'", "sample.py:4: Target('nodes'...)"]
