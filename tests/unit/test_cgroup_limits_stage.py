# SPDX-License-Identifier: GPL-3.0-or-later
"""The cgroup_limits stage's immediate fix in Python (issue 45): module_utils/cluster/_cgroup_limits_stage.py and the
action gpuharden.k8s.cgroup_limits_immediate's decide(), which roles/cgroup_limits/tasks/immediate.yml calls (it built
the report in Jinja before)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.action import cgroup_limits_immediate as action
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _cgroup_limits_stage
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _role_options
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

PODS = {"pod_uids_by_node": {"gpu-1": ["u1", "u2", "u3"], "gpu-2": ["u4"]},
        "pods": [{"uid": "u1", "namespace": "ml", "name": "train"}, {"uid": "u2", "namespace": "ml", "name": "infer"},
                 {"uid": "u3", "namespace": "web", "name": "gone"}, {"uid": "u4", "namespace": "ml", "name": "other"}],
        "unlimited_pods": [{"uid": "u2", "node": "gpu-1"}, {"uid": "u4", "node": "gpu-2"}]}
OPTIONS = {"cgroup_root": "/sys/fs/cgroup", "factor": 0.9}


def test_the_node_takes_its_own_pods_from_the_plans_listing_else_the_batchs():
    assert _cgroup_limits_stage.pod_uids(_cgroup_limits_stage.gpu_pods(PODS, {"skipped": True}), "gpu-1") == ["u1", "u2", "u3"]
    assert _cgroup_limits_stage.pod_uids(_cgroup_limits_stage.gpu_pods(None, PODS), "gpu-3") == []
    with pytest.raises(GpuhardenError, match="not listed \\(forbidden\\)"):
        _cgroup_limits_stage.gpu_pods(None, {"failed": True, "msg": "forbidden"})


def test_the_report_names_the_pods_and_merges_the_unlimited_ones_of_the_api_and_of_the_cgroups():
    result = {"updated": [{"path": "/sys/fs/cgroup/kubepods.slice/u1/memory.high"}], "unlimited_pods": ["u2", "u1"],
              "not_found": ["u3"], "findings": [{"id": "x"}]}
    report = _cgroup_limits_stage.report(PODS, "gpu-1", result)
    assert report == {"node": "gpu-1", "updated": result["updated"], "unlimited_pods": ["ml/infer", "ml/train"],
                      "not_found": ["web/gone"], "findings": [{"id": "x"}]}


def test_the_action_runs_cgroup_memory_on_the_nodes_pods_and_records_the_report_in_the_statistics():
    runs = []

    def run(module_args):
        runs.append(module_args)
        return {"changed": True, "updated": [], "unlimited_pods": [], "not_found": [], "findings": []}

    result = action.decide({"options": OPTIONS, "node_name": "gpu-2", "gpu_pods": None, "gpu_pods_listed": PODS}, "host-2", run)
    assert runs == [dict(OPTIONS, pod_uids=["u4"])]
    assert result["changed"] and result["report"]["unlimited_pods"] == ["ml/other"]
    assert result["ansible_stats"] == {"data": {"gpuharden_cgroup_limits": {"host-2": result["report"]}}, "per_host": False, "aggregate": True}
    failed = action.decide({"options": OPTIONS, "node_name": "gpu-2", "gpu_pods": PODS, "gpu_pods_listed": None}, "host-2",
                           lambda _args: {"failed": True, "msg": "no cgroup v2"})
    assert failed == {"failed": True, "msg": "no cgroup v2"}


def _plugin(args, variables):
    from unittest import mock

    from ansible.errors import AnsibleUndefinedVariable

    def resolve(expression):
        if expression not in variables:
            raise AnsibleUndefinedVariable("%r is undefined" % expression)
        return variables[expression]

    task = mock.MagicMock(args=args, check_mode=False, async_val=0, diff=False)
    templar = mock.MagicMock(resolve_variable_expression=mock.MagicMock(side_effect=resolve))
    plugin = action.ActionModule(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(), templar, mock.MagicMock())
    plugin._execute_module = mock.MagicMock(return_value={"changed": False, "updated": [], "unlimited_pods": [], "not_found": [], "findings": []})
    return plugin


def test_the_action_reads_what_immediate_yml_passed_it_from_the_roles_variables():
    """immediate.yml calls the action without arguments (it passed the options, node name and listings in Jinja; the
    batch's listing is the list step's hand-over now, no registered variable)."""
    from ansible.errors import AnsibleActionFail

    variables = {"__cgroup_limits_memory_options": OPTIONS, "cgroup_limits_node_name": "gpu-1", "cgroup_limits_gpu_pods": None}
    plugin = _plugin({}, variables)
    result = plugin.run(task_vars=dict(_handover.handed_over(action.LISTED, PODS), inventory_hostname="host-1"))
    assert plugin._execute_module.call_args.kwargs["module_args"] == dict(OPTIONS, pod_uids=["u1", "u2", "u3"])
    assert result["report"]["node"] == "gpu-1" and "host-1" in result["ansible_stats"]["data"]["gpuharden_cgroup_limits"]
    # an argument given wins over the role's variable; the plan's listing over the batch's
    given = _plugin({"node_name": "gpu-2"}, dict(variables, cgroup_limits_gpu_pods=PODS))
    given.run(task_vars=dict(_handover.handed_over(action.LISTED, {"skipped": True}), inventory_hostname="host-2"))
    assert given._execute_module.call_args.kwargs["module_args"]["pod_uids"] == ["u4"]
    # a listing an earlier run handed over (a fact cache kept it) is no listing of this batch
    earlier = dict(_handover.this_run(), pid=1, start=0)
    with pytest.raises(AnsibleActionFail, match="the GPU pods of the batch were not listed"):
        _plugin({}, variables).run(task_vars=dict(_handover.handed_over(action.LISTED, PODS, run=earlier), inventory_hostname="host-1"))
    # no vars entry holds the options: the action builds them from the role's variables, and refuses them undefined
    role = {"cgroup_limits_node_name": "gpu-1", "cgroup_limits_gpu_pods": None, "cgroup_limits_cgroup_root": "/sys/fs/cgroup",
            "cgroup_limits_factor": 0.8, "cgroup_limits_page_size": 4096}
    built = _plugin({}, role)
    built.run(task_vars=dict(_handover.handed_over(action.LISTED, PODS), inventory_hostname="host-1"))
    assert built._execute_module.call_args.kwargs["module_args"] == dict(
        _role_options.options("__cgroup_limits_memory_options", role), pod_uids=["u1", "u2", "u3"])
    assert built._execute_module.call_args.kwargs["module_args"]["factor"] == 0.8
    with pytest.raises(AnsibleActionFail, match="role options __cgroup_limits_memory_options: cgroup_limits_factor, cgroup_limits_page_size undefined"):
        _plugin({}, {"cgroup_limits_node_name": "gpu-1"}).run(task_vars={"inventory_hostname": "host-1"})


def test_each_host_records_its_node_and_the_batch_is_listed_once_on_the_controller():
    """immediate.yml's record and listing steps: it set a fact per host and ran gpu_pods_info with its options, the
    batch's nodes and the interpreter in Jinja, skipped where cgroup_limits_gpu_pods was given."""
    variables = {"cgroup_limits_node_name": "gpu-1", "cgroup_limits_gpu_pods": None, "cgroup_limits_kubeconfig": "/k",
                 "cgroup_limits_kube_context": "", "cgroup_limits_resource_prefixes": ["nvidia.com/"],
                 "cgroup_limits_controller_python": "/controller/bin/python"}
    recorded = _plugin({"step": "record"}, variables).run(task_vars={"inventory_hostname": "host-1"})
    assert recorded == {"changed": False, "ansible_facts": {"gpuharden_cgroup_limits_node": "gpu-1"}}
    hostvars = {"host-1": {"ansible_facts": recorded["ansible_facts"]}, "host-2": {"ansible_facts": {"gpuharden_cgroup_limits_node": "gpu-2"}},
                "host-3": {"ansible_facts": {}}}  # the role did not run there
    lister = _plugin({"step": "list"}, variables)
    lister._task.delegate_to = "localhost"
    lister._execute_module.return_value = dict(PODS, changed=False, invocation={"module_args": {}})
    listed = lister.run(task_vars={"inventory_hostname": "host-1", "ansible_play_batch": ["host-1", "host-2", "host-3"], "hostvars": hostvars,
                                   "ansible_python_interpreter": "/node/bin/python"})
    call = lister._execute_module.call_args.kwargs
    assert call["module_name"] == "gpuharden.k8s.gpu_pods_info"
    assert call["module_args"] == {"nodes": ["gpu-1", "gpu-2"], "resource_prefixes": ["nvidia.com/"], "kubeconfig": "/k"}
    assert call["task_vars"]["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"] == "/controller/bin/python"
    # the listing goes to the fix step of every host of the batch as a hand-over of this run (run_once's facts reach
    # them all): the fix step of host-2 takes it with no variable naming it
    fixer = _plugin({}, dict(variables, __cgroup_limits_memory_options=OPTIONS, cgroup_limits_node_name="gpu-2"))
    fixer.run(task_vars=dict(listed["ansible_facts"], inventory_hostname="host-2"))
    assert fixer._execute_module.call_args.kwargs["module_args"]["pod_uids"] == ["u4"]
    planned = _plugin({"step": "list"}, dict(variables, cgroup_limits_gpu_pods=PODS))
    skipped = planned.run(task_vars={"inventory_hostname": "host-1", "ansible_play_batch": ["host-1"], "hostvars": hostvars})
    assert skipped["skipped"] and "cgroup_limits_gpu_pods" in skipped["skip_reason"] and not planned._execute_module.called


def test_the_preflight_runs_cgroup_memory_with_the_role_s_options_and_no_pod():
    """preflight.yml ran cgroup_memory with module_defaults in Jinja; its refusal is the task's."""
    plugin = _plugin({"step": "preflight"}, {"__cgroup_limits_memory_options": OPTIONS})
    plugin._execute_module.return_value = {"failed": True, "msg": "/sys/fs/cgroup is cgroup v2 but ... has no memory controller"}
    result = plugin.run(task_vars={"inventory_hostname": "host-1"})
    assert plugin._execute_module.call_args.kwargs["module_name"] == "gpuharden.k8s.cgroup_memory"
    assert plugin._execute_module.call_args.kwargs["module_args"] == OPTIONS
    assert result["failed"] and "has no memory controller" in result["msg"]
