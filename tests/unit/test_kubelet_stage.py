# SPDX-License-Identifier: GPL-3.0-or-later
"""The kubelet stage's decisions in Python (issue 45): module_utils/cluster/_kubelet_stage.py and the pure functions of
the action gpuharden.k8s.kubelet_topology_plan, which roles/kubelet_topology/tasks/plan.yml and admission.yml call.

What the role decided in Jinja before: whether the change is disruptive (drain, stop, checkpoints), whether the
Topology Manager policy tightens (the admission check), which workloads keep a node on its policy, the line it prints,
the statistics it records, and the plan again without the manager fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.action import kubelet_topology_plan as action
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _kubelet_stage, _topology
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _settings
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

REPO = Path(__file__).resolve().parents[2]
DGX = [{"index": i, "numa_node": 0 if i < 4 else 1} for i in range(8)]
OPTIONS = {"topology_manager_policy": "single-numa-node", "cpu_manager_policy": "static", "reserved_system_cpus": "0-1",
           "settings": {"memoryThrottlingFactor": 0.9}, "service": "kubelet", "backup": True}


def _plan(before="none", after="single-numa-node", cpu=True, memory=False, stale=(), changed=True, restart=True):
    return {"service": "kubelet", "changed": changed, "restart_required": restart, "cpu_manager_policy_changed": cpu,
            "memory_manager_policy_changed": memory, "stale_state_files": list(stale),
            "sources": {"topologyManagerPolicy": {"before": before, "after": after}, "topologyManagerScope": {"before": None, "after": None}}}


def _workload(name, gpus, namespace="ml"):
    return {"kind": "Deployment", "namespace": namespace, "name": name, "containers": [{"name": "main", "gpus": gpus}]}


@pytest.mark.parametrize(("plan", "disruptive", "restart"), [
    (_plan(), True, "always"),  # CPU Manager policy change: drain, stop, remove the checkpoint
    (_plan(cpu=False, memory=True), True, "always"),
    (_plan(cpu=False, stale=["/var/lib/kubelet/cpu_manager_state"]), True, "always"),
    (_plan(cpu=False), False, "if_required"),  # a Topology Manager change alone: a restart
    (_plan(cpu=False, changed=False, restart=False), False, "if_required"),
])
def test_what_a_plan_means_for_the_run(plan, disruptive, restart):
    decided = _kubelet_stage.stage(plan)
    assert decided["disruptive"] is disruptive and decided["restart"] == restart and decided["service"] == "kubelet"
    assert decided["changes"] is bool(plan["changed"] or plan["restart_required"])


def test_the_admission_check_runs_only_where_the_policy_tightens_and_when_asked():
    assert _kubelet_stage.stage(_plan())["switch"] == {"policy": "single-numa-node", "scope": "container"}
    assert _kubelet_stage.stage(_plan(), admission_check=False)["switch"] is None
    assert _kubelet_stage.stage(_plan("single-numa-node", "single-numa-node", cpu=False))["switch"] is None
    assert _kubelet_stage.stage(_plan("none", "best-effort"))["switch"] is None


def test_a_plan_without_its_keys_is_refused_by_name():
    with pytest.raises(GpuhardenError, match="lacks stale_state_files"):
        _kubelet_stage.stage({key: value for key, value in _plan().items() if key != "stale_state_files"})


def test_without_managers_keeps_every_other_field():
    assert _kubelet_stage.without_managers(OPTIONS) == {"settings": {"memoryThrottlingFactor": 0.9}, "service": "kubelet", "backup": True}


def test_a_workload_the_node_could_no_longer_admit_keeps_its_policy_with_the_line_the_run_prints():
    switch = {"policy": "single-numa-node", "scope": "container"}
    listed = {"workloads": [_workload("train-8g", 8), _workload("infer", 1)], "nodes": {"dgx-1": {"labels": {}, "taints": []}}}
    verdict = _kubelet_stage.admission(switch, "dgx-1", DGX, listed, False)
    assert verdict["managers"] is False and verdict["kept"]["workloads"] == [{"kind": "Deployment", "namespace": "ml", "name": "train-8g"}]
    assert [entry["workload"]["name"] for entry in verdict["blocked"]] == ["train-8g"]
    assert verdict["message"].startswith("Not switching dgx-1 to topologyManagerPolicy single-numa-node: it could no longer admit "
                                         "Deployment ml/train-8g ({\"main\": 8} GPUs per container; a policy that admits it: ")
    assert verdict["message"].endswith("or set kubelet_topology_ignore_unadmittable_workloads=true.")
    forced = _kubelet_stage.admission(switch, "dgx-1", DGX, listed, True)
    assert forced["managers"] is True and forced["kept"] is None and forced["blocked"] == verdict["blocked"]
    assert forced["message"].startswith("Applying anyway (kubelet_topology_ignore_unadmittable_workloads): topologyManagerPolicy single-numa-node")
    fits = _kubelet_stage.admission(switch, "dgx-1", DGX, {"workloads": [_workload("train-4g", 4)], "nodes": {}}, False)
    assert fits == {"kept": None, "blocked": [], "managers": True, "message": ""}


def test_workloads_that_could_not_be_listed_keep_the_policy_as_the_drift_check_predicts():
    switch = {"policy": "single-numa-node", "scope": "container"}
    listed = {"failed": True, "msg": "list deployments: forbidden"}
    verdict = _kubelet_stage.admission(switch, "dgx-1", DGX, listed, False)
    assert verdict["managers"] is False and verdict["blocked"] == [
        {"workload": "the cluster GPU workloads", "found": "list deployments: forbidden", "fitting_policy": None}]
    assert "could not be listed, so their admission was not checked (list deployments: forbidden)" in verdict["message"]
    # the same verdict as the drift check's prediction (gpu_consistency: kept_by_admission without the workloads)
    assert verdict["kept"] == _topology.kept_by_admission(switch, None, "list deployments: forbidden")


def test_the_plan_task_result_carries_the_plan_and_the_decision_and_changes_nothing():
    result = action.decide_plan(_plan(), OPTIONS, True)
    assert result["changed"] is False and result["would_change"] is True
    assert result["gated"] is True and result["disruptive"] is True and result["write_options"] == OPTIONS
    assert result["sources"]["topologyManagerPolicy"]["after"] == "single-numa-node"  # the plan itself, for the output


def test_a_node_the_gate_keeps_is_planned_again_without_the_managers_and_recorded_in_the_statistics():
    stage = dict(action.decide_plan(_plan(), OPTIONS, True), host="dgx-1-host")
    asked = []

    def replan(options):
        asked.append(options)
        return _plan(cpu=False, after="none")

    listed = {"workloads": [_workload("train-8g", 8)], "nodes": {}}
    kept = action.decide_admission(stage, "dgx-1", DGX, listed, False, replan)
    assert asked == [_kubelet_stage.without_managers(OPTIONS)]
    assert kept["write_options"] == asked[0] and kept["disruptive"] is False and kept["restart"] == "if_required"
    assert kept["gated"] is True and kept["host"] == "dgx-1-host" and kept["switch"] == stage["switch"]  # still the batch's lister
    assert kept["ansible_stats"] == {"data": {"gpuharden_topology_blocked": {"dgx-1": kept["admission"]["blocked"]}},
                                     "per_host": False, "aggregate": True}
    # forced: written as planned, and no blocked change in the statistics (the Jinja gate recorded only a kept node)
    forced = action.decide_admission(stage, "dgx-1", DGX, listed, True, replan)
    assert len(asked) == 1 and forced["write_options"] == OPTIONS and forced["disruptive"] is True
    assert forced["admission"]["blocked"] == kept["admission"]["blocked"] and "ansible_stats" not in forced
    admitted = action.decide_admission(stage, "dgx-1", DGX, {"workloads": [], "nodes": {}}, False, replan)
    assert "ansible_stats" not in admitted and admitted["write_options"] == OPTIONS and len(asked) == 1


# The GPUs as gpu_facts returns them (module_utils/nvml/_nvml.py): a readable GPU carries "error": None, an unreadable
# one its reason and no NUMA node.
DGX_FACTS = [dict(gpu, uuid="GPU-%d" % gpu["index"], pci_bus_id="00000000:%02X:00.0" % (0x07 + gpu["index"]), error=None) for gpu in DGX]
UNREADABLE = {"index": 8, "error": {"code": "NVML_ERROR_GPU_IS_LOST", "message": "GPU is lost"}}


def test_the_gate_reads_the_gpus_as_gpu_facts_returns_them():
    """The DGX of tests/integration/test_admission_and_restarts.py (4+4 GPUs, an 8-GPU Deployment) with the GPUs harden
    hands over (ansible_facts.gpuharden.gpus). The planner once kept only the GPUs without an ``error`` key, so none:
    the node had no GPU, the workload "could never land there", and harden switched the DGX to single-numa-node."""
    switch = {"policy": "single-numa-node", "scope": "container"}
    listed = {"workloads": [_workload("train-8g", 8, namespace="train")], "nodes": {"seed-topology-none": {"labels": {}, "taints": []}}}
    for gpus in (DGX_FACTS, DGX_FACTS + [UNREADABLE]):  # an unreadable GPU is left out, as topology_check leaves it out
        verdict = _kubelet_stage.admission(switch, "seed-topology-none", gpus, listed, False)
        assert verdict["managers"] is False, verdict
        assert [entry["workload"]["name"] for entry in verdict["blocked"]] == ["train-8g"]
        assert "Not switching seed-topology-none to topologyManagerPolicy single-numa-node" in verdict["message"]
        assert "train/train-8g" in verdict["message"] and "restricted" in verdict["message"]
    stage = dict(action.decide_plan(_plan(), OPTIONS, True), host="seed-topology-none")
    kept = action.decide_admission(stage, "seed-topology-none", DGX_FACTS, listed, False, lambda options: _plan(cpu=False, after="none"))
    assert kept["write_options"] == _kubelet_stage.without_managers(OPTIONS) and kept["disruptive"] is False
    # the Jinja gate's own module on the same input: the two verdicts agree
    from ansible_collections.gpuharden.k8s.plugins.modules import topology_check

    jinja = topology_check.check({"node_name": "seed-topology-none", "gpus": DGX_FACTS + [UNREADABLE], "topology_manager_policy": "single-numa-node",
                                  "topology_manager_scope": "container", "cpu_manager_policy": "", "workloads": listed["workloads"],
                                  "node_labels": {}, "node_taints": []})
    assert [entry for entry in jinja["findings"] if entry["id"] == "workload_cannot_fit_numa"] == kept["admission"]["blocked"]


def test_the_manager_options_are_the_kept_fields_and_the_roles_options():
    """MANAGER_OPTIONS against _topology.KEPT_FIELDS (what the drift check says a kept node keeps), the role's
    kubelet_config options (the settings the table says feed kubelet_config, core/_role_options.py) and kubelet_config's own."""
    fields = {"topology_manager_policy": "topologyManagerPolicy", "topology_manager_scope": "topologyManagerScope",
              "topology_manager_policy_options": "topologyManagerPolicyOptions", "cpu_manager_policy": "cpuManagerPolicy",
              "reserved_system_cpus": "reservedSystemCPUs", "memory_manager_policy": "memoryManagerPolicy",
              "reserved_memory": "reservedMemory"}
    assert [fields[name] for name in _kubelet_stage.MANAGER_OPTIONS] == list(_topology.KEPT_FIELDS)
    options = {entry["feeds"][1] for entry in _settings.ROLES["kubelet_topology"]["settings"] if (entry["feeds"] or ("",))[0] == "kubelet_config"}
    assert set(_kubelet_stage.MANAGER_OPTIONS) <= options
    assert _topology.REJECTING_POLICIES == ("restricted", "single-numa-node")


