# SPDX-License-Identifier: GPL-3.0-or-later
"""The plan's one LIST of the GPU pods (plugins/action/node_plan_pods.py over module_utils/core/_stage_plan.py
gpu_pods_args): gpu_pods_info's options, once Jinja in playbooks/tasks/node_plan_inputs.yml."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible_collections.gpuharden.k8s.plugins.action import node_plan_pods
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _stage_plan as sp
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

IDENTITY = {"kubeconfig": "/k", "kube_context": "", "controller_python": "/usr/bin/python3"}
SETTINGS = dict(
    {"cgroup_limits_" + key: value for key, value in IDENTITY.items()},
    **{"runtime_class_" + key: value for key, value in IDENTITY.items()},
    **{"device_plugin_" + key: value for key, value in IDENTITY.items()},
    cgroup_limits_resource_prefixes=["nvidia.com/"], runtime_class_audit_options={"name": "nvidia"}, runtime_class_nodes=["gpu-a"],
    device_plugin_audit_options={"version": "v0.18.2"}, device_plugin_label_nodes=True, device_plugin_gpu_label_key="nvidia.com/gpu.present",
    device_plugin_gpu_label_value="true", device_plugin_taint="ignore")


def test_the_list_takes_cgroup_limits_identity_and_the_dry_runs_where_asked():
    assert set(SETTINGS) == set(sp.LIST_SETTINGS)
    args = sp.gpu_pods_args(SETTINGS, ["gpu-a", "gpu-b"])
    # an empty context is left out (the module's default), as "or omit" did
    assert args == {"nodes": ["gpu-a", "gpu-b"], "resource_prefixes": ["nvidia.com/"], "pods_snapshot": False, "gpu_operator": True,
                    "kubeconfig": "/k"}
    args = sp.gpu_pods_args(SETTINGS, ["gpu-a", "gpu-b"], pods_snapshot=True, dry_runs=True)
    assert args["pods_snapshot"] is True
    assert args["runtime_class"] == {"name": "nvidia", "nodes": ["gpu-a"]}
    # every node of the LIST labelled as a GPU node
    assert args["device_plugin"] == {"version": "v0.18.2", "node_labels": {"labels": {"nvidia.com/gpu.present": "true"}, "taint": "ignore",
                                                                           "nodes": ["gpu-a", "gpu-b"], "unlabel_nodes": []}}
    assert sp.gpu_pods_args(dict(SETTINGS, device_plugin_label_nodes=False), ["gpu-a"], dry_runs=True)["device_plugin"]["node_labels"] is None


@pytest.mark.parametrize("role", ["runtime_class", "device_plugin"])
@pytest.mark.parametrize("key", ["kubeconfig", "kube_context", "controller_python"])
def test_a_dry_run_rides_in_the_list_only_with_the_lists_identity_and_python(role, key):
    args = sp.gpu_pods_args(dict(SETTINGS, **{"%s_%s" % (role, key): "other"}), ["gpu-a"], dry_runs=True)
    assert role not in args
    assert ({"runtime_class", "device_plugin"} - {role}) <= set(args)


class Templar:
    @staticmethod
    def template(value):
        return value


def _run(monkeypatch, task_vars, args, listed=None, check_mode=True):
    calls = []

    def execute(self, module_name, module_args, task_vars):
        calls.append((module_name, module_args, self._task.check_mode))
        return dict(listed or {"pod_uids_by_node": {}})

    monkeypatch.setattr(node_plan_pods.ActionModule, "_execute_module", execute)
    task = SimpleNamespace(args=args, async_val=0, check_mode=check_mode, diff=False, action="gpuharden.k8s.node_plan_pods")
    action = node_plan_pods.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None, Templar(), None)
    return action.run(task_vars=dict(task_vars)), calls, task


def test_the_action_lists_once_outside_check_mode_and_a_failed_list_is_the_plans_reading(monkeypatch):
    result, calls, task = _run(monkeypatch, SETTINGS, {"nodes": ["gpu-a"], "dry_runs": True})
    [(module, module_args, check_mode)] = calls
    assert module == "gpuharden.k8s.gpu_pods_info" and check_mode is False and task.check_mode is True
    assert "runtime_class" in module_args and "device_plugin" in module_args
    assert result["pod_uids_by_node"] == {} and result["changed"] is False
    # the play runs every stage (gpuharden_skip_compliant_stages false): no dry run decides anything, none is made
    _result, calls, _task = _run(monkeypatch, dict(SETTINGS, gpuharden_skip_compliant_stages="false"), {"nodes": ["gpu-a"], "dry_runs": True})
    assert "runtime_class" not in calls[0][1] and "device_plugin" not in calls[0][1]
    # a LIST that fails: the task does not fail, its msg is the reading
    result, _calls, _task = _run(monkeypatch, SETTINGS, {"nodes": ["gpu-a"]}, listed={"failed": True, "msg": "401 Unauthorized"})
    assert result["failed"] is False and result["msg"] == "401 Unauthorized" and "pod_uids_by_node" not in result


def test_the_action_lists_nothing_where_the_reading_is_given_or_no_memory_check_is_asked(monkeypatch):
    given = {"pod_uids_by_node": {"gpu-a": ["u"]}, "gpu_operator": {"nodes": {}}}
    result, calls, _task = _run(monkeypatch, dict(SETTINGS, gpuharden_gpu_pods_given=given), {"nodes": ["gpu-a"]})
    assert calls == [] and result["pod_uids_by_node"] == {"gpu-a": ["u"]} and result["changed"] is False
    assert _handover.taken_over(result["ansible_facts"], node_plan_pods.LISTED) == dict(given, changed=False)
    result, calls, _task = _run(monkeypatch, dict(SETTINGS, cgroup_limits_immediate="no"), {"nodes": ["gpu-a"]})
    # skipped: Ansible sets no fact of a skipped result, and the readers then take none (the stage lists itself)
    assert calls == [] and result["skipped"] is True and "pod_uids_by_node" not in result and "ansible_facts" not in result


def test_the_reading_is_handed_over_to_the_batch_not_registered(monkeypatch):
    """Every host of the batch gets the reading as a hand-over (a run_once task's facts), stamped with this run, without
    Ansible's bookkeeping; a failed LIST is handed over too (its msg is the plan's reading)."""
    result, _calls, _task = _run(monkeypatch, SETTINGS, {"nodes": ["gpu-a"]},
                                 listed={"pod_uids_by_node": {"gpu-a": ["u"]}, "runtime_class_check": {"changed": False}, "invocation": {}})
    handed = _handover.taken_over(result["ansible_facts"], node_plan_pods.LISTED)
    assert handed == {"pod_uids_by_node": {"gpu-a": ["u"]}, "runtime_class_check": {"changed": False}, "changed": False, "failed": False}
    earlier = {name: dict(value, run=dict(value["run"], pid=-1)) for name, value in result["ansible_facts"].items()}
    assert _handover.taken_over(earlier, node_plan_pods.LISTED) is None
    # a failed module run's exception is an ansible-core object (2.19): the fact cache refuses it, so it is left out
    captured = object()
    result, _calls, _task = _run(monkeypatch, SETTINGS, {"nodes": ["gpu-a"]},
                                 listed={"failed": True, "msg": "401 Unauthorized", "exception": captured, "access": {"kind": [captured, "x"]}})
    handed = _handover.taken_over(result["ansible_facts"], node_plan_pods.LISTED)
    assert handed == {"msg": "401 Unauthorized", "access": {"kind": ["x"]}, "failed": False, "changed": False}
    assert result["exception"] is captured


def test_the_hand_over_survives_ansibles_fact_cache():
    """What node_plan_pods hands over goes through the fact cache's serialisation (ansible-core's cache_persistence
    profile, which the in-memory cache uses too): a failed LIST's exception object would stop ansible-playbook with an
    unexpected error (no registered variable went there before)."""
    import json

    from ansible._internal._errors import _captured
    from ansible._internal._json._profiles import _cache_persistence

    failed = {"failed": True, "msg": "connection refused", "exception": "Traceback (most recent call last):\n  boom\n"}
    _captured.AnsibleModuleCapturedError.normalize_result_exception(failed)
    with pytest.raises(TypeError):
        json.dumps(failed, cls=_cache_persistence.Encoder)
    facts = node_plan_pods.ActionModule._hand_over(dict(failed, pod_uids_by_node=None))["ansible_facts"]
    assert json.loads(json.dumps(facts, cls=_cache_persistence.Encoder), cls=_cache_persistence.Decoder) == facts
    assert "exception" not in facts[node_plan_pods.LISTED]["value"]


def test_the_importing_task_s_one_mapping_gives_what_the_task_leaves_out_and_the_list_runs_on_the_stage_s_python(monkeypatch):
    """playbooks/tasks/node_plan_inputs.yml calls the action without options: nodes, pods_snapshot and dry_runs are the
    importing task's __node_plan; the module runs on cgroup_limits_controller_python (no task var on the task)."""
    seen = []

    def execute(self, module_name, module_args, task_vars):
        seen.append((module_args, task_vars["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"]))
        return {"pod_uids_by_node": {}}

    monkeypatch.setattr(node_plan_pods.ActionModule, "_execute_module", execute)
    task = SimpleNamespace(args={}, async_val=0, check_mode=False, diff=False, action="gpuharden.k8s.node_plan_pods", delegate_to="localhost")
    action = node_plan_pods.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None, Templar(), None)
    task_vars = dict(SETTINGS, __node_plan={"nodes": ["gpu-a", "gpu-b"], "dry_runs": True, "lock": None},
                     ansible_delegated_vars={"localhost": {"ansible_python_interpreter": "/opt/gpuharden/venv/bin/python3"}})
    action.run(task_vars=task_vars)
    [(module_args, python)] = seen
    assert module_args["nodes"] == ["gpu-a", "gpu-b"] and module_args["pods_snapshot"] is False and "runtime_class" in module_args
    assert python == "/usr/bin/python3"
    # the task's own option wins
    task.args = {"nodes": ["gpu-c"], "dry_runs": False}
    action.run(task_vars=task_vars)
    assert seen[-1][0]["nodes"] == ["gpu-c"] and "runtime_class" not in seen[-1][0]
    # no nodes given (harden_gpu_nodes.yml): the serial batch's Nodes, each gpuharden_k8s_node_name else the inventory name
    task.args = {}
    batch = dict(task_vars, __node_plan={"dry_runs": True}, ansible_play_batch=["gpu-a", "gpu-b"],
                 hostvars={"gpu-a": {"gpuharden_k8s_node_name": "node-a"}, "gpu-b": {}, "gpu-c": {}})
    action.run(task_vars=batch)
    assert seen[-1][0]["nodes"] == ["node-a", "gpu-b"]
    # nor a batch to take them from: refused, naming both places
    with pytest.raises(AnsibleActionFail, match="__node_plan.nodes"):
        action.run(task_vars=dict(SETTINGS))
