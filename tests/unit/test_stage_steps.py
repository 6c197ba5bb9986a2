# SPDX-License-Identifier: GPL-3.0-or-later
"""Which steps of playbooks/tasks/stages.yml run on a host (module_utils/core/_stage_steps.py, action stage_steps)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _stage_steps
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

RUNS = {"device_permissions": False, "container_runtime": True, "kubelet_topology": True, "mig": False, "cgroup_limits": True}
PLAN = {"plan": {"runs": RUNS}, "kubelet_plan": {"changes": ["cpuManagerPolicy"]}}
LISTED = {"pod_uids_by_node": {"gpu-a": ["uid-1"]}}


def _harden(**extra):
    return dict({"plan": PLAN, "inline_disruptive": False, "container_runtime_steps": [{"index": 0, "nodes": ["gpu-a"]}],
                 "runtime_class": False, "device_plugin_later": True, "audited_kubelet_plan": True}, **extra)


def test_harden_s_mode_plans_the_drains_and_leaves_the_device_plugin_for_later():
    steps = _stage_steps.stage_steps(_harden(), node_name="gpu-a", gpu_pods=LISTED)
    assert {name: steps[name] for name in RUNS} == RUNS
    assert steps["container_runtime_steps"] == [{"index": 0, "nodes": ["gpu-a"]}]
    assert steps["runtime_class"] is False and steps["device_plugin"] is False and steps["budget"] is False
    assert steps["kubelet_audited_plan"] == {"changes": ["cpuManagerPolicy"]}
    assert steps["cgroup_limits_gpu_pods"] == LISTED and steps["node_name"] == "gpu-a"


def test_bootstrap_s_mode_runs_everything_here_every_node_at_once_and_reads_the_node_itself():
    steps = _stage_steps.stage_steps({"plan": PLAN, "inline_disruptive": True}, node_name="gpu-b")
    assert steps["container_runtime_steps"] == [None]
    assert steps["runtime_class"] is True and steps["device_plugin"] is True and steps["budget"] is True
    # bootstrap's audit did not check the kubelet with the role's options: the stage reads the node
    assert steps["kubelet_audited_plan"] is None and steps["cgroup_limits_gpu_pods"] is None


@pytest.mark.parametrize("gpu_pods", [None, {}, {"failed": True, "msg": "forbidden"}, "text"])
def test_a_list_that_failed_or_was_not_made_lets_the_cgroup_stage_list_itself(gpu_pods):
    assert _stage_steps.stage_steps(_harden(), node_name="gpu-a", gpu_pods=gpu_pods)["cgroup_limits_gpu_pods"] is None


def test_no_waves_means_every_node_at_once_and_the_given_node_name_wins():
    steps = _stage_steps.stage_steps(_harden(container_runtime_steps=[], node_name="node-7"), node_name="gpu-a")
    assert steps["container_runtime_steps"] == [None] and steps["node_name"] == "node-7"


@pytest.mark.parametrize(("stages", "named"), [
    ("plan", "not a mapping"),
    ({"plan": PLAN}, "__stages.inline_disruptive is missing"),
    ({"plan": PLAN, "inline_disruptive": "no"}, "__stages.inline_disruptive is 'no'"),
    ({"plan": PLAN, "inline_disruptive": True, "runtime_clas": False}, "unknown key(s) runtime_clas"),
    ({"plan": PLAN, "inline_disruptive": True, "container_runtime_steps": True}, "__stages.container_runtime_steps is True"),
    ({"plan": {"checks": {}}, "inline_disruptive": True}, "no plan.runs"),
    ({"plan": {"plan": {"runs": {"mig": True}}}, "inline_disruptive": True}, "lacks the stage(s) device_permissions"),
])
def test_bad_input_names_the_field_and_the_value(stages, named):
    with pytest.raises(GpuhardenError) as error:
        _stage_steps.stage_steps(stages, node_name="gpu-a")
    assert named in error.value.msg


@pytest.mark.parametrize(("inline", "kubelet", "mig", "expected"), [
    # harden: only the kubelet settings that need just a restart run here; the drains wait for the rollout
    (False, False, False, {"budget_wanted": False, "kubelet_apply": True, "mig_apply": False}),
    (False, True, True, {"budget_wanted": True, "kubelet_apply": False, "mig_apply": False}),
    # bootstrap: everything here, the budget asked where a plan drains
    (True, True, False, {"budget_wanted": True, "kubelet_apply": True, "mig_apply": False}),
    (True, False, True, {"budget_wanted": True, "kubelet_apply": True, "mig_apply": True}),
    (True, False, False, {"budget_wanted": False, "kubelet_apply": True, "mig_apply": False}),
])
def test_the_drains_run_inline_only_where_the_playbook_says_so(inline, kubelet, mig, expected):
    steps = _stage_steps.stage_steps(_harden(inline_disruptive=inline), node_name="gpu-a")
    assert _stage_steps.drain_steps(steps, kubelet_disruptive=kubelet, mig_disruptive=mig) == expected


def test_a_node_whose_kubelet_stage_does_not_run_writes_no_kubelet_setting():
    steps = _stage_steps.stage_steps(_harden(plan={"plan": {"runs": dict(RUNS, kubelet_topology=False)}}, inline_disruptive=True),
                                     node_name="gpu-a")
    assert _stage_steps.drain_steps(steps, kubelet_disruptive=False, mig_disruptive=False)["kubelet_apply"] is False


def test_each_include_of_stages_yml_tests_one_value_the_action_returns():
    """A key the planner does not return would only fail a lab run (an undefined variable): each include's condition,
    loop and variables read a key of step stages' result (__stages_run) or of step drains' (__stages_drains)."""
    import re
    from pathlib import Path

    import yaml

    tasks = yaml.safe_load((Path(__file__).resolve().parents[2] / "playbooks" / "tasks" / "stages.yml").read_text())
    steps = _stage_steps.stage_steps(_harden(), node_name="gpu-a")
    returned = {"__stages_run": set(steps), "__stages_drains": set(_stage_steps.drain_steps(steps, kubelet_disruptive=False, mig_disruptive=False))}
    registered = {task["register"] for task in tasks if "gpuharden.k8s.stage_steps" in task}
    assert registered == set(returned)
    read = []
    for task in tasks:
        if "ansible.builtin.include_role" in task or "ansible.builtin.include_tasks" in task:
            when = task.get("when")
            assert when is None or isinstance(when, str), "%s: one condition" % task["name"]
            text = " ".join(str(value) for value in (when, task.get("loop"), task.get("vars")) if value)
            read += re.findall(r"(__stages_(?:run|drains))\.(\w+)", text)
    assert len(read) >= 10
    # and the include of the role in tasks/stage_container_runtime.yml (its when reads step stages' result)
    wave_tasks = yaml.safe_load((Path(__file__).resolve().parents[2] / "playbooks" / "tasks" / "stage_container_runtime.yml").read_text())
    [role] = [task for task in wave_tasks if "ansible.builtin.include_role" in task]
    read += re.findall(r"(__stages_(?:run|drains))\.(\w+)", role["when"])
    assert ("__stages_run", "container_runtime_here") in read
    assert [(name, key) for name, key in read if key not in returned[name]] == []


def test_a_key_whose_variable_tags_left_undefined_takes_its_default_and_a_required_one_is_named():
    """harden's RuntimeClass gate is tagged like the stage it gates: under --tags container_runtime it never registered,
    and the include it feeds is left out by the same tags. The action templates each key of __stages alone."""
    from types import SimpleNamespace

    from ansible.errors import AnsibleUndefinedVariable
    from ansible_collections.gpuharden.k8s.plugins.action import stage_steps as action

    def template(value):
        if value == "{{ gate.run }}" or value == "{{ missing }}":
            raise AnsibleUndefinedVariable("undefined")
        return value

    step = action.ActionModule.__new__(action.ActionModule)
    step._templar = SimpleNamespace(template=template)
    stages = step._stages({"plan": PLAN, "inline_disruptive": False, "runtime_class": "{{ gate.run }}"})
    assert stages == {"plan": PLAN, "inline_disruptive": False}
    assert _stage_steps.stage_steps(stages, node_name="gpu-a")["runtime_class"] is True
    with pytest.raises(GpuhardenError, match="__stages.plan is missing"):
        _stage_steps.stage_steps(step._stages({"plan": "{{ missing }}", "inline_disruptive": True}), node_name="gpu-a")


def test_each_step_of_the_containerd_restarts_has_one_label_and_the_label_gives_the_step_back():
    """tasks/stages.yml loops over the labels; the wave action takes the step of its loop item from this result."""
    restart_steps = [{"index": 0, "nodes": ["gpu-a"]}, {"index": 1, "nodes": ["gpu-b", "gpu-c"]}, {"index": 2, "nodes": []}]
    steps = _stage_steps.stage_steps(_harden(container_runtime_steps=restart_steps), node_name="gpu-a")
    assert steps["container_runtime_waves"] == ["wave 0: gpu-a", "wave 1: gpu-b, gpu-c", "wave 2: the last wave back"]
    assert [_stage_steps.wave_step(steps, label) for label in steps["container_runtime_waves"]] == restart_steps
    # the steps whose restarts include this host (what the include of the role tests): gpu-a's canary wave only, and
    # none where its plan finds containerd as the role wants it
    assert steps["container_runtime_here"] == ["wave 0: gpu-a"]
    assert _stage_steps.stage_steps(_harden(container_runtime_steps=restart_steps), node_name="gpu-c")["container_runtime_here"] == ["wave 1: gpu-b, gpu-c"]
    compliant = _harden(plan={"plan": {"runs": dict(RUNS, container_runtime=False)}}, container_runtime_steps=restart_steps)
    assert _stage_steps.stage_steps(compliant, node_name="gpu-a")["container_runtime_here"] == []
    every = _stage_steps.stage_steps({"plan": PLAN, "inline_disruptive": True}, node_name="gpu-a")
    assert every["container_runtime_waves"] == ["every node"] and _stage_steps.wave_step(every, "every node") is None
    assert every["container_runtime_here"] == ["every node"]
    with pytest.raises(GpuhardenError, match="no step 'wave 9: gpu-z'"):
        _stage_steps.wave_step(steps, "wave 9: gpu-z")
    with pytest.raises(GpuhardenError, match="after step stages"):
        _stage_steps.wave_step(None, "every node")


def _stage_steps_action(task_vars):
    from types import SimpleNamespace

    from ansible_collections.gpuharden.k8s.plugins.action import stage_steps as action

    step = action.ActionModule.__new__(action.ActionModule)
    step._templar = SimpleNamespace(template=lambda value: value)
    step.role_variable = lambda name, default=None: task_vars.get(name, default)
    step.variable = lambda name: task_vars[name]
    return step, action


def test_step_stages_takes_the_plan_this_run_handed_over_where_stages_gives_none():
    """bootstrap_gpu_node.yml: bootstrap_node's step plan hands the engine's plan over (test_bootstrap_plan.py checks what
    it hands over); a hand-over of another run (a fact cache's) is never taken."""
    from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

    handed = {"plan": {"runs": dict(RUNS, mig=True)}, "kubelet_plan": None}
    task_vars = {"inventory_hostname": "gpu-a", "__stages": {"inline_disruptive": True}}
    step, action = _stage_steps_action(task_vars)
    steps = step.decide_task({"step": "stages"}, dict(task_vars, **_handover.handed_over(action.PLAN, handed)))
    assert steps["mig"] is True and steps["node_name"] == "gpu-a"
    # a plan in __stages (harden's) wins over a hand-over
    explicit = dict(task_vars, __stages={"plan": PLAN, "inline_disruptive": True}, **_handover.handed_over(action.PLAN, handed))
    assert step.decide_task({"step": "stages"}, explicit)["mig"] is False
    earlier = _handover.handed_over(action.PLAN, handed, run={"boot_id": "x", "pid_ns": "pid:[1]", "pid": 1, "start": 1})
    with pytest.raises(GpuhardenError, match="__stages.plan is missing"):
        step.decide_task({"step": "stages"}, dict(task_vars, **earlier))


def test_step_stages_takes_the_restarts_and_the_list_harden_handed_over():
    """harden_gpu_nodes.yml: harden_rollout step=restarts hands the containerd restarts' steps and the RuntimeClass gate
    over (no registered variable), node_plan_pods the plan's LIST; __stages' own keys win, another run's hand-overs
    (a fact cache's) are never taken."""
    from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

    waves = [{"index": 0, "nodes": ["gpu-a"]}, {"index": 1, "nodes": ["gpu-b"], "before": ["gpu-a"]}]
    restarts = {"restart_steps": waves, "restart_not_allowed": {}, "runtime_class": False, "left_cordoned": []}
    task_vars = {"inventory_hostname": "gpu-b", "__stages": {"plan": _harden()["plan"], "inline_disruptive": False}}
    step, action = _stage_steps_action(task_vars)
    handed = dict(_handover.handed_over(action.RESTARTS, restarts), **_handover.handed_over(action.GPU_PODS, LISTED))
    steps = step.decide_task({"step": "stages"}, dict(task_vars, **handed))
    assert steps["container_runtime_steps"] == waves and steps["runtime_class"] is False and steps["cgroup_limits_gpu_pods"] == LISTED
    # the mapping's own keys win
    given = dict(task_vars, __stages=dict(task_vars["__stages"], container_runtime_steps=[None], runtime_class=True), **handed)
    steps = step.decide_task({"step": "stages"}, given)
    assert steps["container_runtime_steps"] == [None] and steps["runtime_class"] is True
    # nothing handed over in this run (bootstrap, or a fact cache's from an earlier run): every node at once, the
    # RuntimeClass stage runs, the cgroup_limits stage lists itself
    earlier_run = {"boot_id": "x", "pid_ns": "pid:[1]", "pid": 1, "start": 1}
    earlier = dict(_handover.handed_over(action.RESTARTS, restarts, run=earlier_run), **_handover.handed_over(action.GPU_PODS, LISTED, run=earlier_run))
    for stale in ({}, earlier):
        steps = step.decide_task({"step": "stages"}, dict(task_vars, **stale))
        assert steps["container_runtime_steps"] == [None] and steps["runtime_class"] is True and steps["cgroup_limits_gpu_pods"] is None
def test_step_drains_reads_what_the_draining_plans_handed_over_in_this_run(monkeypatch):
    """The kubelet and MIG plans hand over whether they drain (kubelet_topology_plan, mig_plan: plan.yml's set_fact
    before); a hand-over of an earlier run (a fact cache's) counts as a plan that did not drain."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run
    from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

    this_run = {"boot_id": "b", "pid_ns": "pid:[1]", "pid": 7, "start": 9}
    monkeypatch.setattr(_handover, "this_run", lambda: this_run)
    steps = _stage_steps.stage_steps(_harden(inline_disruptive=True), node_name="gpu-a")
    task_vars = {"inventory_hostname": "gpu-a", "__stages_run": steps}
    step, _action = _stage_steps_action(task_vars)
    kubelet, mig = _harden_run.DRAINING_PLANS["kubelet_topology"], _harden_run.DRAINING_PLANS["mig"]
    handed = dict(task_vars, **_handover.handed_over(kubelet, True), **_handover.handed_over(mig, False))
    assert step.decide_task({"step": "drains"}, handed) == dict(
        _stage_steps.drain_steps(steps, kubelet_disruptive=True, mig_disruptive=False), changed=False)
    earlier = dict(handed, **_handover.handed_over(kubelet, True, run=dict(this_run, pid=6)))
    assert step.decide_task({"step": "drains"}, earlier) == dict(
        _stage_steps.drain_steps(steps, kubelet_disruptive=False, mig_disruptive=False), changed=False)
    # the two differ: the test can fail
    assert _stage_steps.drain_steps(steps, kubelet_disruptive=True, mig_disruptive=False) != _stage_steps.drain_steps(
        steps, kubelet_disruptive=False, mig_disruptive=False)
