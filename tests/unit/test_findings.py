# SPDX-License-Identifier: GPL-3.0-or-later
"""The one findings model: every producer builds its findings with _findings.finding, every id it can emit is in
the catalogue, the catalogue's stages are harden tags, and no other file keeps a severity scale."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _device_audit
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin_config
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings, _stage_plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

from gpuharden import drift_report, severity

REPO = Path(__file__).resolve().parents[2]
PLUGIN_FILES = sorted((REPO / "plugins").rglob("*.py"))
CLI_FILES = sorted((REPO / "src" / "gpuharden").rglob("*.py"))


def _constants(tree):
    return {target.id: node.value.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def _finding_ids(path):
    """(ids given as literals or module constants, other first arguments as source) of every finding(...) call."""
    tree = ast.parse(path.read_text())
    constants = _constants(tree)
    ids, dynamic = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name != "finding":
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant):
                ids.add(first.value)
            elif isinstance(first, ast.Name) and first.id in constants:
                ids.add(constants[first.id])
            else:
                dynamic.add(ast.unparse(first))
    return ids, dynamic


def test_every_literal_finding_id_is_in_the_catalogue():
    ids, dynamic = set(), set()
    for path in PLUGIN_FILES:
        found, unresolved = _finding_ids(path)
        ids |= found
        dynamic |= {(path.name, text) for text in unresolved}
    assert len(ids) > 75  # the scan sees the producers (a broken scan would pass vacuously)
    assert sorted(ids - set(_findings.CATALOGUE)) == []
    # The ids built at run time, each accounted for below.
    assert dynamic == {
        ("_device_audit.py", "fid"),
        ("_device_plugin.py", "refusal['ident']"),
        ("_node_audit.py", "ids[node['action']]"),
        ("_nvml_health.py", "'nvml_%s_gpu_denied' % who"),
    }


def test_the_run_time_ids_are_in_the_catalogue():
    assert set(_device_audit.DEFAULT_SEVERITY) <= set(_findings.CATALOGUE)
    assert set(_device_plugin_config.FINDING_IDS) <= set(_findings.CATALOGUE)
    assert {"device_node_missing", "device_node_wrong_type", "device_node_permissions"} <= set(_findings.CATALOGUE)
    assert not [ident for ident in _findings.CATALOGUE if ident.endswith("_check_failed")]  # could not check is no finding
    assert {"nvml_root_gpu_denied", "nvml_unprivileged_gpu_denied"} <= set(_findings.CATALOGUE)


def test_no_finding_is_built_as_a_dict_literal():
    """One constructor: a dict literal with an id and a severity would bypass the catalogue."""
    literals = []
    for path in PLUGIN_FILES:
        if path.name == "_findings.py":  # the constructor itself
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = {key.value for key in node.keys if isinstance(key, ast.Constant)}
                if {"id", "severity"} <= keys:
                    literals.append("%s:%d" % (path.relative_to(REPO), node.lineno))
    assert literals == []


def test_one_severity_scale():
    """Only core/_vocabulary.py defines the scale; the CLI's gpuharden.vocabulary is that very file (a link: the CLI
    reads reports without the collection), so no copy is left to pin (issue 45 item 3)."""
    owners = []
    for path in PLUGIN_FILES + CLI_FILES:
        if path.is_symlink():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SEVERITIES" for t in node.targets):
                owners.append(path.relative_to(REPO).as_posix())
    assert owners == ["plugins/module_utils/core/_vocabulary.py"]
    assert (REPO / "src/gpuharden/vocabulary.py").resolve() == (REPO / "plugins/module_utils/core/_vocabulary.py").resolve()
    assert severity.SEVERITIES == _findings.SEVERITIES


def test_drifts_own_runtime_class_findings_match_the_catalogue():
    for ident, fields in (("runtime_class_differs", drift_report.RUNTIME_CLASS_DIFFERS),):
        check, stage, remediable = _findings.CATALOGUE[ident]
        assert fields == {"check": check, "stage": stage, "remediable": remediable == _findings.ALWAYS}


def test_node_audit_checks_are_the_catalogues():
    assert _node_audit.CHECK_NAMES == _findings.AUDIT_CHECKS


def _harden_tags():
    tags = set()

    def walk(tasks, directory):
        for task in tasks or []:
            tags.update(task.get("tags") or [])
            if "gpuharden.k8s.node_stages" in task:  # the stage engine selects its own stages by the run's tags
                tags.update(tag for stage in _stage_plan.STAGES if stage.engine for tag in stage.tags)
            walk(task.get("block"), directory)
            imported = task.get("ansible.builtin.import_tasks") or task.get("ansible.builtin.include_tasks")
            imported = imported.get("file") if isinstance(imported, dict) else imported
            if imported:  # the stages (tasks/stages.yml, its tasks/stage_device_plugin.yml), the plan
                # Ansible looks next to the importing file first, then in the playbook's directory
                path = directory / imported if (directory / imported).exists() else REPO / "playbooks" / imported
                walk(yaml.safe_load(path.read_text()), path.parent)

    for play in yaml.safe_load((REPO / "playbooks" / "harden_gpu_nodes.yml").read_text()):
        walk(play.get("tasks"), REPO / "playbooks")
    return tags


def test_every_stage_in_the_catalogue_is_a_harden_tag():
    stages = {stage for _check, stage, _remediable in _findings.CATALOGUE.values()} - {None, "postcheck"}
    assert stages and sorted(stages - _harden_tags()) == []


def test_the_finding_shape():
    entry = _findings.finding("pcie_link_degraded", "warning", {"gen": 5}, {"gen": 3}, "reseat the card", node="gpu-1", gpu=0, pod=None)
    assert entry == {"id": "pcie_link_degraded", "check": "nvml", "stage": "postcheck", "severity": "warning",
                     "expected": {"gen": 5}, "found": {"gen": 3}, "hint": "reseat the card", "remediable": False,
                     "node": "gpu-1", "gpu": 0, "pod": None}


def test_remediability_comes_from_the_catalogue_and_the_plan():
    assert _findings.finding("containerd_nvidia_runtime", "error", 1, 2)["remediable"] is True
    assert _findings.finding("containerd_nvidia_runtime", "error", 1, 2, planned=False)["remediable"] is True
    assert _findings.finding("gpu_access", "info", 1, 2, planned=True)["remediable"] is False
    assert _findings.finding("mig_layout_drift", "warning", 1, 2, planned=True)["remediable"] is True
    assert _findings.finding("mig_layout_drift", "warning", 1, 2, planned=False)["remediable"] is False
    assert _findings.finding("mig_layout_drift", "warning", 1, 2)["remediable"] is False


def test_kubelet_settings_belong_to_the_stage_that_owns_the_field():
    assert _findings.finding("kubelet_setting", "error", 1, 2, subject="memoryThrottlingFactor")["stage"] == "cgroup_limits"
    assert _findings.finding("kubelet_setting", "error", 1, 2, subject="featureGates.MemoryQoS")["stage"] == "cgroup_limits"
    assert _findings.finding("kubelet_setting", "error", 1, 2, subject="cpuManagerPolicy")["stage"] == "kubelet_topology"


@pytest.mark.parametrize("ident, severity", [("no_such_finding", "error"), ("gpu_access", "loud")])
def test_an_unknown_id_or_severity_is_an_error_naming_it(ident, severity):
    with pytest.raises(GpuhardenError, match=ident if ident == "no_such_finding" else "loud"):
        _findings.finding(ident, severity, None, None)


def test_severity_helpers():
    findings = [{"severity": "warning"}, {"severity": "critical"}, {"severity": "info"}]
    assert _findings.max_severity(findings) == "critical" and _findings.max_severity([]) is None
    assert [entry["severity"] for entry in _findings.at_or_above(findings, "warning")] == ["warning", "critical"]
    assert _findings.at_or_above(findings, "never") == []
    assert _findings.should_fail(findings, "critical") and not _findings.should_fail([{"severity": "info"}], "warning")
    assert _findings.by_severity(findings) == {"warning": 1, "critical": 1, "info": 1}


@pytest.mark.parametrize("producer", ["_nvml_health.py", "_consistency.py", "_topology.py"])
def test_per_node_findings_always_say_node_gpu_and_pod(producer):
    """nvml_check, gpu_consistency and topology_check document node, gpu and pod on every finding (None: none);
    the post-check role and gpu_consistency's callers select on them."""
    [path] = [path for path in PLUGIN_FILES if path.name == producer]
    calls = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "finding"]
    assert calls
    assert [node.lineno for node in calls if not {"node", "gpu", "pod"} <= {kw.arg for kw in node.keywords}] == []
