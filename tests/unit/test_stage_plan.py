# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 1: the stage engine's registry and per-node decision (plugins/module_utils/core/_stage_plan.py).

Each decision has a case where it fires and one where it must not."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _stage_plan as sp


def _audit(**statuses):
    """A node_audit result with these check statuses (every node check ok unless named; mig skipped)."""
    checks = {check: {"status": "ok"} for check in ("device_nodes", "containerd", "kubelet", "cgroup_memory")}
    checks["mig"] = {"status": "skipped"}
    checks.update({name: {"status": status} for name, status in statuses.items()})
    checks = {name: check for name, check in checks.items() if check["status"] is not None}
    return {"checks": checks, "summary": {"node_stages": _node_audit.node_stages(checks)}}


def _actions(plan):
    return {entry["stage"]: entry["action"] for entry in plan["stages"]}


def test_the_registry_is_the_audits_stage_table_in_the_documented_order():
    assert sp.STAGE_NAMES == ("device_permissions", "container_runtime", "runtime_class", "kubelet_topology", "mig",
                              "cgroup_limits", "device_plugin")
    assert tuple((stage.name, stage.check) for stage in sp.STAGES if stage.side == "node") == _node_audit.NODE_STAGES
    assert sp.DRAINING_STAGES == ("kubelet_topology", "mig")
    assert set(sp.STAGE_TAGS) == {"device_permissions", "container_runtime", "cluster", "runtime_class", "kubelet_topology",
                                  "mig", "cgroup_limits", "device_plugin"}


@pytest.mark.parametrize(("tags", "only", "skip", "runs"), [
    (["device_permissions"], ["all"], [], True),
    (["device_permissions"], ["container_runtime"], [], False),
    (["device_permissions"], ["device_permissions"], [], True),
    (["kubelet_topology", "cgroup_limits"], ["cgroup_limits"], [], True),
    (["device_permissions"], ["all"], ["device_permissions"], False),
    (["device_permissions"], ["tagged"], [], True),
    (["device_permissions"], ["all"], ["tagged"], False),
    (["device_permissions"], ["all"], ["all"], False),
    (["always"], ["postcheck"], [], True),
    (["always"], ["all"], ["all"], True),  # --skip-tags all keeps "always"
    (["always"], ["all"], ["always"], False),
    (["never", "mig"], ["all"], [], False),
    (["never", "mig"], ["mig"], [], True),
    (["device_permissions"], [], [], True),
])
def test_tag_selection_follows_ansible(tags, only, skip, runs):
    assert sp.tag_selected(tags, only, skip) is runs


def test_a_compliant_node_runs_no_node_stage_and_the_cluster_stages_stay_with_the_play():
    plan = sp.plan_node(_audit())
    assert _actions(plan) == {"device_permissions": "left_out", "container_runtime": "left_out", "runtime_class": "play",
                              "kubelet_topology": "left_out", "mig": "left_out", "cgroup_limits": "left_out",
                              "device_plugin": "play"}
    assert plan["runs"] == dict.fromkeys(sp.NODE_STAGE_NAMES, False)
    whys = {entry["stage"]: entry["why"] for entry in plan["stages"]}
    assert whys["device_permissions"] == "compliant: its check (device_nodes) is ok"
    assert whys["mig"].startswith("no MIG layout is asked for")


def test_drift_runs_the_stage_in_the_engine_or_the_play():
    plan = sp.plan_node(_audit(device_nodes="drift", containerd="drift", kubelet="error"))
    actions = _actions(plan)
    assert actions["device_permissions"] == "run" and actions["container_runtime"] == "play"
    # a check that could not run runs its stage: the stage decides, as it always did
    assert actions["kubelet_topology"] == "play"
    assert actions["cgroup_limits"] == "left_out"
    whys = {entry["stage"]: entry["why"] for entry in plan["stages"]}
    assert whys["kubelet_topology"].startswith("its check (kubelet) could not run")
    assert "waves" in whys["container_runtime"]
    assert plan["runs"]["device_permissions"] and not plan["runs"]["cgroup_limits"]


