# SPDX-License-Identifier: GPL-3.0-or-later
"""The device plugin stage in Python (issue 45): plugins/module_utils/cluster/_device_plugin_stage.py and the action
gpuharden.k8s.device_plugin_stage, which roles/device_plugin/tasks/main.yml calls (a stat, a set_fact of two templated
facts and a module call whose node_labels spanned six lines of Jinja decided it before): which host is a GPU node, the
labels set and taken off, and the one device_plugin run for the play on the controller's Python."""

from __future__ import annotations

import copy
from pathlib import Path
from unittest.mock import MagicMock

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from ansible_collections.gpuharden.k8s.plugins.action import device_plugin_stage
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin_stage as plan
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

REPO = Path(__file__).resolve().parents[2]
LABELS = {"labels": {"nvidia.com/gpu.present": "true"}, "taint": None}


@pytest.mark.parametrize(("gpu_node", "facts", "known"), [
    (True, {"gpuharden": {"driver_gpus": None}}, (True, "device_plugin_gpu_node")),  # the role's variable wins over the facts
    ("no", {}, (False, "device_plugin_gpu_node")),
    (None, {"gpuharden": {"driver_gpus": {"0000:3b:00.0": {"minor": 0}}}}, (True, "ansible_facts.gpuharden.driver_gpus")),
    (None, {"gpuharden": {"driver_gpus": None}}, (False, "ansible_facts.gpuharden.driver_gpus")),  # the driver shows no GPU
    (None, {"gpuharden": {"gpus": []}}, (None, None)),  # facts without the driver's list: the node is read
    (None, {}, (None, None)),
    (None, None, (None, None)),
])
def test_what_the_run_already_knows_of_a_host(gpu_node, facts, known):
    assert plan.gpu_node_known(gpu_node, facts) == known


def test_a_gpu_node_that_is_no_boolean_is_refused_naming_it():
    with pytest.raises(plan.GpuhardenError, match=r"device_plugin_gpu_node='maybe' is not a boolean"):
        plan.gpu_node_known("maybe", {})
    with pytest.raises(plan.GpuhardenError, match="device_plugin_node_name=''"):
        plan.node_part("", True, "device_plugin_gpu_node")


PARTS = [plan.node_part("gpu-a", True, "x"), plan.node_part("cpu-b", False, "x"), plan.node_part("gpu-c", True, "x")]


@pytest.mark.parametrize(("label_nodes", "unlabel", "expected"), [
    (True, True, dict(LABELS, nodes=["gpu-a", "gpu-c"], unlabel_nodes=["cpu-b"])),
    ("yes", False, dict(LABELS, nodes=["gpu-a", "gpu-c"], unlabel_nodes=[])),
    (False, True, None),  # the role labels nothing: the module gets no node_labels
])
def test_the_gpu_nodes_are_labelled_and_the_cpu_only_ones_unlabelled(label_nodes, unlabel, expected):
    assert plan.node_labels(LABELS, PARTS, label_nodes, unlabel) == expected


def test_the_module_takes_the_roles_map_the_identity_where_given_and_the_labels():
    audit = {"version": "v0.20.0", "node_selector": {"nvidia.com/gpu.present": "true"}}
    assert plan.module_args(audit, "", "", None) == audit
    args = plan.module_args(audit, "/k", "ctx", {"nodes": []})
    assert args == dict(audit, kubeconfig="/k", context="ctx", node_labels={"nodes": []}) and "kubeconfig" not in audit


def test_a_host_whose_node_step_did_not_run_is_left_out():
    parts, missing = plan.parts_of(["a", "b", "c"], {"a": PARTS[0], "b": None, "c": {"skipped": True}})
    assert parts == [PARTS[0]] and missing == ["b", "c"]


class _Variables:
    """The action's templar, for the variables it resolves by name."""

    def __init__(self, variables):
        self.variables = variables

    def resolve_variable_expression(self, name):
        return self.variables[name]


ROLE = {"device_plugin_node_name": "gpu-a", "device_plugin_gpu_node": None, "device_plugin_label_nodes": True,
        "device_plugin_unlabel_cpu_nodes": True, "device_plugin_kubeconfig": "", "device_plugin_kube_context": "",
        "device_plugin_controller_python": "/venv/bin/python", "device_plugin_audit_options": {"version": "v0.20.0"},
        "device_plugin_gpu_label_key": "nvidia.com/gpu.present", "device_plugin_gpu_label_value": "true", "device_plugin_taint": None}


def _action(step, modules, check_mode=False, delegate_to=None, **changes):
    task = MagicMock(args={"step": step}, check_mode=check_mode, async_val=0, delegate_to=delegate_to)
    action = device_plugin_stage.ActionModule(task, MagicMock(), MagicMock(), loader=None, templar=_Variables(dict(ROLE, **changes)),
                                              shared_loader_obj=None)
    calls = []

    def execute(module_name, module_args, task_vars):
        calls.append((module_name, module_args, action._task.check_mode, task_vars))
        return copy.deepcopy(modules[module_name])

    action._execute_module = execute
    return action, calls


