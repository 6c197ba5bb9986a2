# SPDX-License-Identifier: GPL-3.0-or-later
"""Role node_maintenance's steps in Python (issue 45): the action gpuharden.k8s.node_maintenance_step turns the role's
node_maintenance_* variables into node_maintenance's options (the task files spelled them in Jinja before), keeps a cordon
someone else made, and gives each host its part of the batch's budget."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.action import node_maintenance_step as step

# the role defaults, templated
SETTINGS = {"node_name": "gpu-1", "kubeconfig": "", "kube_context": "", "state": "drained", "force": False, "delete_emptydir_data": False,
            "grace_period": -1, "timeout": 300, "retry_interval": 5, "owner": "", "purpose": "", "ready_timeout": 120,
            "keep_preexisting_cordon": True}


def test_the_drain_takes_the_role_defaults_and_leaves_out_what_is_unset():
    assert step.drain_args(SETTINGS) == {"nodes": ["gpu-1"], "state": "drained", "force": False, "delete_emptydir_data": False,
                                         "timeout": 300.0, "retry_interval": 5.0, "owner": "", "purpose": ""}


def test_the_drain_passes_what_is_set():
    settings = dict(SETTINGS, kubeconfig="/k", kube_context="c", state="cordoned", force="yes", delete_emptydir_data="true", grace_period="0",
                    timeout="60", retry_interval="2", owner="harden@x", purpose="mig")
    assert step.drain_args(settings) == {"nodes": ["gpu-1"], "kubeconfig": "/k", "context": "c", "state": "cordoned", "force": True,
                                         "delete_emptydir_data": True, "grace_period": 0, "timeout": 60.0, "retry_interval": 2.0,
                                         "owner": "harden@x", "purpose": "mig"}


@pytest.mark.parametrize(("keep", "preexisting", "uncordoned"), [
    (True, True, False),  # someone else's cordon stays
    (True, False, True),
    ("no", True, True),  # the role told to end it anyway
])
def test_uncordon_keeps_a_cordon_someone_else_made_before(keep, preexisting, uncordoned):
    drained = {"nodes": {"gpu-1": {"preexisting_cordon": preexisting}}}
    args = step.uncordon_args(dict(SETTINGS, keep_preexisting_cordon=keep), drained)
    assert (args is not None) is uncordoned
    if uncordoned:
        assert args == {"nodes": ["gpu-1"], "state": "uncordoned", "ready_timeout": 120, "owner": ""}


def test_uncordon_without_a_drain_of_this_run_uncordons():
    assert step.uncordon_args(SETTINGS, None)["state"] == "uncordoned"
    assert step.uncordon_args(SETTINGS, {"failed": True, "msg": "x"})["state"] == "uncordoned"


def test_the_plugin_restart():
    assert step.restart_args(dict(SETTINGS, kubeconfig="/k", timeout="60")) == {"nodes": ["gpu-1"], "kubeconfig": "/k",
                                                                                 "state": "device_plugin_restarted", "timeout": 60.0}


BUDGET = {"allowed": ["gpu-1"], "not_started": {"gpu-2": "gpu-2: disruptive step not started: disruption budget exhausted"},
          "would_defer": {"gpu-3": "gpu-3: a real run would not start the disruptive step now: stopped by gpu-9"}}


@pytest.mark.parametrize(("node", "wanted", "failure", "would_defer", "allowed_in"), [
    ("gpu-1", True, None, None, ["harden", ["a", "b"]]),
    ("gpu-1", "False", None, None, []),  # allowed, but wants no step: nothing remembered
    ("gpu-2", True, BUDGET["not_started"]["gpu-2"], None, []),
    ("gpu-3", True, None, BUDGET["would_defer"]["gpu-3"], []),
])
def test_each_host_gets_its_part_of_the_batch_s_budget(node, wanted, failure, would_defer, allowed_in):
    assert step.budget_verdict(node, BUDGET, wanted, "harden", ("a", "b")) == (failure, would_defer, allowed_in)


def _plugin(args, variables, delegate_to="localhost"):
    from unittest import mock

    from ansible.errors import AnsibleUndefinedVariable

    def resolve(expression):
        if expression not in variables:
            raise AnsibleUndefinedVariable("%r is undefined" % expression)
        return variables[expression]

    task = mock.MagicMock(args=args, check_mode=False, async_val=0, diff=False, delegate_to=delegate_to)
    templar = mock.MagicMock(resolve_variable_expression=mock.MagicMock(side_effect=resolve))
    plugin = step.ActionModule(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(), templar, mock.MagicMock())
    plugin._execute_module = mock.MagicMock(return_value={"changed": True, "nodes": {}})
    return plugin


ROLE_VARIABLES = dict({"node_maintenance_" + name: value for name, value in SETTINGS.items()}, node_maintenance_budget_wanted=True,
                      node_maintenance_controller_python="/controller/venv/bin/python")


@pytest.mark.parametrize("name", ["cordon_drain", "uncordon", "restart_device_plugin"])
def test_each_step_runs_node_maintenance_with_the_role_s_controller_python(name):
    """The role's task files name no interpreter: the action gives the module node_maintenance_controller_python on the
    controller (the task is delegated there), never the play's node Python."""
    plugin = _plugin({"step": name}, ROLE_VARIABLES)
    plugin.run(task_vars={"ansible_python_interpreter": "/node/venv/bin/python"})
    task_vars = plugin._execute_module.call_args.kwargs["task_vars"]
    assert task_vars["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"] == "/controller/venv/bin/python"
    without = {name: value for name, value in ROLE_VARIABLES.items() if name != "node_maintenance_controller_python"}
    plugin = _plugin({"step": name}, without)
    plugin.run(task_vars={"ansible_playbook_python": "/usr/bin/python3"})
    assert plugin._execute_module.call_args.kwargs["task_vars"]["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"] == "/usr/bin/python3"