def test_a_check_that_was_not_asked_runs_its_stage():
    plan = sp.plan_node(_audit(cgroup_memory=None))
    assert _actions(plan)["cgroup_limits"] == "play"
    assert plan["runs"]["cgroup_limits"] is True


def test_skip_compliant_off_runs_every_stage_and_mig_only_with_a_layout():
    assert sp.plan_node(_audit(), skip_compliant=False)["runs"] == {
        "device_permissions": True, "container_runtime": True, "kubelet_topology": True, "mig": False, "cgroup_limits": True}
    assert sp.plan_node(_audit(mig="ok"), skip_compliant=False)["runs"]["mig"] is True


def test_tags_leave_out_the_other_stages_but_runs_keeps_the_nodes_needs():
    plan = sp.plan_node(_audit(device_nodes="drift", containerd="drift"), only_tags=["container_runtime"])
    actions = _actions(plan)
    assert actions["device_permissions"] == "left_out" and actions["container_runtime"] == "play"
    assert actions["runtime_class"] == "left_out" and actions["device_plugin"] == "left_out"
    # the node still needs it: the rollout's cordon bookkeeping reads runs
    assert plan["runs"]["device_permissions"] is True
    skipped = sp.plan_node(_audit(device_nodes="drift"), skip_tags=["device_permissions"])
    assert _actions(skipped)["device_permissions"] == "left_out"
    assert "--tags/--skip-tags" in skipped["stages"][0]["why"]


def test_the_summary_has_one_line_per_stage_in_order():
    lines = sp.stage_summary(sp.plan_node(_audit(device_nodes="drift")))
    assert [line.split(":")[0] for line in lines] == list(sp.STAGE_NAMES)
    assert lines[0] == "device_permissions: run (its check (device_nodes) is drift)"


def test_gpu_node():
    assert sp.is_gpu_node({"driver_gpus": {"0000:01:00.0": {}}})
    assert sp.is_gpu_node({"gpu_count": 2})
    assert not sp.is_gpu_node({"driver_gpus": {}, "gpu_count": 0})
    assert not sp.is_gpu_node(None)
    assert sp.not_a_gpu_node_message("n1", {"nvml": {"reason": {"code": "library_missing"}}}) == (
        "n1 shows no NVIDIA GPU (no /proc/driver/nvidia/gpus, NVML: library_missing). "
        "Set gpuharden_allow_non_gpu_nodes=true to run anyway.")
    assert "NVML: no GPUs)" in sp.not_a_gpu_node_message("n1", {})


def test_unplanned_draining_steps():
    runs = {"kubelet_topology": True, "mig": True, "device_permissions": True}
    assert sp.unplanned_draining_steps(runs, planned=["kubelet_topology"]) == ["mig"]
    assert sp.unplanned_draining_steps(runs, planned=["kubelet_topology", "mig"]) == []
    assert sp.unplanned_draining_steps({"kubelet_topology": False, "mig": False}, planned=[]) == []


def test_rollout_group_and_batch():
    assert sp.rollout_group(False, "n1", ["n1"]) == "gpuharden_no_rollout"
    assert sp.rollout_group(True, "n1", ["n1"]) == "gpuharden_rollout_first"
    assert sp.rollout_group(True, "n2", ["n1"]) == "gpuharden_rollout_then"
    # an unavailable node of the rollout takes nothing more from the fleet; another one does
    assert sp.rollout_batch(2, unavailable=["n1"], rollout_nodes=["n1", "n2"]) == 2
    assert sp.rollout_batch(2, unavailable=["n9"], rollout_nodes=["n1", "n2"]) == 1
    assert sp.rollout_batch(1, unavailable=["n8", "n9"], rollout_nodes=["n1"]) == 1


def test_runtime_class_needed():
    quiet = {"changed": False, "findings": []}
    assert sp.runtime_class_needed(quiet, [False, False]) is False
    assert sp.runtime_class_needed(quiet, [False, True]) is True
    assert sp.runtime_class_needed({"changed": True, "findings": []}, []) is True
    assert sp.runtime_class_needed({"changed": False, "findings": [{"id": "x"}]}, []) is True
    assert sp.runtime_class_needed({"failed": True, "msg": "403"}, []) is True
    assert sp.runtime_class_needed(None, []) is True