def test_the_node_step_reads_the_node_only_where_the_run_does_not_know():
    action, calls = _action("node", {})
    known = action.run(task_vars={"ansible_facts": {"gpuharden": {"driver_gpus": None}}})
    assert calls == [] and (known["node_name"], known["gpu_node"], known["changed"]) == ("gpu-a", False, False)
    action, calls = _action("node", {"ansible.legacy.stat": {"stat": {"exists": True}, "changed": False}}, check_mode=True)
    read = action.run(task_vars={})
    # a read: it runs in check mode too, as the stat task did
    assert [(name, args, check) for name, args, check, _vars in calls] == [
        ("ansible.legacy.stat", {"path": "/proc/driver/nvidia/gpus", "get_checksum": False}, True)]
    assert read["gpu_node"] is True and read["source"] == "/proc/driver/nvidia/gpus"
    action, _calls = _action("node", {"ansible.legacy.stat": {"failed": True, "msg": "Permission denied"}})
    assert action.run(task_vars={})["msg"] == "stat /proc/driver/nvidia/gpus: Permission denied"


def test_a_gpu_node_that_is_no_boolean_fails_the_task():
    action, _calls = _action("node", {}, device_plugin_gpu_node="maybe")
    with pytest.raises(AnsibleActionFail, match="device_plugin_gpu_node='maybe' is not a boolean"):
        action.run(task_vars={})


def test_the_apply_step_labels_every_host_of_the_play_in_one_run_on_the_controllers_python():
    # what each host's step node handed over in this run; a fourth host's answer is an earlier run's (a fact cache kept it)
    hostvars = {host: _handover.handed_over(plan.NODE_RESULT, part) for host, part in zip(("a", "b", "c"), PARTS, strict=True)}
    hostvars["d"] = {"ansible_facts": _handover.handed_over(plan.NODE_RESULT, {"node_name": "gpu-d", "gpu_node": True},
                                                            run=dict(_handover.this_run(), pid=1, start=0))}
    result = {"changed": True, "diff": {"before": "", "after": "x"}, "node_labels": {"labelled": ["gpu-a", "gpu-c"]}, "invocation": {}}
    action, calls = _action("apply", {"gpuharden.k8s.device_plugin": result}, delegate_to="localhost")
    done = action.run(task_vars={"hostvars": hostvars, "ansible_play_hosts": ["a", "b", "c", "d"],
                                 "ansible_delegated_vars": {"localhost": {"ansible_python_interpreter": "/node/python"}}})
    [(name, args, check, task_vars)] = calls
    assert name == "gpuharden.k8s.device_plugin" and check is False
    assert args == {"version": "v0.20.0", "node_labels": dict(LABELS, nodes=["gpu-a", "gpu-c"], unlabel_nodes=["cpu-b"])}
    assert task_vars["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"] == "/venv/bin/python"
    # the module's result is the task's (device_plugin_result), with its diff for --diff
    assert done["changed"] is True and done["diff"] == result["diff"] and done["node_labels"] == result["node_labels"] and "invocation" not in done


def test_the_apply_step_without_labels_passes_none():
    action, calls = _action("apply", {"gpuharden.k8s.device_plugin": {"changed": False}}, delegate_to="localhost", device_plugin_label_nodes=False,
                            device_plugin_kubeconfig="/k")
    action.run(task_vars={"hostvars": {}, "ansible_play_hosts": ["a"]})
    assert calls[0][1] == {"version": "v0.20.0", "kubeconfig": "/k"}


def test_the_apply_step_takes_what_the_node_step_hands_over():
    """The role's tasks register nothing between the steps: the node step's facts are what the apply step reads."""
    action, _calls = _action("node", {}, device_plugin_gpu_node=True)
    handed = action.run(task_vars={})["ansible_facts"]
    applier, calls = _action("apply", {"gpuharden.k8s.device_plugin": {"changed": False}}, delegate_to="localhost")
    applier.run(task_vars={"hostvars": {"a": handed}, "ansible_play_hosts": ["a"]})
    assert calls[0][1]["node_labels"]["nodes"] == [action.run(task_vars={})["node_name"]]
    tasks = yaml.safe_load((REPO / "roles/device_plugin/tasks/main.yml").read_text())
    steps = {task["gpuharden.k8s.device_plugin_stage"]["step"]: task for task in tasks if "gpuharden.k8s.device_plugin_stage" in task}
    assert "register" not in steps["node"] and "delegate_to" not in steps["node"]
    apply = steps["apply"]
    assert (apply["register"], apply["delegate_to"], apply["run_once"], apply["become"]) == ("device_plugin_result", "localhost", True, False)
