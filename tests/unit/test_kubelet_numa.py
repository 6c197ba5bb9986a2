# SPDX-License-Identifier: GPL-3.0-or-later
"""The kubelet's own limits on the Topology Manager, before any write: policy options it refuses, and a node with more
NUMA nodes than max-allowable-numa-nodes (kubernetes v1.36.3 pkg/kubelet/cm/topologymanager/policy_options.go and
topology_manager.go; the NUMA nodes counted as its cadvisor v0.56.2 counts them, utils/sysinfo/sysinfo.go)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _kubelet
from gpuharden_lab.noderoot import build_node_root

from tests.unit.conftest import run_module, tree_snapshot
from tests.unit.test_role_preflight import ENV

FIXTURES = Path(__file__).parent / "fixtures" / "kubelet"
CONFIG = "/var/lib/kubelet/config.yaml"
POLICY = {"topology_manager_policy": "single-numa-node"}
NODE_DIR = "sys/devices/system/node"


def kubelet_node(world_tmp, flavor="kubeadm", numa=None, cpu_nodes=(0,), distance=True):
    """A kubelet fixture node whose sysfs has ``numa`` NUMA nodes (CPU-less but those in ``cpu_nodes``); None: none."""
    root = world_tmp / flavor
    shutil.copytree(FIXTURES / flavor, root)
    shutil.rmtree(root / NODE_DIR)
    for node in range(numa or 0):
        directory = root / NODE_DIR / ("node%d" % node)
        directory.mkdir(parents=True)
        if node in cpu_nodes:
            (directory / ("cpu%d" % node)).mkdir()
        if distance:
            (directory / "distance").write_text(" ".join("10" if other == node else "20" for other in range(numa)) + "\n")
    return root


def plan(root, **params):
    return _kubelet.plan(_kubelet.NodeReader(str(root)), params)


def applied(root, result):
    for change in result["changes"]:
        target = Path(str(root) + change.node_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(change.after)


def config_value(root, *path):
    view = _kubelet.discover(_kubelet.NodeReader(str(root)))
    return _kubelet.effective(view, path)["value"]


# --------------------------------------------------------------------------------------------
# what the kubelet accepts as topologyManagerPolicyOptions


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("max-allowable-numa-nodes", 8, "8"),
    ("max-allowable-numa-nodes", "34", "34"),
    ("max-allowable-numa-nodes", "+10", "10"),  # strconv.Atoi takes a sign
    ("max-allowable-numa-nodes", "08", "8"),
    ("prefer-closest-numa-nodes", True, "true"),
    ("prefer-closest-numa-nodes", "T", "true"),  # strconv.ParseBool's other spellings
    ("prefer-closest-numa-nodes", "0", "false"),
    ("prefer-closest-numa-nodes", "FALSE", "false"),
])
def test_option_values_the_kubelet_accepts_are_written_in_canonical_form(name, value, expected):
    assert _kubelet.topology_option_value(name, value) == (expected, None)


@pytest.mark.parametrize(("name", "value", "why"), [
    ("max-allowable-numa-nodes", 4, "refuses a value below 8"),
    ("max-allowable-numa-nodes", "7", "refuses a value below 8"),
    ("max-allowable-numa-nodes", -9, "refuses a value below 8"),
    ("max-allowable-numa-nodes", "٩", "must be an integer"),  # a Unicode digit: Python's isdigit, not Go's Atoi
    ("max-allowable-numa-nodes", " 9", "must be an integer"),
    ("max-allowable-numa-nodes", True, "must be an integer"),
    ("max-allowable-numa-nodes", 9.0, "must be an integer"),
    ("prefer-closest-numa-nodes", "yes", "strconv.ParseBool"),
    ("prefer-closest-numa-nodes", "tRUE", "strconv.ParseBool"),
    ("prefer-far-numa-nodes", "true", "unknown topology manager policy option"),
])
def test_option_values_the_kubelet_refuses_are_refused(name, value, why):
    text, problem = _kubelet.topology_option_value(name, value)
    assert text is None and why in problem


# --------------------------------------------------------------------------------------------
# counting the NUMA nodes as cadvisor does


def test_numa_nodes_are_the_node_directories_cpu_less_ones_included_not_online_or_possible(world_tmp):
    root = kubelet_node(world_tmp, numa=10)
    top = root / NODE_DIR
    # the kernel's lists are not what cadvisor counts
    for name, text in (("online", "0-63\n"), ("possible", "0-255\n"), ("has_cpu", "0\n")):
        (top / name).write_text(text)
    (top / "node10x").mkdir()  # not node<N>
    found = _kubelet.numa_topology(_kubelet.NodeReader(str(root)))
    assert found["nodes"] == list(range(10))
    assert found["cpu_less"] == list(range(1, 10))
    assert found["without_distance"] == []
    assert found["source"] == "/sys/devices/system/node/node*"


def test_without_node_directories_cadvisor_counts_the_cpu_packages(world_tmp):
    root = kubelet_node(world_tmp, numa=None)
    for cpu, package in ((0, 0), (1, 0), (2, 1)):
        (root / ("sys/devices/system/cpu/cpu%d/topology" % cpu)).mkdir(parents=True)
        (root / ("sys/devices/system/cpu/cpu%d/topology/physical_package_id" % cpu)).write_text("%d\n" % package)
    found = _kubelet.numa_topology(_kubelet.NodeReader(str(root)))
    assert found["nodes"] == [0, 1] and found["without_distance"] == [0, 1]
    shutil.rmtree(root / "sys")
    assert _kubelet.numa_topology(_kubelet.NodeReader(str(root))) is None


def test_the_lab_lays_out_grace_systems_as_the_fixtures_declare(world_tmp):
    """The lab's node roots (and, bound over /sys/devices/system/node, what the lab's real kubelet reads): GH200 one
    Grace CPU node and 9 CPU-less ones (its GPU's memory, and the memory-only nodes kept for MIG); GB200 NVL two Grace
    nodes and 32 CPU-less ones, four of them holding a GPU's memory."""
    for fixture, count, cpu_nodes, memory_nodes in (("gh200", 10, [0], [1]), ("gb200-nvl", 34, [0, 1], [2, 10, 18, 26])):
        root = build_node_root(world_tmp / fixture, fixture).root
        found = _kubelet.numa_topology(_kubelet.NodeReader(str(root)))
        assert found["nodes"] == list(range(count)), fixture
        with_cpus = sorted(set(found["nodes"]) - set(found["cpu_less"]))
        # the host's CPUs go to the CPU nodes in runs: a 1-CPU host leaves the second Grace node without one
        assert with_cpus and set(with_cpus) <= set(cpu_nodes), (fixture, with_cpus)
        holding = [node for node in found["nodes"] if "MemTotal:       0 kB" not in (root / NODE_DIR / ("node%d" % node) / "meminfo").read_text()]
        assert set(memory_nodes) <= set(holding) and set(holding) <= set(cpu_nodes + memory_nodes), (fixture, holding)
        assert found["without_distance"] == []


def test_a_scenario_node_may_declare_its_own_numa_nodes(world_tmp):
    root = build_node_root(world_tmp / "l4", "l4", numa={"nodes": 12, "cpu_nodes": [0, 1]}).root
    assert _kubelet.numa_topology(_kubelet.NodeReader(str(root)))["nodes"] == list(range(12))
    assert not (build_node_root(world_tmp / "plain", "l4").root / NODE_DIR).exists()  # no declaration: the host's
    with pytest.raises(ValueError, match="below nodes=4"):
        build_node_root(world_tmp / "bad", "l4", numa={"nodes": 4, "cpu_nodes": [0], "gpu_memory_nodes": [4]})


# --------------------------------------------------------------------------------------------
# the plan over the limit


def test_over_the_limit_the_option_is_raised_to_the_count_and_said(world_tmp):
    root = kubelet_node(world_tmp, numa=34, cpu_nodes=(0, 1))
    result = plan(root, **POLICY)
    report = result["numa_limit"]
    assert (report["action"], report["nodes"], report["cpu_less_nodes"], report["limit_before"], report["limit_after"]) == \
        ("raised", 34, 32, 8, 34)
    assert "logs a warning" in report["warning"] and "34 NUMA nodes" in report["warning"]
    assert result["sources"]["topologyManagerPolicyOptions.max-allowable-numa-nodes"]["after"] == "34"
    [change] = [change for change in result["changes"] if change.changed]
    assert change.node_path == CONFIG and "max-allowable-numa-nodes=34" in change.reason
    assert result["refused"] == []
    applied(root, result)
    assert config_value(root, "topologyManagerPolicyOptions", "max-allowable-numa-nodes") == "34"
    again = plan(root, **POLICY)
    assert [change for change in again["changes"] if change.changed] == []
    assert again["numa_limit"]["action"] == "within_limit" and again["numa_limit"]["limit_before"] == 34


@pytest.mark.parametrize(("count", "action"), [(8, "within_limit"), (9, "raised")])
def test_the_limit_is_more_than_eight(world_tmp, count, action):
    result = plan(kubelet_node(world_tmp, numa=count), **POLICY)
    assert result["numa_limit"]["action"] == action


def test_policy_none_needs_no_limit_the_kubelet_does_not_count_then(world_tmp):
    result = plan(kubelet_node(world_tmp, numa=34), topology_manager_policy="none")
    assert result["numa_limit"]["action"] == "policy_none"
    assert "topologyManagerPolicyOptions.max-allowable-numa-nodes" not in result["sources"]


def test_keep_policy_leaves_the_policy_and_refuses_with_the_fix(world_tmp):
    root = kubelet_node(world_tmp, numa=34)
    result = plan(root, numa_over_limit="keep_policy", **POLICY)
    assert result["numa_limit"]["action"] == "kept"
    assert [change for change in result["changes"] if change.changed] == []
    assert "topologyManagerPolicy" not in result["sources"]
    [refused] = result["refused"]
    assert refused["what"].startswith("topologyManagerPolicy single-numa-node on 34 NUMA nodes")
    assert "numa_over_limit=keep_policy" in refused["why"] and "numa_over_limit=raise" in refused["fix"]


def test_keep_policy_still_manages_the_other_fields(world_tmp):
    root = kubelet_node(world_tmp, numa=34)
    result = plan(root, numa_over_limit="keep_policy", topology_manager_scope="pod", **POLICY)
    assert result["sources"]["topologyManagerScope"]["after"] == "pod"
    assert "topologyManagerPolicy" not in result["sources"]


@pytest.mark.parametrize("params", [
    # the Memory Manager's hints span every subset of all NUMA nodes
    dict(memory_manager_policy="Static", reserved_memory=[{"numaNode": 0, "limits": {"memory": "100Mi"}}]),
], ids=["memory-manager-static"])
def test_raising_is_refused_where_it_is_not_safe(world_tmp, params):
    root = kubelet_node(world_tmp, numa=34)
    result = plan(root, **dict(POLICY, **params))
    assert result["numa_limit"]["action"] == "kept"
    [refused] = result["refused"]
    assert "memoryManagerPolicy Static" in refused["why"] and "max-allowable-numa-nodes=34" in refused["fix"]
    assert "topologyManagerPolicyOptions.max-allowable-numa-nodes" not in result["sources"]


def test_numa_node_ids_beyond_the_kubelet_s_64_bit_masks_keep_the_policy(world_tmp):
    root = kubelet_node(world_tmp, numa=9)
    (root / NODE_DIR / "node8").rename(root / NODE_DIR / "node64")
    result = plan(root, **POLICY)
    assert result["numa_limit"]["action"] == "kept"
    assert "bitmask.go" in result["refused"][0]["why"]


def test_an_explicit_limit_below_the_count_is_refused(world_tmp):
    root = kubelet_node(world_tmp, numa=34)
    with pytest.raises(GpuhardenError, match=r"max-allowable-numa-nodes=9 is below this node's 34 NUMA nodes.*nothing written"):
        plan(root, topology_manager_policy_options={"max-allowable-numa-nodes": 9}, **POLICY)
    result = plan(root, topology_manager_policy_options={"max-allowable-numa-nodes": 40}, **POLICY)
    assert result["numa_limit"]["action"] == "within_limit" and result["numa_limit"]["limit_after"] == 40


def test_a_limit_the_node_s_files_already_hold_is_kept(world_tmp):
    root = kubelet_node(world_tmp, numa=12)
    config = Path(str(root) + CONFIG)
    config.write_text(config.read_text() + "topologyManagerPolicyOptions:\n  max-allowable-numa-nodes: \"16\"\n")
    result = plan(root, **POLICY)
    assert result["numa_limit"]["action"] == "within_limit" and result["numa_limit"]["limit_before"] == 16


def test_an_option_the_node_s_files_hold_that_the_kubelet_refuses_is_named(world_tmp):
    root = kubelet_node(world_tmp, numa=2)
    config = Path(str(root) + CONFIG)
    config.write_text(config.read_text() + "topologyManagerPolicyOptions:\n  max-allowable-numa-nodes: \"4\"\n")
    with pytest.raises(GpuhardenError, match=r"max-allowable-numa-nodes=\"4\" \(/var/lib/kubelet/config.yaml\): .*below 8"):
        plan(root, **POLICY)
    # under policy none the kubelet never reads the options (topology_manager.go NewManager returns first)
    assert plan(root, topology_manager_policy="none")["numa_limit"]["action"] == "policy_none"


def test_the_locked_policy_options_gate_cannot_be_turned_off(world_tmp):
    root = kubelet_node(world_tmp, numa=2)
    with pytest.raises(GpuhardenError, match=r"settings.featureGates.TopologyManagerPolicyOptions=false: .*locked to true"):
        plan(root, settings={"featureGates": {"TopologyManagerPolicyOptions": False}}, topology_manager_policy="none")
    assert plan(root, settings={"featureGates": {"TopologyManagerPolicyOptions": True}}, **POLICY)["changes"]


def test_prefer_closest_needs_every_node_s_distances(world_tmp):
    root = kubelet_node(world_tmp, numa=2, distance=False)
    with pytest.raises(GpuhardenError, match=r"NUMA node\(s\) 0,1 have no distance file"):
        plan(root, topology_manager_policy_options={"prefer-closest-numa-nodes": "true"}, **POLICY)
    assert plan(root, topology_manager_policy_options={"prefer-closest-numa-nodes": "false"}, **POLICY)["changes"]


def test_without_sysfs_the_count_is_unknown_and_said(world_tmp):
    root = kubelet_node(world_tmp, numa=None)
    result = plan(root, **POLICY)
    assert result["numa_limit"]["action"] == "unknown" and result["numa_limit"]["nodes"] is None
    assert "could not count this node's NUMA nodes" in result["numa_limit"]["warning"]


def test_k3s_before_1_32_raises_it_as_a_kubelet_arg(world_tmp):
    root = kubelet_node(world_tmp, flavor="k3s", numa=10)
    result = plan(root, distribution_version="v1.31.4+k3s1", **POLICY)
    assert result["kubelet_args_only"] and result["numa_limit"]["action"] == "raised"
    after = "".join(change.after or "" for change in result["changes"] if change.changed)
    assert "topology-manager-policy-options=max-allowable-numa-nodes=10" in after


# --------------------------------------------------------------------------------------------
# through the modules' entry points


def test_module_refuses_max_allowable_numa_nodes_4_before_any_write(world_tmp):
    """Done when: `max-allowable-numa-nodes=4` is refused before any write (issue 43, item 3)."""
    root = kubelet_node(world_tmp, numa=34)
    before = tree_snapshot(root)
    result = run_module("kubelet_config", dict(POLICY, root=str(root), topology_manager_policy_options={"max-allowable-numa-nodes": 4},
                                               backup=True), {})
    assert result.get("failed") is True
    assert result["msg"] == ('option topology_manager_policy_options={"max-allowable-numa-nodes": 4}: max-allowable-numa-nodes=4: '
                             "the kubelet refuses a value below 8 and does not start (kubernetes v1.36.3 "
                             "pkg/kubelet/cm/topologymanager/policy_options.go)")
    assert "\n" not in result["msg"]
    assert tree_snapshot(root) == before


def test_module_raises_the_limit_and_warns(world_tmp):
    root = kubelet_node(world_tmp, numa=34)
    result = run_module("kubelet_config", dict(POLICY, root=str(root), _ansible_diff=True), {})
    assert result["changed"] and result["numa_limit"]["action"] == "raised"
    assert "max-allowable-numa-nodes is set to 34" in str(result["warnings"])  # structured warning events in ansible-core 2.19
    assert "max-allowable-numa-nodes: '34'" in Path(str(root) + CONFIG).read_text()
    kept = run_module("kubelet_config", dict(POLICY, root=str(kubelet_node(world_tmp / "2", numa=34)), numa_over_limit="keep_policy"), {})
    assert not kept["changed"] and kept["refused"] and "not written: topologyManagerPolicy single-numa-node" in str(kept["warnings"])


def _node_audit(root, **kubelet):
    result = run_module("node_audit", {"root": str(root), "_ansible_check_mode": True, "kubelet": kubelet}, {})
    assert not result.get("failed"), result
    return result


def test_node_audit_reports_the_raise_the_refusal_and_a_blind_count(world_tmp):
    raised = _node_audit(kubelet_node(world_tmp / "raise", numa=34), **POLICY)
    finding = next(entry for entry in raised["findings"] if entry.get("subject") == "topologyManagerPolicyOptions.max-allowable-numa-nodes")
    assert finding["id"] == "kubelet_setting" and "34 NUMA nodes" in finding["hint"], finding
    assert raised["checks"]["kubelet"]["details"]["numa_limit"]["action"] == "raised"

    kept = _node_audit(kubelet_node(world_tmp / "keep", numa=34), numa_over_limit="keep_policy", **POLICY)
    assert kept["checks"]["kubelet"]["refused"][0]["what"].startswith("topologyManagerPolicy single-numa-node on 34")
    assert kept["summary"]["refused"] == ["kubelet"]
    assert not [entry for entry in kept["findings"] if entry.get("subject") == "topologyManagerPolicy"]

    blind = _node_audit(kubelet_node(world_tmp / "blind", numa=None), **POLICY)
    [entry] = blind["checks"]["kubelet"]["not_checked"]
    assert "could not count" in entry["cause"] and entry["fix"]
    assert blind["summary"]["not_checked"] == ["kubelet"]
    assert blind["checks"]["kubelet"]["status"] == "drift"  # the rest of the check ran


# --------------------------------------------------------------------------------------------
# the role's own check, on the controller (roles/kubelet_topology/tasks/preflight.yml)


ROLE_OPTIONS = {
    "defaults": ({}, None),
    "max 4": ({"max-allowable-numa-nodes": 4}, "below 8 the kubelet does not start"),
    "max 7 as text": ({"max-allowable-numa-nodes": "7"}, "at least 8"),
    "max not a number": ({"max-allowable-numa-nodes": "eight"}, "an integer"),
    "max true": ({"max-allowable-numa-nodes": True}, "an integer"),
    "unknown option": ({"prefer-far-numa-nodes": "true"}, "prefer-closest-numa-nodes and max-allowable-numa-nodes only"),
    "prefer yes": ({"prefer-closest-numa-nodes": "yes"}, "true or false"),
    "both good": ({"max-allowable-numa-nodes": "34", "prefer-closest-numa-nodes": True}, None),
}


def test_the_role_refuses_policy_options_the_kubelet_refuses_before_its_plan(world_tmp):
    record = "{{ outcome | to_json }}"
    plays = [{
        "hosts": "localhost", "gather_facts": False,
        "vars": {"kubelet_topology_topology_manager_policy_options": options},
        "tasks": [{"block": [{"ansible.builtin.include_role": {"name": "gpuharden.k8s.kubelet_topology", "tasks_from": "preflight"}},
                             {"ansible.builtin.set_fact": {"outcome": None}}],
                   "rescue": [{"ansible.builtin.set_fact": {"outcome": "{{ ansible_failed_result.msg }}"}}]},
                  {"ansible.builtin.copy": {"dest": str(world_tmp / ("%d.json" % index)), "content": record}}],
    } for index, (options, _expected) in enumerate(ROLE_OPTIONS.values())]
    (world_tmp / "pb.yml").write_text(yaml.safe_dump(plays))
    run = ansible_runner.run(private_data_dir=str(world_tmp), playbook=str(world_tmp / "pb.yml"), envvars=ENV, quiet=True,
                             inventory="localhost ansible_connection=local ansible_python_interpreter=%s" % sys.executable)
    assert run.rc == 0, run.stdout.read()[-3000:]
    for index, (case, (_options, expected)) in enumerate(ROLE_OPTIONS.items()):
        message = json.loads((world_tmp / ("%d.json" % index)).read_text())
        if expected is None:
            assert message is None, (case, message)
        else:
            assert message and expected in message and "kubelet_topology_topology_manager_policy_options=" in message, (case, message)