def test_device_plugin_needed():
    clean = {"skip_compliant": True, "dry_runs": [{"clean": True}], "node_runs": [{"mig": False}], "gpu_node_set": [False],
             "driver_gpus": [{"0000:01:00.0": {}}]}
    assert sp.device_plugin_needed(**clean) is False
    for change in ({"skip_compliant": False}, {"dry_runs": [{"clean": False}]}, {"dry_runs": [None]},
                   {"node_runs": [{"mig": True}]}, {"node_runs": [None]}, {"gpu_node_set": [True]}, {"driver_gpus": [None]}):
        assert sp.device_plugin_needed(**dict(clean, **change)) is True, change


# --- node_audit's options from the roles' variables (once Jinja in playbooks/tasks/node_stages.yml) -----------------

ROLES = {"device_permissions_audit_options": {"policy": "restricted"}, "container_runtime_audit_options": {"runtime": "nvidia"},
         "kubelet_topology_audit_options": {"config_path": "/k", "settings": {"cpuManagerPolicy": "static", "featureGates": {"A": True}}},
         "cgroup_limits_audit_kubelet_settings": {"memoryThrottlingFactor": 0.9, "featureGates": {"MemoryQoS": True}},
         "mig_audit_options": {}, "cgroup_limits_audit_options": {"memory_high": "90%"},
         "postcheck_audit_nvml_options": {"expected": 8}, "postcheck_audit_device_cgroup_options": {}}
LIST = {"pod_uids_by_node": {"gpu-a": ["uid-1"]},
        "gpu_operator": {"nodes": {"gpu-a": {"owned": ["device_plugin"]}}, "error": None}}


def test_audit_options_maps_each_role_and_merges_the_kubelet_settings():
    options = sp.audit_options(sp.PLAY_AUDIT_OPTIONS, ROLES, "gpu-a", LIST, ["device_plugin"])
    assert options["device_nodes"] == {"policy": "restricted"} and options["containerd"] == {"runtime": "nvidia"}
    # cgroup_limits' kubelet settings merged at every depth into the kubelet check's, the role's own kept
    assert options["kubelet"] == {"config_path": "/k", "settings": {"cpuManagerPolicy": "static", "memoryThrottlingFactor": 0.9,
                                                                    "featureGates": {"A": True, "MemoryQoS": True}}}
    assert ROLES["kubelet_topology_audit_options"]["settings"] == {"cpuManagerPolicy": "static", "featureGates": {"A": True}}
    assert options["cgroup_memory"] == {"memory_high": "90%", "pod_uids": ["uid-1"]}
    assert options["nvml"] == {"expected": 8}
    # a role that asks for nothing leaves its check out
    assert "mig" not in options and "device_cgroups" not in options
    assert options["gpu_operator"] == {"owned": ["device_plugin"], "takeover": ["device_plugin"], "error": None}
    # only what is asked (bootstrap: the MIG check alone)
    assert sp.audit_options(["mig"], dict(ROLES, mig_audit_options={"config": "all-1g"}), "gpu-a", None, []) == {"mig": {"config": "all-1g"}}


def test_audit_options_without_the_lists_reading():
    # a node the LIST found no pod on: an empty list, the memory check still runs
    assert sp.audit_options(["cgroup_memory"], ROLES, "gpu-b", LIST, [])["cgroup_memory"]["pod_uids"] == []
    # no LIST (skipped: cgroup_limits_immediate false), or one that failed: no memory check, the operator's error named
    for gpu_pods in (None, {"skipped": True, "changed": False}, {"failed": False, "msg": "Unauthorized"}):
        options = sp.audit_options(sp.PLAY_AUDIT_OPTIONS, ROLES, "gpu-a", gpu_pods, [])
        assert "cgroup_memory" not in options
        assert options["gpu_operator"] == {"takeover": [], "error": (gpu_pods or {}).get("msg")}
    # the ClusterPolicy could not be read though the LIST ran: its own error
    reading = {"pod_uids_by_node": {}, "gpu_operator": {"error": "forbidden"}, "msg": "other"}
    assert sp.audit_options(["gpu_operator"], ROLES, "gpu-a", reading, [])["gpu_operator"] == {"takeover": [], "error": "forbidden"}
