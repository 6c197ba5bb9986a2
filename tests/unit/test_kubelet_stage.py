# SPDX-License-Identifier: GPL-3.0-or-later
"""The kubelet stage's decisions in Python (issue 45): module_utils/cluster/_kubelet_stage.py and the pure functions of
the actions gpuharden.k8s.kubelet_topology_plan, which roles/kubelet_topology/tasks/plan.yml and admission.yml call, and
gpuharden.k8s.kubelet_topology_apply, which apply.yml calls.

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
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

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


def _templar(variables):
    """A templar that resolves the role's variables from ``variables`` (an expression is its key) as Ansible's does:
    an undefined one raises."""
    from unittest import mock

    from ansible.errors import AnsibleUndefinedVariable

    def resolve(expression):
        if expression not in variables:
            raise AnsibleUndefinedVariable("%r is undefined" % expression)
        return variables[expression]

    return mock.MagicMock(resolve_variable_expression=mock.MagicMock(side_effect=resolve))


def _action(args, check_mode=True, variables=None, module=action):
    from unittest import mock

    task = mock.MagicMock(args=args, check_mode=check_mode, async_val=0, diff=False)
    plugin = module.ActionModule(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(), _templar(variables or {}), mock.MagicMock())
    plugin._execute_module = mock.MagicMock(return_value=dict(_plan(), invocation={}))
    return plugin


def test_the_action_reads_only_refuses_bad_arguments_and_names_a_failed_plan():
    from ansible.errors import AnsibleActionFail

    planned = _action({"options": OPTIONS}).run(task_vars={"inventory_hostname": "gpu-1"})
    assert planned["host"] == "gpu-1" and planned["gated"] and "invocation" not in planned and planned["changed"] is False
    with pytest.raises(AnsibleActionFail, match="reads only"):
        _action({"options": OPTIONS}, check_mode=False).run(task_vars={"inventory_hostname": "gpu-1"})
    with pytest.raises(AnsibleActionFail, match="kubelet_topology_plan: .*admission_check"):
        _action({"options": OPTIONS, "admission_check": "perhaps"}).run(task_vars={"inventory_hostname": "gpu-1"})
    # no vars entry holds the options: built from the role's variables, they name those undefined outside the role
    with pytest.raises(AnsibleActionFail, match="role options __kubelet_topology_module_options: kubelet_topology_topology_manager_policy, .* undefined"):
        _action({}).run(task_vars={"inventory_hostname": "gpu-1"})
    with pytest.raises(AnsibleActionFail, match="options .* is required without stage"):
        _action({}, variables={"__kubelet_topology_module_options": None}).run(task_vars={"inventory_hostname": "gpu-1"})
    failing = _action({"options": OPTIONS})
    failing._execute_module.return_value = {"failed": True, "msg": "kubelet_config: /var/lib/kubelet/config.yaml: not YAML"}
    with pytest.raises(AnsibleActionFail, match="not YAML"):
        failing.run(task_vars={"inventory_hostname": "gpu-1"})


@pytest.mark.parametrize(("disruptive", "check_mode", "tasks", "through_role", "who"), [
    (True, False, "", True, "node_maintenance"),
    (True, False, "/hooks/drain.yml", True, "tasks"),
    (True, False, "/hooks/drain.yml", False, "tasks"),  # the user's tasks file whatever kubelet_topology_drain
    (True, False, "", False, ""),  # kubelet_topology_drain=false: the user drains
    (True, True, "/hooks/drain.yml", True, ""),  # a check run drains nothing (the role's `not ansible_check_mode`)
    (False, False, "/hooks/drain.yml", True, ""),  # a restart alone drains nothing
])
def test_who_drains_and_uncordons_a_node(disruptive, check_mode, tasks, through_role, who):
    assert _kubelet_stage.maintenance(disruptive, check_mode, tasks, through_role) == who


DRAIN = {"kubelet_topology_drain_tasks": "", "kubelet_topology_drain": True}


def test_the_plan_says_who_drains_with_the_runs_check_mode_and_the_roles_variables():
    """apply.yml includes the plan's drain_tasks where its drain is set: before, `__kubelet_topology_stage.disruptive and not
    ansible_check_mode` there, and kubelet_topology_drain_tasks / kubelet_topology_drain in stop.yml."""
    run = {"inventory_hostname": "gpu-1", "ansible_check_mode": False}
    variables = dict(DRAIN, kubelet_topology_admission_check=False)
    planned = _action({"options": OPTIONS}, variables=variables).run(task_vars=run)
    assert planned["drain"] == "node_maintenance" and planned["gated"] is False  # admission_check read from the role
    assert planned["drain_tasks"] == "node_maintenance_drain.yml"  # the file apply.yml includes (stop.yml chose it in Jinja)
    assert (REPO / "roles" / "kubelet_topology" / "tasks" / planned["drain_tasks"]).is_file()
    hooked = _action({"options": OPTIONS}, variables=dict(variables, kubelet_topology_drain_tasks="/hooks/drain.yml")).run(task_vars=run)
    assert hooked["drain"] == "tasks" and hooked["drain_tasks"] == "/hooks/drain.yml"
    checked = _action({"options": OPTIONS}, variables=variables).run(task_vars=dict(run, ansible_check_mode=True))
    assert checked["drain"] == "" and checked["disruptive"] is True and checked["drain_tasks"] == ""
    # the options are the role's map where the task gives none (plan.yml passed __kubelet_topology_module_options in Jinja)
    given = _action({}, variables=dict(variables, __kubelet_topology_module_options=OPTIONS))
    assert given.run(task_vars=run)["write_options"] == OPTIONS
    assert given._execute_module.call_args.kwargs["module_args"] == OPTIONS
    audited = _action({"options": OPTIONS}, variables=dict(variables, __kubelet_topology_audited_plan=_plan(cpu=False)))
    restart_only = audited.run(task_vars=run)
    assert restart_only["audited"] is True and restart_only["drain"] == "" and not audited._execute_module.called


def test_a_node_the_gate_keeps_is_drained_only_where_its_plan_without_the_managers_still_is_disruptive():
    drain = lambda disruptive: _kubelet_stage.maintenance(disruptive, False, "", True)  # noqa: E731
    stage = dict(action.decide_plan(_plan(), OPTIONS, True, drain), host="dgx-1")
    assert stage["drain"] == "node_maintenance"
    listed = {"workloads": [_workload("train-8g", 8)], "nodes": {}}
    kept = action.decide_admission(stage, "dgx-1", DGX, listed, False, lambda options: _plan(cpu=False, after="none"), drain)
    assert kept["disruptive"] is False and kept["drain"] == ""
    stale = action.decide_admission(stage, "dgx-1", DGX, listed, False, lambda options: _plan(cpu=False, stale=["cpu_manager_state"]), drain)
    assert stale["disruptive"] is True and stale["drain"] == "node_maintenance"


def test_the_gate_reads_its_inputs_from_the_role_and_the_gpus_from_gpu_facts_where_no_fact_holds_them():
    """admission.yml calls the action with gate: true only (it passed the stage, node name, GPUs, listing and the
    ignore flag in Jinja, and ran gpu_facts in a task of its own where ansible_facts.gpuharden.gpus was undefined)."""
    drain = lambda disruptive: _kubelet_stage.maintenance(disruptive, False, "", True)  # noqa: E731
    stage = dict(action.decide_plan(_plan(), OPTIONS, True, drain), host="dgx-host")
    listed = {"workloads": [_workload("train-8g", 8)], "nodes": {}}
    variables = dict(DRAIN, __kubelet_topology_stage=stage, kubelet_topology_node_name="dgx-1", kubelet_topology_ignore_unadmittable_workloads=False)
    # the listing the batch's lister handed over in this run (the first host of the batch whose plan is gated: not
    # "other"), read from its hostvars (a subscript is no variable name the templar resolves: the lab's harden runs failed on it)
    batch = {"ansible_play_batch": ["other", "dgx-host"], "hostvars": {"other": {"__kubelet_topology_stage": dict(stage, gated=False)},
                                                                        "dgx-host": dict(_handover.handed_over(action.LISTED, listed),
                                                                                         __kubelet_topology_stage=stage)}}
    gate = _action({"gate": True}, variables=variables)
    gate._execute_module.side_effect = [{"ansible_facts": {"gpuharden": {"gpus": DGX_FACTS}}}, dict(_plan(cpu=False, after="none"), invocation={})]
    kept = gate.run(task_vars=dict(batch, inventory_hostname="dgx-host", ansible_check_mode=False))
    # the line the run prints (admission.yml printed it in a debug task of its own)
    assert kept["warnings"] == [kept["admission"]["message"]] and kept["warnings"][0].startswith("Not switching dgx-1 to topologyManagerPolicy")
    assert [call.kwargs["module_name"] for call in gate._execute_module.call_args_list] == ["gpuharden.k8s.gpu_facts", "gpuharden.k8s.kubelet_config"]
    # set as the gpu_facts task set them, with the gate's hand-over of whether the change (now) is disruptive
    assert kept["ansible_facts"] == dict({"gpuharden": {"gpus": DGX_FACTS}}, **_handover.handed_over(action.DISRUPTIVE, False))
    assert kept["admission"]["managers"] is False and [entry["workload"]["name"] for entry in kept["admission"]["blocked"]] == ["train-8g"]
    assert kept["write_options"] == _kubelet_stage.without_managers(OPTIONS) and kept["drain"] == ""
    # the GPUs already in the facts: no second read of the node; forced by the role's variable: written as planned
    variables.update({"ansible_facts.gpuharden.gpus": DGX_FACTS, "kubelet_topology_ignore_unadmittable_workloads": True})
    forced_gate = _action({"gate": True}, variables=variables)
    forced = forced_gate.run(task_vars=dict(batch, inventory_hostname="dgx-host", ansible_check_mode=False))
    assert not forced_gate._execute_module.called and forced["ansible_facts"] == _handover.handed_over(action.DISRUPTIVE, True)
    assert forced["warnings"][0].startswith("Applying anyway (kubelet_topology_ignore_unadmittable_workloads)")
    assert forced["write_options"] == OPTIONS and forced["drain"] == "node_maintenance" and forced["admission"]["managers"] is True


def test_the_batch_s_first_gated_host_lists_the_workloads_once_on_the_controller():
    """admission.yml's listing task: it ran gpu_workloads_info with its options, interpreter and a when naming the lister
    in Jinja (vars/main.yml __kubelet_topology_lister), and failed_when: false."""
    stages = {"a": {"__kubelet_topology_stage": {"gated": False, "host": "a"}}, "b": {}, "c": {"__kubelet_topology_stage": {"gated": True, "host": "c"}},
              "d": {"__kubelet_topology_stage": {"gated": True, "host": "d"}}}
    assert action.lister(["a", "b", "c", "d"], stages) == "c" and action.lister(["a", "b"], stages) is None
    variables = {"kubelet_topology_gpu_resources": ["nvidia.com/gpu"], "kubelet_topology_controller_kubeconfig": "/k",
                 "kubelet_topology_controller_python": "/controller/bin/python"}
    task_vars = {"ansible_play_batch": ["a", "b", "c", "d"], "hostvars": stages, "ansible_python_interpreter": "/node/bin/python"}
    other = _action({"workloads": True}, variables=variables)
    other._task.delegate_to = "localhost"
    skipped = other.run(task_vars=dict(task_vars, inventory_hostname="d"))
    assert skipped["skipped"] and "by c" in skipped["skip_reason"] and not other._execute_module.called
    lister = _action({"workloads": True}, variables=variables)
    lister._task.delegate_to = "localhost"
    lister._execute_module.return_value = {"failed": True, "msg": "forbidden", "invocation": {}}
    listed = lister.run(task_vars=dict(task_vars, inventory_hostname="c"))
    call = lister._execute_module.call_args.kwargs
    assert call["module_name"] == "gpuharden.k8s.gpu_workloads_info" and call["module_args"] == {"resources": ["nvidia.com/gpu"], "kubeconfig": "/k"}
    assert call["task_vars"]["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"] == "/controller/bin/python"
    assert lister._task.check_mode is True  # set back after the read outside check mode
    # a failed listing is no failure of the task: the gate keeps the node's policy, saying why
    assert listed["failed"] is False and listed["listing_failed"] is True and listed["msg"] == "forbidden" and "invocation" not in listed
    verdict = _kubelet_stage.admission({"policy": "single-numa-node", "scope": "container"}, "dgx-1", [], listed, False)
    assert verdict["managers"] is False and "could not be listed" in verdict["message"]
    # admission.yml registers no listing: the lister hands it over on its host, where the gates read it; a skipped
    # host hands nothing over
    handed = _handover.taken_over(listed["ansible_facts"], action.LISTED)
    assert handed["listing_failed"] is True and handed["msg"] == "forbidden" and "ansible_facts" not in skipped


APPLY_SETTINGS = {"kubelet_topology_healthz_url": "http://127.0.0.1:10248/healthz", "kubelet_topology_health_timeout": 120,
                  "kubelet_topology_log_file": "", "kubelet_topology_log_lines": 15, "kubelet_topology_kubeconfig": "/etc/kubernetes/kubelet.conf",
                  "kubelet_topology_node_name": "gpu-1", "kubelet_topology_uncordon_tasks": "", "kubelet_topology_drain": True}


def _apply(stage, settings, check_mode, results):
    from ansible_collections.gpuharden.k8s.plugins.action import kubelet_topology_apply

    runs = []

    def run(name, module_args):
        runs.append((name, module_args))
        return dict(results[name])

    return kubelet_topology_apply.decide(stage, dict(APPLY_SETTINGS, **settings), check_mode, run), runs


def test_the_write_takes_the_plans_options_stops_first_only_where_disruptive_and_rolls_back():
    """apply.yml's kubelet_config task, with the plan's write_options as its module_defaults, before."""
    stage = action.decide_plan(_plan(), OPTIONS, True)
    written = {"gpuharden.k8s.kubelet_config": {"changed": True, "restarted": False, "persistence": "durable", "invocation": {}}}
    result, runs = _apply(stage, {}, False, written)
    assert runs == [("gpuharden.k8s.kubelet_config", dict(OPTIONS, stop_first=True, remove_stale_state=True, restart="always",
                                                          health_url="http://127.0.0.1:10248/healthz", health_timeout=120, rollback=True,
                                                          log_file="", log_lines=15))]
    assert result["changed"] is True and "invocation" not in result and result["uncordon"] == "node_maintenance" and "ready" not in result
    restart = action.decide_plan(_plan(cpu=False), OPTIONS, True)
    _result, runs = _apply(restart, {}, False, written)
    assert runs[0][1]["stop_first"] is False and runs[0][1]["restart"] == "if_required"
    failed = {"gpuharden.k8s.kubelet_config": {"failed": True, "msg": "kubelet not healthy; rolled back", "restarted": True}}
    result, runs = _apply(stage, {}, False, failed)
    assert result == failed["gpuharden.k8s.kubelet_config"] and len(runs) == 1  # no wait, no uncordon: the node stays cordoned


def test_the_wait_for_node_ready_runs_only_after_a_restart_with_a_kubeconfig_and_fails_the_host_when_not_ready():
    """apply.yml's `kubectl wait` task (when: restarted and kubelet_topology_kubeconfig | length > 0), before."""
    stage = action.decide_plan(_plan(cpu=False), OPTIONS, True)
    ready = {"gpuharden.k8s.kubelet_config": {"changed": True, "restarted": True, "health": {"restarted_at": "t"}},
             "ansible.builtin.command": {"changed": True, "rc": 0, "stdout": "node/gpu-1 condition met", "stderr": "", "cmd": ["kubectl"]}}
    result, runs = _apply(stage, {}, False, ready)
    assert runs[1] == ("ansible.builtin.command", {"argv": ["kubectl", "--kubeconfig", "/etc/kubernetes/kubelet.conf", "wait", "--for=condition=Ready",
                                                           "node/gpu-1", "--timeout=120s"]})
    assert result["ready"]["rc"] == 0 and not result.get("failed") and result["health"]["restarted_at"] == "t" and result["uncordon"] == ""
    _result, runs = _apply(stage, {"kubelet_topology_kubeconfig": ""}, False, ready)
    assert len(runs) == 1
    _result, runs = _apply(stage, {}, False, dict(ready, **{"gpuharden.k8s.kubelet_config": {"changed": True, "restarted": False}}))
    assert len(runs) == 1
    not_ready = dict(ready, **{"ansible.builtin.command": {"failed": True, "rc": 1, "stderr": "error: timed out waiting for the condition on nodes/gpu-1\n",
                                                          "msg": "non-zero return code"}})
    result, _runs = _apply(stage, {}, False, not_ready)
    assert result["failed"] is True and result["changed"] is True and result["restarted"] is True
    assert result["msg"] == "kubelet_topology: node gpu-1 not Ready after the kubelet restart: error: timed out waiting for the condition on nodes/gpu-1"


def test_the_uncordon_follows_the_drain_and_a_check_run_uncordons_nothing():
    stage = action.decide_plan(_plan(), OPTIONS, True)
    written = {"gpuharden.k8s.kubelet_config": {"changed": True, "restarted": False}}
    hooked = _apply(stage, {"kubelet_topology_uncordon_tasks": "/hooks/uncordon.yml"}, False, written)[0]
    assert hooked["uncordon"] == "tasks" and hooked["uncordon_tasks"] == "/hooks/uncordon.yml"
    # apply.yml includes the file the result names (it chose between the user's file and node_maintenance in Jinja before)
    assert _apply(stage, {}, False, written)[0]["uncordon_tasks"] == "node_maintenance_uncordon.yml"
    assert (REPO / "roles" / "kubelet_topology" / "tasks" / "node_maintenance_uncordon.yml").is_file()
    assert _apply(stage, {"kubelet_topology_drain": "no"}, False, written)[0]["uncordon"] == ""
    assert _apply(stage, {}, True, written)[0]["uncordon_tasks"] == ""


def test_the_apply_action_reads_the_plan_and_the_role_variables_as_the_role_sees_them():
    from ansible_collections.gpuharden.k8s.plugins.action import kubelet_topology_apply

    stage = action.decide_plan(_plan(cpu=False), OPTIONS, True)
    plugin = _action({}, check_mode=False, variables=dict(APPLY_SETTINGS, kubelet_topology_kubeconfig="", __kubelet_topology_stage=stage),
                     module=kubelet_topology_apply)
    plugin._execute_module.return_value = {"changed": False, "restarted": False, "persistence": "durable", "invocation": {}}
    result = plugin.run(task_vars={"inventory_hostname": "gpu-1", "ansible_check_mode": False})
    assert result == {"changed": False, "restarted": False, "persistence": "durable", "uncordon": "", "uncordon_tasks": ""}
    assert plugin._execute_module.call_args.kwargs["module_args"]["restart"] == "if_required"


def test_the_plan_hands_over_whether_it_drains_to_harden_s_readers_of_this_run_only(monkeypatch):
    """plan.yml published __kubelet_topology_disruptive with set_fact (defined = the plan ran): the plan action hands it
    over now, and harden's readers (harden_rollout's host view, harden_node step=draining, stage_steps step=drains) take
    what it handed over in this run, never a fact cache's value of an earlier run."""
    from ansible_collections.gpuharden.k8s.plugins.action import harden_rollout
    from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run

    this_run = {"boot_id": "b", "pid_ns": "pid:[1]", "pid": 7, "start": 9}
    monkeypatch.setattr(_handover, "this_run", lambda: this_run)
    run = {"inventory_hostname": "gpu-1", "ansible_check_mode": False}
    variables = dict(DRAIN, kubelet_topology_admission_check=False)
    planned = _action({"options": OPTIONS}, variables=variables).run(task_vars=run)
    assert planned["disruptive"] is True and _harden_run.DRAINING_PLANS["kubelet_topology"] == action.DISRUPTIVE
    host = dict(planned["ansible_facts"], gpuharden_node_plan={"plan": {"runs": {"kubelet_topology": True}}})
    view = harden_rollout.host_view("gpu-1", host)
    assert view["disruptive"] is True and view["unplanned"] == []
    restart_only = _action({"options": OPTIONS}, variables=dict(variables, __kubelet_topology_audited_plan=_plan(cpu=False))).run(task_vars=run)
    assert harden_rollout.host_view("gpu-1", dict(host, **restart_only["ansible_facts"]))["disruptive"] is False
    # the same hand-over kept by a fact cache from an earlier run: the plan did not run in this one
    monkeypatch.setattr(_handover, "this_run", lambda: dict(this_run, pid=8))
    view = harden_rollout.host_view("gpu-1", host)
    assert view["disruptive"] is False and view["unplanned"] == ["kubelet_topology"]
