# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 1: whether harden runs its cluster-side stages, decided once for the play from every host's plan
(plugins/action/cluster_stage_gate.py over module_utils/core/_stage_plan.py)."""

from __future__ import annotations

from types import SimpleNamespace

from ansible_collections.gpuharden.k8s.plugins.action import cluster_stage_gate as gate
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

QUIET = {"runtime_class_check": {"changed": False, "findings": []}, "device_plugin_check": {"clean": True}}
COMPLIANT = {"plan": {"runs": {"device_permissions": False, "container_runtime": False}}}


def _host(runs=None, pods=QUIET, gpus=True, **extra):
    variables = {"__node_plan_gpu_pods": pods, "ansible_facts": {"gpuharden": {"driver_gpus": {"0000:01:00.0": {}} if gpus else None}}}
    variables["gpuharden_node_plan"] = {"plan": {"runs": dict(COMPLIANT["plan"]["runs"], **(runs or {}))}}
    variables.update(extra)
    return variables


def test_runtime_class_gate():
    assert gate.runtime_class_gate([_host(), _host()])[0] is False
    assert gate.runtime_class_gate([_host(), _host(runs={"container_runtime": True})])[0] is True
    assert gate.runtime_class_gate([_host(pods={"runtime_class_check": {"changed": True, "findings": []}})])[0] is True
    assert gate.runtime_class_gate([_host(pods={})])[0] is True
    assert gate.runtime_class_gate([])[0] is True


def test_device_plugin_gate():
    assert gate.device_plugin_gate([_host(), _host()], [])[0] is False
    assert gate.device_plugin_gate([_host(), _host(runs={"device_permissions": True})], [])[0] is True
    assert gate.device_plugin_gate([_host(pods={"device_plugin_check": {"clean": False}})], [])[0] is True
    assert gate.device_plugin_gate([_host(gpus=False)], [])[0] is True
    assert gate.device_plugin_gate([_host(gpuharden_gpu_node=True)], [])[0] is True
    assert gate.device_plugin_gate([_host(gpuharden_skip_compliant_stages=False)], [])[0] is True
    no_plan = _host()
    del no_plan["gpuharden_node_plan"]
    assert gate.device_plugin_gate([no_plan], [])[0] is True
    run, why = gate.device_plugin_gate([_host(runs={"device_permissions": True})], ["gpu-b"])
    assert run is False and "gpu-b" in why


def test_the_action_reads_the_plays_hostvars(monkeypatch):
    this_run, earlier_run = {"pid": 7, "start": 9}, {"pid": 6, "start": 9}
    monkeypatch.setattr(_handover, "this_run", lambda: this_run)
    # c's draining step failed in this run (harden_node step=failed's hand-over); d's in an earlier one (a fact cache kept it)
    hostvars = {"a": _host(), "b": _host(runs={"container_runtime": True}),
                "c": _host(ansible_facts=_handover.handed_over("__harden_failed", "x failed", run=this_run)),
                "d": _host(**_handover.handed_over("__harden_failed", "y failed", run=earlier_run))}
    task = SimpleNamespace(args={"stage": "runtime_class"}, async_val=0, check_mode=False, diff=False, action="x")
    action = gate.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None, None, None)
    task_vars = {"hostvars": hostvars, "ansible_play_batch": ["a"], "ansible_play_hosts": ["a", "b"], "ansible_play_hosts_all": ["a", "b"]}
    assert action.run(task_vars=task_vars)["run"] is False
    assert action.run(task_vars=dict(task_vars, ansible_play_batch=["a", "b"]))["run"] is True
    task.args = {"stage": "device_plugin"}
    assert action.run(task_vars=dict(task_vars, ansible_play_hosts=["a"]))["run"] is False
    assert action.run(task_vars=task_vars)["run"] is True
    assert action.run(task_vars=dict(task_vars, ansible_play_hosts_all=["a", "b", "d"]))["run"] is True
    assert action.run(task_vars=dict(task_vars, ansible_play_hosts_all=["a", "b", "c"]))["run"] is False