@pytest.mark.parametrize(("wanted", "recorded"), [(True, True), ("no", False)])
def test_the_budget_record_is_this_host_s_fact(wanted, recorded):
    plugin = _plugin({"step": "budget_record"}, dict(ROLE_VARIABLES, node_maintenance_budget_wanted=wanted), delegate_to=None)
    result = plugin.run(task_vars={})
    assert result == {"changed": False, "ansible_facts": {"gpuharden_budget_record": {"node": "gpu-1", "wanted": recorded}}}
    plugin._execute_module.assert_not_called()


def test_the_uncordon_takes_the_drain_this_run_handed_over():
    """cordon_drain hands its result over to uncordon (it registered __node_maintenance_drain before): a cordon someone
    else made before the drain stays; a drain an earlier run handed over (a fact cache kept it) decides nothing."""
    from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

    drainer = _plugin({"step": "cordon_drain"}, ROLE_VARIABLES)
    drainer._execute_module.return_value = {"changed": True, "nodes": {"gpu-1": {"preexisting_cordon": True}}, "invocation": {}}
    drained = drainer.run(task_vars={})
    assert drained["nodes"] == {"gpu-1": {"preexisting_cordon": True}}
    kept = _plugin({"step": "uncordon"}, ROLE_VARIABLES)
    result = kept.run(task_vars=dict(drained["ansible_facts"]))
    assert result["skipped"] and "stays cordoned" in result["skip_reason"]
    kept._execute_module.assert_not_called()
    earlier = _handover.handed_over(step.DRAIN, drained["ansible_facts"][step.DRAIN]["value"], run=dict(_handover.this_run(), pid=1, start=0))
    stale = _plugin({"step": "uncordon"}, ROLE_VARIABLES)
    stale.run(task_vars={"ansible_facts": earlier})
    assert stale._execute_module.call_args.kwargs["module_args"]["state"] == "uncordoned"


def test_the_verdict_takes_the_budget_the_batch_s_budget_task_handed_over():
    from ansible.errors import AnsibleActionFail
    from ansible_collections.gpuharden.k8s.plugins.action import node_maintenance_budget
    from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

    handed = _handover.handed_over(node_maintenance_budget.BUDGET, BUDGET)
    verdict = _plugin({"step": "budget_verdict"}, ROLE_VARIABLES, delegate_to=None)
    assert verdict.run(task_vars=dict(handed, ansible_play_name="harden", ansible_play_batch=["a"]))["allowed_in"] == ["harden", ["a"]]
    refused = _plugin({"step": "budget_verdict"}, dict(ROLE_VARIABLES, node_maintenance_node_name="gpu-2"), delegate_to=None)
    with pytest.raises(AnsibleActionFail, match="disruption budget exhausted"):
        refused.run(task_vars=dict(handed, ansible_play_name="harden", ansible_play_batch=["a"]))
    # no budget of this run: nothing allowed, nothing refused
    assert verdict.run(task_vars={"ansible_play_name": "harden", "ansible_play_batch": ["a"]})["allowed_in"] == []
