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
    """What the gates read of one host: the plan's LIST under gate.GPU_PODS, as gate_variables takes it over."""
    variables = {gate.GPU_PODS: pods, "ansible_facts": {"gpuharden": {"driver_gpus": {"0000:01:00.0": {}} if gpus else None}}}
    variables["gpuharden_node_plan"] = {"plan": {"runs": dict(COMPLIANT["plan"]["runs"], **(runs or {}))}}
    variables.update(extra)
    return variables


def _hostvars(variables, run):
    """One host's hostvars: the plan's LIST as node_plan_pods hands it over (a fact stamped with the run ``run``)."""
    variables = dict(variables)
    pods = variables.pop(gate.GPU_PODS)
    return dict(variables, ansible_facts=dict(variables.get("ansible_facts") or {}, **_handover.handed_over(gate.GPU_PODS, pods, run=run)))


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
    hostvars = {host: _hostvars(variables, this_run) for host, variables in hostvars.items()}
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


def test_the_gates_take_the_plans_listing_of_this_run_only(monkeypatch):
    """node_plan_pods hands its LIST with the dry runs over to every host (no registered variable): the gates take this
    run's; an earlier run's, kept by a fact cache, counts as no dry run (the stage runs)."""
    this_run, earlier_run = {"pid": 7, "start": 9}, {"pid": 6, "start": 9}
    monkeypatch.setattr(_handover, "this_run", lambda: this_run)
    task = SimpleNamespace(args={"stage": "runtime_class"}, async_val=0, check_mode=False, diff=False, action="x")
    action = gate.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None, None, None)
    for stage in ("runtime_class", "device_plugin"):
        task.args = {"stage": stage}
        for run, expected in ((this_run, False), (earlier_run, True)):
            task_vars = {"hostvars": {"a": _hostvars(_host(), run)}, "ansible_play_batch": ["a"], "ansible_play_hosts": ["a"],
                         "ansible_play_hosts_all": ["a"]}
            assert action.run(task_vars=task_vars)["run"] is expected, (stage, run)
    assert gate.gate_variables([_hostvars(_host(), earlier_run)], gate.READ) == [{key: value for key, value in _hostvars(_host(), earlier_run).items()
                                                                                 if key in gate.READ}]
    assert gate.gate_variables([_hostvars(_host(), this_run)], ("gpuharden_node_plan",))[0][gate.GPU_PODS] == QUIET