def _action(args, check_mode=True):
    from unittest import mock

    task = mock.MagicMock(args=args, check_mode=check_mode, async_val=0, diff=False)
    module = action.ActionModule(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(), mock.MagicMock(), mock.MagicMock())
    module._execute_module = mock.MagicMock(return_value=dict(_plan(), invocation={}))
    return module


def test_the_action_reads_only_refuses_bad_arguments_and_names_a_failed_plan():
    from ansible.errors import AnsibleActionFail

    planned = _action({"options": OPTIONS}).run(task_vars={"inventory_hostname": "gpu-1"})
    assert planned["host"] == "gpu-1" and planned["gated"] and "invocation" not in planned and planned["changed"] is False
    with pytest.raises(AnsibleActionFail, match="reads only"):
        _action({"options": OPTIONS}, check_mode=False).run(task_vars={"inventory_hostname": "gpu-1"})
    with pytest.raises(AnsibleActionFail, match="kubelet_topology_plan: .*admission_check"):
        _action({"options": OPTIONS, "admission_check": "perhaps"}).run(task_vars={"inventory_hostname": "gpu-1"})
    with pytest.raises(AnsibleActionFail, match="options .* is required without stage"):
        _action({}).run(task_vars={"inventory_hostname": "gpu-1"})
    failing = _action({"options": OPTIONS})
    failing._execute_module.return_value = {"failed": True, "msg": "kubelet_config: /var/lib/kubelet/config.yaml: not YAML"}
    with pytest.raises(AnsibleActionFail, match="not YAML"):
        failing.run(task_vars={"inventory_hostname": "gpu-1"})
