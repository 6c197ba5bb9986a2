# SPDX-License-Identifier: GPL-3.0-or-later
"""The MIG stage in Python (issue 45): the action gpuharden.k8s.mig_plan's decide(), which roles/mig/tasks/plan.yml calls
(a set_fact chain and a block decided it in Jinja before), and the steps of gpuharden.k8s.mig_stage, which apply.yml calls."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.action import mig_plan, mig_stage
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError


@pytest.mark.parametrize(("planned", "disruptive"), [
    ({"changed": True, "reset_required": False}, True),  # a layout change drains the node
    ({"changed": False, "reset_required": True}, True),  # a mode change that waits for a reset too
    ({"changed": False, "reset_required": False}, False),
])
def test_a_layout_change_or_a_pending_reset_is_disruptive(planned, disruptive):
    result = mig_plan.decide([], lambda: dict(planned, advertised_resources={}))
    assert result["disruptive"] is disruptive and result["changed"] is planned["changed"] and "advertised_resources" in result


def test_a_layout_the_gpu_operator_owns_is_not_planned_and_the_refusal_is_said():
    refused = [{"what": "mig", "why": "the GPU Operator's MIG manager owns the layout", "fix": "set gpuharden_operator_takeover"}]
    calls = []
    result = mig_plan.decide(refused, lambda: calls.append(1))
    assert calls == [] and result["refused"] == refused and result["disruptive"] is False and result["changed"] is False
    assert result["warnings"] == ["mig: layout left alone: mig: the GPU Operator's MIG manager owns the layout; fix: set gpuharden_operator_takeover"]


def test_a_failed_plan_is_the_tasks_failure():
    failed = {"failed": True, "msg": "GPU processes run on GPUs the MIG plan touches: GPU 3 (00000000:5D:00.0) pids 4711"}
    assert mig_plan.decide([], lambda: dict(failed)) == failed


def _plan_action(variables, layout):
    action = mig_plan.ActionModule.__new__(mig_plan.ActionModule)
    action.variable = lambda name: variables[name]
    action.run_module = lambda name, options, task_vars: dict(layout)
    return action


@pytest.mark.parametrize(("refused", "layout", "disruptive"), [
    ([], {"changed": True, "reset_required": False}, True),
    ([], {"changed": False, "reset_required": False}, False),
    ([{"what": "mig", "why": "the operator owns it", "fix": "takeover"}], {"changed": True}, False),
])
def test_the_plan_hands_over_whether_it_drains_to_the_rollout_of_this_run_only(monkeypatch, refused, layout, disruptive):
    """plan.yml published __mig_disruptive with set_fact (defined = the plan ran): the action hands it over now, and
    harden_node step=draining and the rollout read that hand-over of this run (a fact cache's of an earlier run: no plan)."""
    from ansible_collections.gpuharden.k8s.plugins.action import harden_rollout
    from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run
    from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

    this_run = {"boot_id": "b", "pid_ns": "pid:[1]", "pid": 7, "start": 9}
    monkeypatch.setattr(_handover, "this_run", lambda: this_run)
    variables = {"__mig_operator_refused": refused, "__mig_module_options": {}, "mig_drain": True}
    planned = _plan_action(variables, layout).decide_task({"refused": None, "options": None}, {})
    assert _harden_run.DRAINING_PLANS["mig"] == mig_plan.DISRUPTIVE
    assert planned["ansible_facts"] == _handover.handed_over(mig_plan.DISRUPTIVE, disruptive)
    host = dict(planned["ansible_facts"], gpuharden_node_plan={"plan": {"runs": {"mig": True}}})
    assert harden_rollout.host_view("gpu-1", host)["disruptive"] is disruptive and harden_rollout.host_view("gpu-1", host)["unplanned"] == []
    assert _harden_run.draining_steps(None, {"mig": _handover.taken_over(host, mig_plan.DISRUPTIVE)})["mig"] is disruptive
    monkeypatch.setattr(_handover, "this_run", lambda: dict(this_run, pid=8))
    assert harden_rollout.host_view("gpu-1", host)["unplanned"] == ["mig"]


def test_a_failed_plan_hands_nothing_over():
    failed = {"failed": True, "msg": "GPU processes run on GPUs the MIG plan touches"}
    planned = _plan_action({"__mig_operator_refused": [], "__mig_module_options": {}, "mig_drain": True}, failed).decide_task(
        {"refused": None, "options": None}, {})
    assert planned == failed


# The apply's steps (the action gpuharden.k8s.mig_stage, roles/mig/tasks/apply.yml): a chain of set_fact, fail, command
# and assert tasks with Jinja conditions decided them before.
PENDING = {"changed": True, "reset_required": True, "gpus_to_reset": ["00000000:5D:00.0"], "after": {}}


def test_apply_runs_only_where_the_plan_is_disruptive():
    calls = []
    skipped = mig_stage.decide_apply({"disruptive": False}, "command", False, lambda: calls.append(1))
    assert calls == [] and skipped["skipped"] is True and skipped["reset"] is False and skipped["reboot"] is False
    applied = mig_stage.decide_apply({"disruptive": True}, "command", False, lambda: {"changed": True, "gpus_to_reset": []})
    assert applied["changed"] is True and applied["reset"] is False and applied["reboot"] is False


@pytest.mark.parametrize(("method", "reset", "reboot"), [("command", True, False), ("reboot", False, True)])
def test_a_pending_mode_change_is_reset_the_configured_way(method, reset, reboot):
    applied = mig_stage.decide_apply({"disruptive": True}, method, False, lambda: dict(PENDING))
    assert (applied["reset"], applied["reboot"], applied["gpus_to_reset"]) == (reset, reboot, ["00000000:5D:00.0"])


def test_a_pending_mode_change_without_a_reset_method_fails_the_host_but_not_in_check_mode():
    with pytest.raises(GpuhardenError, match=r"^MIG mode change pending on 00000000:5D:00.0: reset these GPUs .*\(mig_reset_method is none\)\.$") as error:
        mig_stage.decide_apply({"disruptive": True}, "none", False, lambda: dict(PENDING))
    assert error.value.result == {"changed": True}
    planned = mig_stage.decide_apply({"disruptive": True}, "none", True, lambda: dict(PENDING))
    assert planned["reset"] is False and planned["reboot"] is False


def test_the_reset_runs_the_command_outside_check_mode_only():
    ran = []
    applied = dict(PENDING, reset=True)
    assert mig_stage.decide_reset({"reset": False}, False, [], ran.append)["skipped"] is True
    checked = mig_stage.decide_reset(applied, True, ["nvidia-smi", "-r", "-i", "00000000:5D:00.0"], ran.append)
    assert ran == [] and checked["skipped"] is True and "would reset 00000000:5D:00.0" in checked["skip_reason"]
    result = mig_stage.decide_reset(applied, False, ["nvidia-smi", "-r"], lambda argv: ran.append(argv) or {"rc": 0, "changed": False})
    assert ran == [["nvidia-smi", "-r"]] and result["changed"] is True


def test_reapply_after_a_reset_publishes_its_result_and_fails_where_the_change_is_still_pending():
    plan, applied = {"disruptive": True, "changed": True}, dict(PENDING, reset=True, reboot=False)
    converged = {"changed": True, "reset_required": False, "after": {"3": "x"}}
    result = mig_stage.decide_reapply(plan, applied, False, True, True, lambda: dict(converged))
    assert result["mig_result"] == converged and result["follow_up"] == {"device_nodes": True, "restart_device_plugin": True}
    with pytest.raises(GpuhardenError, match="MIG mode change still pending after the reset on 00000000:5D:00.0"):
        mig_stage.decide_reapply(plan, applied, False, True, True, lambda: dict(PENDING))


@pytest.mark.parametrize(("applied", "check_mode", "published"), [
    ({"changed": True, "reset": False, "reboot": False}, False, "apply"),  # no reset: nothing applied again
    (dict(PENDING, reset=True, reboot=False), True, "apply"),  # check mode: nothing reset, nothing applied again
    ({"skipped": True, "changed": False, "reset": False, "reboot": False}, False, "plan"),  # nothing planned
])
def test_without_a_reset_nothing_is_applied_again_and_the_last_step_that_ran_is_published(applied, check_mode, published):
    plan = {"disruptive": not applied.get("skipped"), "changed": False}
    calls = []
    result = mig_stage.decide_reapply(plan, applied, check_mode, True, True, lambda: calls.append(1))
    assert calls == [] and result["changed"] is False
    assert result["mig_result"] is (applied if published == "apply" else plan)
    changed = not applied.get("skipped")
    assert result["follow_up"] == {"device_nodes": changed, "restart_device_plugin": changed}


def test_the_follow_ups_respect_the_skipped_tag_and_mig_restart_device_plugin():
    applied = {"changed": True, "reset": False, "reboot": False}
    result = mig_stage.decide_reapply({"disruptive": True}, applied, False, False, False, lambda: {})
    assert result["follow_up"] == {"device_nodes": False, "restart_device_plugin": False}
    unchanged = mig_stage.decide_reapply({"disruptive": True}, {"changed": False, "reset": False}, False, True, True, lambda: {})
    assert unchanged["follow_up"] == {"device_nodes": False, "restart_device_plugin": False}


def test_the_plan_says_whether_the_node_is_drained():
    assert mig_plan.decide([], lambda: {"changed": True}, drain=True)["drain"] is True
    assert mig_plan.decide([], lambda: {"changed": True}, drain=False)["drain"] is False
    assert mig_plan.decide([], lambda: {"changed": False, "reset_required": False}, drain=True)["drain"] is False
