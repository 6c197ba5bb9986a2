# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 1: roles/node_maintenance budget.yml's batch, the nodes that stop the rollout and the deferral lines,
once Jinja, decided once for the batch in Python (plugins/action/node_maintenance_budget.py).  disruption_budget is
replaced by a recorder of the _execute_module calls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible_collections.gpuharden.k8s.plugins.action import node_maintenance_budget as nmb


def _record(node, wanted):
    return {"ansible_facts": {"gpuharden_budget_record": {"node": node, "wanted": wanted}}}


HOSTVARS = {
    "a": _record("na", True),
    "b": _record("nb", "False"),
    "c": {"ansible_facts": {}},  # the role was not included here
    "d": _record("nd", "true"),
    "e": _record("ne", True),  # gone from the play
}


def _run(monkeypatch, args, budget, check_mode=False, batch=("a", "b", "c", "d")):
    calls = []

    def execute(self, module_name, module_args, task_vars):
        calls.append((module_name, module_args, self._task.check_mode))
        return dict(budget)

    monkeypatch.setattr(nmb.ActionModule, "_execute_module", execute)
    task = SimpleNamespace(args=dict({"max_unavailable": "1"}, **args), async_val=0, check_mode=check_mode, diff=False, action="x",
                           delegate_to="localhost")
    action = nmb.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None, None, None)
    result = action.run(task_vars={"hostvars": HOSTVARS, "ansible_play_batch": list(batch), "ansible_play_hosts": ["a", "b", "c", "d"],
                                   "ansible_play_hosts_all": ["a", "b", "c", "d", "e"]})
    assert task.check_mode is check_mode
    return result, calls


def test_the_batch_and_the_nodes_that_stop_the_rollout(monkeypatch):
    budget = {"changed": False, "allowed": ["na"], "deferred": {"nd": "budget exhausted (1 of 1 in use)"}}
    result, calls = _run(monkeypatch, {"stopped_by": ["nx"], "fleet": ["na", "nb", "nd", "ne"], "kubeconfig": "/k"}, budget)
    assert calls == [("gpuharden.k8s.disruption_budget",
                      {"max_unavailable": "1", "fleet": ["na", "nb", "nd", "ne"], "batch": ["na", "nd"], "out_of_service_taints": [],
                       "stopped_by": ["nx", "ne"], "kubeconfig": "/k"}, False)]
    assert result["allowed"] == ["na"] and result["would_defer"] == {}
    assert result["not_started"] == {"nd": "nd: disruptive step not started: budget exhausted (1 of 1 in use) (a play that runs the change on "
                                           "several nodes at once: serial 1, or a larger node_maintenance_max_unavailable)"}
    _result, calls = _run(monkeypatch, {"stop_on_failure": False}, budget)
    assert calls[0][1]["stopped_by"] == []


def test_check_mode_reads_the_budget_and_only_says_what_a_real_run_would_defer(monkeypatch):
    result, calls = _run(monkeypatch, {}, {"allowed": [], "deferred": {"na": "stopped by nx"}}, check_mode=True)
    assert len(calls) == 1 and calls[0][2] is False
    assert result["not_started"] == {} and result["would_defer"] == {"na": "na: a real run would not start the disruptive step now: stopped by nx"}


def test_no_host_wanting_a_step_reads_nothing(monkeypatch):
    result, calls = _run(monkeypatch, {}, {}, batch=("b", "c"))
    assert calls == [] and result["allowed"] == [] and result["not_started"] == {} and "skipped_reason" in result


def test_a_budget_that_cannot_be_read_fails_the_task(monkeypatch):
    with pytest.raises(AnsibleActionFail, match="could not be checked: no API"):
        _run(monkeypatch, {}, {"failed": True, "msg": "no API"})


def test_the_budget_runs_disruption_budget_with_the_controller_s_python(monkeypatch):
    """The task in budget.yml names no interpreter: the action gives the module the role's controller Python (else the
    playbook's), never the play's node Python, which a task delegated to localhost would otherwise take."""
    seen = []
    monkeypatch.setattr(nmb.ActionModule, "_execute_module", lambda self, module_name, module_args, task_vars: seen.append(task_vars) or {"allowed": []})
    task = SimpleNamespace(args={"max_unavailable": "1"}, async_val=0, check_mode=False, diff=False, action="x", delegate_to="localhost")
    action = nmb.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None, None, None)
    action.run(task_vars={"hostvars": HOSTVARS, "ansible_play_batch": ["a"], "ansible_play_hosts": ["a"], "ansible_play_hosts_all": ["a"],
                          "ansible_python_interpreter": "/node/venv/bin/python", "ansible_playbook_python": "/controller/bin/python"})
    assert seen[0]["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"] == "/controller/bin/python"


def test_the_budget_is_handed_over_to_the_batch(monkeypatch):
    """budget.yml registers nothing: the budget task's facts hand its result over (every host of the batch gets them,
    run_once), stamped with this run; a batch without a wanted step hands over an empty budget."""
    from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

    result, _calls = _run(monkeypatch, {}, {"allowed": ["na"], "deferred": {"nd": "budget exhausted"}})
    handed = _handover.taken_over(result["ansible_facts"], nmb.BUDGET)
    assert handed["allowed"] == ["na"] and handed["not_started"] == result["not_started"] and "ansible_facts" not in handed
    empty, _calls = _run(monkeypatch, {}, {}, batch=("b", "c"))
    assert _handover.taken_over(empty["ansible_facts"], nmb.BUDGET)["allowed"] == []
