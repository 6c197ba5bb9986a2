# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 1: harden's rollout decided once for the batch in Python (plugins/action/harden_rollout.py over
module_utils/core/_stage_plan.py), where harden_gpu_nodes.yml decided it in Jinja: the fleet read before the stages
(containerd's restart waves), the cordons an ended run left, the budget read, each host's rollout group and the second
play's batch size.  disruption_budget is replaced by a recorder of the _execute_module calls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible_collections.gpuharden.k8s.plugins.action import harden_rollout, node_plan_pods
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _stage_plan as sp
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

# this ansible-playbook run, as plugin_utils/_handover.py stamps a hand-over
THIS_RUN = {"boot_id": "b", "pid_ns": "pid:[1]", "pid": 7, "start": 9}
EARLIER_RUN = dict(THIS_RUN, pid=6)


def _failed(why, stamp=THIS_RUN):
    """harden_node step=failed's hand-over, as a variable of the host."""
    return _handover.handed_over("__harden_failed", why, run=stamp)["__harden_failed"]


def _plan(disruptive, stamp=THIS_RUN):
    """A draining stage's plan hand-over (kubelet_topology_plan, mig_plan), as a variable of the host."""
    return _handover.handed_over("__plan", disruptive, run=stamp)["__plan"]


def _host(node, runs=None, **variables):
    return dict({"__harden_node": node, "gpuharden_node_plan": {"plan": {"runs": dict({"container_runtime": False}, **(runs or {}))}}},
                **variables)


class NoHostvars(dict):
    """hostvars that fail the test where a host's variables are read (each read is a variable merge per host)."""

    def __getitem__(self, host):
        raise AssertionError("read the variables of %s" % host)


class Templar:
    @staticmethod
    def template(value):
        return value


def _run(monkeypatch, args, hostvars, budget=None, check_mode=False, **task_vars):
    calls = []

    def execute(self, module_name, module_args, task_vars):
        calls.append((module_name, module_args, self._task.check_mode))
        return dict(budget or {})

    monkeypatch.setattr(harden_rollout.ActionModule, "_execute_module", execute)
    monkeypatch.setattr(_handover, "this_run", lambda: THIS_RUN)
    task = SimpleNamespace(args=args, async_val=0, check_mode=check_mode, diff=False, action="gpuharden.k8s.harden_rollout")
    action = harden_rollout.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None, Templar(), None)
    localhost = task_vars.pop("hostvars_localhost", None)
    variables = dict({"hostvars": hostvars, "ansible_play_hosts": list(hostvars), "ansible_play_hosts_all": list(hostvars)}, **task_vars)
    if localhost is not None:
        variables["hostvars"] = dict(hostvars, localhost={"ansible_facts": {"__harden_rollout_plan": localhost}})
    result = action.run(task_vars=variables)
    assert task.check_mode is check_mode  # the budget read ran outside check mode, and the task's mode is back
    return result, calls


def test_nothing_cluster_side():
    clean = {"changed": False}
    assert sp.nothing_cluster_side(skip_compliant=True, gpu_node_set=False, whole_play=True, device_plugin_dry_run=clean) is True
    for changed in ({"skip_compliant": False}, {"gpu_node_set": True}, {"whole_play": False}, {"device_plugin_dry_run": None},
                    {"device_plugin_dry_run": {"changed": True}}, {"device_plugin_dry_run": {"failed": True, "changed": False}},
                    {"device_plugin_dry_run": {}}):
        options = dict({"skip_compliant": True, "gpu_node_set": False, "whole_play": True, "device_plugin_dry_run": clean}, **changed)
        assert sp.nothing_cluster_side(**options) is False, changed


def test_cordon_plan():
    hosts = [{"host": "a", "node": "na", "disruptive": False, "unplanned": []},
             {"host": "b", "node": "nb", "disruptive": True, "unplanned": []},
             {"host": "c", "node": "nc", "disruptive": False, "unplanned": ["kubelet_topology", "mig"]},
             {"host": "d", "node": "nd", "disruptive": False, "unplanned": []}]
    left = [{"node": "na", "record": {"owner": "harden@1"}}, {"node": "nb", "record": {}}, {"node": "nc", "record": {"owner": "harden@2"}}]
    plan = sp.cordon_plan(hosts, left)
    # a: nothing to drain it for; b: the rollout takes its cordon on; c: a draining step left out by --tags; d: not cordoned
    assert plan["release"] == ["a"]
    assert list(plan["kept"]) == ["c"]
    assert plan["kept"]["c"].startswith("nc stays cordoned, as harden@2 left it: the node's kubelet_topology and mig check is not ok")
    assert sp.cordon_plan(hosts, []) == {"release": [], "kept": {}}


def test_rollout_plan():
    hosts = [{"host": "a", "node": "na", "disruptive": True}, {"host": "b", "node": "nb", "disruptive": True},
             {"host": "c", "node": "nc", "disruptive": False}]
    plan = sp.rollout_plan(hosts, {"budget": 2, "unavailable": [{"node": "nb"}, {"node": "nz"}]})
    assert plan["groups"] == {"a": "gpuharden_rollout_then", "b": "gpuharden_rollout_first", "c": "gpuharden_no_rollout"}
    # nz, unavailable outside the rollout, takes one of the two
    assert plan["batch"] == 1 and plan["disruptive"] == ["na", "nb"]
    assert sp.rollout_plan(hosts[2:], None) == {"groups": {"c": "gpuharden_no_rollout"}, "disruptive": [], "batch": None}


def test_restarts_reads_the_fleet_once_outside_check_mode(monkeypatch):
    hostvars = {"a": _host("na", {"container_runtime": True}), "b": _host("nb"), "c": {"__harden_node": "nc"}}
    budget = {"restart_steps": [{"index": 0, "nodes": ["na"]}], "restart_deferred": {"na": "budget exhausted"},
              "left_cordoned": [{"node": "nb", "record": {}}]}
    result, calls = _run(monkeypatch, {"step": "restarts"}, hostvars, budget, gpuharden_max_unavailable="25%", gpuharden_kubeconfig="/k")
    assert calls == [("gpuharden.k8s.disruption_budget", {"max_unavailable": "25%", "fleet": ["na", "nb", "nc"], "kubeconfig": "/k",
                                                          "restarts": ["na"], "settle_seconds": 0}, False)]
    assert result["restart_steps"] == budget["restart_steps"] and result["left_cordoned"] == budget["left_cordoned"]
    assert result["restart_not_allowed"] == {"a": "containerd not changed: budget exhausted"}
    assert result["changed"] is False
    # check mode: the same read, but every node's stage at once and no node refused
    result, calls = _run(monkeypatch, {"step": "restarts"}, hostvars, budget, check_mode=True)
    assert len(calls) == 1 and calls[0][1]["max_unavailable"] == "1" and "kubeconfig" not in calls[0][1]
    assert result["restart_steps"] == [None] and result["restart_not_allowed"] == {} and result["left_cordoned"] == budget["left_cordoned"]


def test_restarts_reads_nothing_where_the_tags_select_no_node_stage(monkeypatch):
    hostvars = {"a": _host("na", {"container_runtime": True})}
    result, calls = _run(monkeypatch, {"step": "restarts"}, hostvars, ansible_run_tags=["device_plugin", "postcheck"])
    assert calls == [] and result["restart_steps"] == [None] and result["left_cordoned"] == [] and "skipped_reason" in result
    _result, calls = _run(monkeypatch, {"step": "restarts"}, hostvars, {"restart_steps": []}, ansible_run_tags=["mig"])
    assert len(calls) == 1


def test_a_budget_that_cannot_be_read_fails_the_task(monkeypatch):
    with pytest.raises(AnsibleActionFail, match="the disruption budget could not be read: no API"):
        _run(monkeypatch, {"step": "restarts"}, {"a": _host("na")}, {"failed": True, "msg": "no API"})


def test_the_rollout_step_releases_the_cordons_an_ended_run_left_before_it_reads_the_budget(monkeypatch):
    """The cordons an ended run left (harden_gpu_nodes.yml's two tasks per host once): released where this run has nothing
    to drain the node for, one node_maintenance run per lock owner, before the budget read; kept with why elsewhere."""
    hostvars = {"a": _host("na", {"kubelet_topology": True}, __kubelet_topology_disruptive=_plan(False), __harden_owner="harden@a"),
                # its kubelet plan did not run (--tags): what it handed over in an earlier run (a fact cache) counts for nothing
                "b": _host("nb", {"kubelet_topology": True}, __kubelet_topology_disruptive=_plan(True, EARLIER_RUN), __harden_owner="harden@b"),
                "c": _host("nc", __mig_disruptive=_plan("True"), __harden_owner="harden@c"),
                "d": _host("nd", __harden_owner="harden@a")}
    left = [{"node": node, "record": {"owner": "harden@old"}} for node in ("na", "nb", "nc", "nd")]
    budget = {"budget": 1, "unavailable": [{"node": "nc"}], "changed": True, "released": ["na", "nd"]}
    result, calls = _run(monkeypatch, {"step": "rollout", "left_cordoned": left}, hostvars, budget)
    assert calls[0] == ("gpuharden.k8s.node_maintenance", {"nodes": ["na", "nd"], "state": "released", "owner": "harden@a", "ready_timeout": 60},
                        False)
    assert [call[0] for call in calls] == ["gpuharden.k8s.node_maintenance", "gpuharden.k8s.disruption_budget"]
    assert result["release"] == ["a", "d"] and list(result["kept"]) == ["b"] and result["kept"]["b"].startswith("nb stays cordoned, as harden@old")
    assert result["release_failed"] == {} and result["changed"] is True and result["groups"]["c"] == "gpuharden_rollout_first"
    # the Nodes released, as node_maintenance names them (tests/integration/test_rollout.py reads them), each host's run
    assert result["released"] == ["na", "nd"] and result["release_results"]["d"]["released"] == ["na", "nd"]
    # a release that fails fails its hosts (the next task), not the others; in check mode too (the module's own check mode)
    hostvars["c"]["__mig_disruptive"] = _plan(False)
    result, calls = _run(monkeypatch, {"step": "rollout", "left_cordoned": left}, hostvars, {"failed": True, "msg": "nd not Ready"},
                         check_mode=True)
    # c has nothing to drain now: released too, in its own owner's run
    assert sorted(result["release_failed"]) == ["a", "c", "d"] and "nd not Ready" in result["release_failed"]["a"]
    # nothing left cordoned: no release run
    result, calls = _run(monkeypatch, {"step": "rollout"}, hostvars, budget)
    assert calls == [] and result["release"] == [] and result["changed"] is False


def test_rollout_reads_the_budget_only_where_a_node_drains(monkeypatch):
    hostvars = {"a": _host("na", __kubelet_topology_disruptive=_plan(True), container_runtime_result={"restarted": True}),
                "b": _host("nb", __mig_disruptive=_plan(False), __kubelet_topology_config={"restarted": True}),
                "c": _host("nc")}
    budget = {"budget": 3, "unavailable": [{"node": "nc"}]}
    result, calls = _run(monkeypatch, {"step": "rollout"}, hostvars, budget, check_mode=True, gpuharden_restart_settle_seconds="30")
    assert calls == [("gpuharden.k8s.disruption_budget", {"max_unavailable": "1", "fleet": ["na", "nb", "nc"], "settle_nodes": ["na", "nb"],
                                                          "settle_seconds": 30}, False)]
    assert result["groups"] == {"a": "gpuharden_rollout_then", "b": "gpuharden_no_rollout", "c": "gpuharden_no_rollout"}
    # on localhost (delegate_facts): each host's group and failed release (harden_node step=verdict of=cordons reads
    # them), the second play's batch size and the fleet
    plan = {"run": None, "first": [], "then": ["a"], "hosts": ["a"], "serial": [1, 2], "batch": 2, "fleet": ["na", "nb", "nc"],
            "release_failed": {}}
    assert result["ansible_facts"] == {"__harden_rollout_plan": plan}
    # the next batch of the first play adds its hosts (its plan on localhost, of the same run): no host drains there,
    # so the batch size of the one before stands
    hostvars["a"]["__kubelet_topology_disruptive"] = _plan(False)
    result, calls = _run(monkeypatch, {"step": "rollout"}, hostvars, budget, hostvars_localhost=plan)
    assert calls == [] and result["batch"] is None and set(result["groups"].values()) == {"gpuharden_no_rollout"}
    assert result["ansible_facts"]["__harden_rollout_plan"] == plan


def test_a_wave_of_containerd_restarts_waits_for_the_previous_one_and_stops_at_a_failed_node(monkeypatch):
    # each host's Node as tasks/stages.yml's step stages registered it (in hostvars, where an include's variable is not)
    hostvars = {host: {"__stages_run": {"node_name": node}} for host, node in (("a", "na"), ("b", "nb"), ("c", "nc"), ("gone", "ng"))}
    wave = {"index": 1, "nodes": ["nb", "nc"], "settle": ["na"], "before": ["na", "ng"]}
    stopped = {"stopped": "na is not Ready", "settle": {"not_ready": {"na": ["NotReady"]}}}
    result, calls = _run(monkeypatch, {"step": "wave", "wave": wave}, hostvars, stopped, ansible_play_hosts=["a", "b", "c"],
                         gpuharden_restart_settle_seconds=30)
    assert calls == [("gpuharden.k8s.disruption_budget", {"max_unavailable": "1", "settle_nodes": ["na"], "settle_seconds": 30,
                                                          "settle_required": True, "stopped_by": ["ng"]}, False)]
    assert result["not_started"] == {"a": "containerd was restarted, and the node is not Ready 30 s later: NotReady",
                                     "b": "containerd not restarted, the restarts stopped: na is not Ready",
                                     "c": "containerd not restarted, the restarts stopped: na is not Ready"}
    result, _calls = _run(monkeypatch, {"step": "wave", "wave": wave}, hostvars, {"stopped": None, "settle": {"not_ready": {}}})
    assert result["not_started"] == {}
    # the first wave, or every node at once (bootstrap, check mode): nothing to wait for, no API call, no host's
    # variables read
    for first in ({"index": 0, "nodes": ["na"]}, None):
        result, calls = _run(monkeypatch, {"step": "wave", "wave": first}, NoHostvars(hostvars))
        assert calls == [] and result["not_started"] == {} and result["changed"] is False


def test_the_fleet_read_and_the_wave_gate_keep_disruption_budgets_keys(monkeypatch):
    """The lab tests (tests/integration/test_rollout.py) read restart_waves, stopped and settle on these tasks."""
    budget = {"changed": False, "restart_waves": [["na"]], "restart_steps": [], "stopped": None, "settle": {"not_ready": {}}}
    result, _calls = _run(monkeypatch, {"step": "restarts"}, {"a": _host("na")}, budget)
    assert result["restart_waves"] == [["na"]] and result["stopped"] is None and "invocation" not in result
    result, _calls = _run(monkeypatch, {"step": "wave", "wave": {"index": 1, "nodes": [], "settle": ["na"]}},
                          {"a": {"__stages_run": {"node_name": "na"}}}, budget)
    assert result["stopped"] is None and result["settle"] == {"not_ready": {}} and result["not_started"] == {}


def test_restarts_decides_the_runtime_class_stage_for_the_batch(monkeypatch):
    """The RuntimeClass gate (cluster_stage_gate.runtime_class_gate) with the fleet read, for the batch's hosts but those
    the verdict right after fails for their restart (as when the gate was its own task after that verdict)."""
    # the plan's LIST with its dry runs: node_plan_pods' hand-over to every host of the batch
    quiet = _handover.handed_over(node_plan_pods.LISTED, {"runtime_class_check": {"changed": False, "findings": []}}, run=THIS_RUN)
    hostvars = {"a": _host("na", {"container_runtime": True}, **quiet), "b": _host("nb", **quiet)}
    budget = {"restart_steps": [None], "restart_deferred": {}}
    result, _calls = _run(monkeypatch, {"step": "restarts"}, hostvars, budget, ansible_play_batch=["a", "b"])
    assert result["runtime_class"] is True and "containerd changes" in result["runtime_class_why"]
    result, _calls = _run(monkeypatch, {"step": "restarts"}, hostvars, budget, ansible_play_batch=["b"])
    assert result["runtime_class"] is False
    # handed over to every host of the batch (run_once's facts): what the stages, the verdict and step rollout take
    assert _handover.taken_over(result["ansible_facts"], harden_rollout._harden_run.RESTARTS, run=THIS_RUN) == {
        "restart_steps": [None], "restart_not_allowed": {}, "runtime_class": False, "left_cordoned": []}
    # a listing an earlier run handed over (a fact cache kept it) is no dry run: the stage runs
    earlier = _handover.handed_over(node_plan_pods.LISTED, {"runtime_class_check": {"changed": False, "findings": []}},
                                    run=dict(THIS_RUN, pid=6))
    result, _calls = _run(monkeypatch, {"step": "restarts"}, {"b": _host("nb", **earlier)}, budget, ansible_play_batch=["b"])
    assert result["runtime_class"] is True
    # a's restart is not allowed: a fails right after, and its containerd does not change
    result, _calls = _run(monkeypatch, {"step": "restarts"}, hostvars, dict(budget, restart_deferred={"na": "budget exhausted"}),
                          ansible_play_batch=["a", "b"])
    assert result["restart_not_allowed"] == {"a": "containerd not changed: budget exhausted"} and result["runtime_class"] is False
    # the plan's dry run would change something: the stage runs
    hostvars["b"].update(_handover.handed_over(node_plan_pods.LISTED, {"runtime_class_check": {"changed": True, "findings": []}},
                                               run=THIS_RUN))
    result, _calls = _run(monkeypatch, {"step": "restarts"}, hostvars, budget, ansible_play_batch=["b"])
    assert result["runtime_class"] is True
    # --tags without a node stage: no fleet read, the gate still decided
    result, calls = _run(monkeypatch, {"step": "restarts"}, hostvars, budget, ansible_play_batch=["b"], ansible_run_tags=["runtime_class"])
    assert calls == [] and result["runtime_class"] is True


def test_the_nodes_whose_disruptive_step_failed_stop_the_rollout(monkeypatch):
    # d's hand-over is an earlier run's, kept by a persistent fact cache: it stops nothing
    hostvars = {"a": {"__harden_node": "na", "__harden_failed": _failed("drain failed")}, "b": {"__harden_node": "nb"},
                "c": {"__harden_failed": _failed("x")}, "d": {"__harden_failed": _failed("y", dict(THIS_RUN, pid=6))}}
    result, calls = _run(monkeypatch, {"step": "stopped"}, hostvars, ansible_play_hosts=["b"])
    assert calls == [] and result["stopped_by"] == ["na", "c"]
    del hostvars["d"]
    # the role node_maintenance's budget reads them as facts of the batch's hosts, with the fleet the rollout step set
    # on localhost (facts read under ansible_facts too, where Ansible injects none as variables)
    hostvars["localhost"] = {"ansible_facts": {"__harden_rollout_plan": {"fleet": ["na", "nb"]}}}
    hostvars["b"] = {"ansible_facts": {"__harden_node": "nb", "__harden_failed": _failed("mig failed")}}
    result, _calls = _run(monkeypatch, {"step": "stopped"}, hostvars, ansible_play_hosts=["b"], ansible_play_hosts_all=["a", "b", "c"])
    assert result["ansible_facts"] == {"node_maintenance_stopped_by": ["na", "nb", "c"], "node_maintenance_fleet": ["na", "nb"]}


def test_the_second_plays_hosts_add_up_over_the_first_plays_batches_of_this_run():
    """The unavailable nodes first, then the others, each in their batches' order; a host whose left cordon could not
    be released stays out (a failed host would still take a serial batch there: a canary of no node); a plan another
    run left in a persistent fact cache counts for nothing."""
    run = harden_rollout._harden_run.run_identity({"host": "c", "boot_id": "b", "pid_ns": "p", "pid": 7, "start": 9, "live": []})
    first = harden_rollout._harden_run.rollout_plan_fact(None, run, {"a": "gpuharden_rollout_then", "b": "gpuharden_rollout_first",
                                                                    "c": "gpuharden_no_rollout", "d": "gpuharden_rollout_then"},
                                                         3, ["na"], {"d": "nd not Ready"})
    assert (first["hosts"], first["serial"], first["release_failed"]) == (["b", "a"], [1, 3], {"d": "nd not Ready"})
    second = harden_rollout._harden_run.rollout_plan_fact(first, run, {"e": "gpuharden_rollout_first", "f": "gpuharden_rollout_then"},
                                                          None, ["na"], {})
    assert second["hosts"] == ["b", "e", "a", "f"] and second["serial"] == [1, 3] and second["release_failed"] == {"d": "nd not Ready"}
    other = harden_rollout._harden_run.rollout_plan_fact(first, dict(run, pid=8), {"e": "gpuharden_rollout_then"}, None, [], {})
    assert other["hosts"] == ["e"] and other["serial"] == [1, 1] and other["release_failed"] == {}


def test_the_modules_it_runs_take_the_controllers_python_and_the_rollout_reads_the_handed_over_fleet_read(monkeypatch):
    """Its tasks, delegated to localhost, no longer name ansible_python_interpreter (tests/unit/test_node_prerequisites.py
    lists the action among those that name it themselves): the modules it runs must not take the play's node Python."""
    seen = []

    def execute(self, module_name, module_args, task_vars):
        seen.append((module_name, task_vars["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"]))
        return {"budget": 1, "unavailable": [], "released": ["na"]}

    monkeypatch.setattr(harden_rollout.ActionModule, "_execute_module", execute)
    monkeypatch.setattr(_handover, "this_run", lambda: THIS_RUN)
    task = SimpleNamespace(args={"step": "rollout"}, async_val=0, check_mode=False, diff=False, action="gpuharden.k8s.harden_rollout",
                           delegate_to="localhost")
    action = harden_rollout.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None, Templar(), None)
    hostvars = {"a": _host("na", __kubelet_topology_disruptive=_plan(True), __harden_owner="harden@a"), "b": _host("nb", __harden_owner="harden@a")}
    left = {"left_cordoned": [{"node": "nb", "record": {"owner": "harden@old"}}]}
    result = action.run(task_vars={"hostvars": hostvars, "ansible_play_hosts": ["a", "b"], "ansible_play_hosts_all": ["a", "b"],
                                   "ansible_playbook_python": "/venv/bin/python", **_handover.handed_over(harden_rollout._harden_run.RESTARTS, left),
                                   "ansible_delegated_vars": {"localhost": {"ansible_python_interpreter": "/node/python"}}})
    assert seen == [("gpuharden.k8s.node_maintenance", "/venv/bin/python"), ("gpuharden.k8s.disruption_budget", "/venv/bin/python")]
    assert result["release"] == ["b"] and result["released"] == ["na"]


PLAN = {"plan": {"untouched": False}, "checks": {}}


def test_postcheck_inputs_follow_what_the_run_did_to_the_node():
    """harden's post-check inputs, once Jinja in harden_gpu_nodes.yml's last play (two expressions over several lines)."""
    def inputs(check_mode=False, node_plan=PLAN, changed_results=(None, None, None, None), kubelet_config=None):
        return sp.postcheck_inputs(check_mode=check_mode, node_plan=node_plan, owner="harden@x", lock_path="/run/l", settle_seconds="60",
                                   changed_results=list(changed_results), kubelet_config=kubelet_config)

    touched = inputs()
    assert touched == {"postcheck_node_audit": None, "postcheck_lock": {"owner": "harden@x", "path": "/run/l"},
                       "postcheck_advertise_settle_seconds": 60, "postcheck_advertise_settle_this_node": False,
                       "postcheck_kubelet_restarted_at": None}
    # a node no stage touched, or any node in check mode: the plan's audit stands; check mode takes no lock, waits for nothing
    untouched = {"plan": {"untouched": True}}
    assert inputs(node_plan=untouched)["postcheck_node_audit"] is untouched
    checked = inputs(check_mode=True, changed_results=({"changed": True}, None, None, None))
    assert checked["postcheck_node_audit"] is PLAN and checked["postcheck_lock"] is None and checked["postcheck_advertise_settle_seconds"] == 0
    # the plugin, the kubelet or MIG changed (a loop's result too): the node's advertised resources settle
    for position in range(4):
        results = [None, {"changed": False}, {"skipped": True}, None]
        results[position] = {"results": [{"changed": False}, {"changed": True}]} if position == 3 else {"changed": True}
        assert inputs(changed_results=results)["postcheck_advertise_settle_this_node"] is True
    # a restarted kubelet: judged from a status it posted since; a write without a restart, or no health read, none
    assert inputs(kubelet_config={"restarted": True, "health": {"restarted_at": "2026-12-07T10:00:00Z"}})["postcheck_kubelet_restarted_at"] == \
        "2026-12-07T10:00:00Z"
    assert inputs(kubelet_config={"restarted": False, "health": {"restarted_at": "t"}})["postcheck_kubelet_restarted_at"] is None
    assert inputs(kubelet_config={"restarted": True, "health": None})["postcheck_kubelet_restarted_at"] is None


def test_the_postcheck_step_sets_this_hosts_facts_and_reads_no_other_host(monkeypatch):
    variables = {"gpuharden_node_plan": PLAN, "__harden_owner": "harden@y", "device_plugin_result": {"changed": True},
                 "__kubelet_topology_config": {"changed": True, "restarted": True, "health": {"restarted_at": "t1"}}}
    result, calls = _run(monkeypatch, {"step": "postcheck"}, NoHostvars(), ansible_play_hosts=["a", "b"], ansible_play_hosts_all=["a", "b"],
                         **variables)
    assert calls == [] and result["changed"] is False
    assert result["ansible_facts"] == {"postcheck_node_audit": None, "postcheck_lock": {"owner": "harden@y", "path": "/run/gpuharden/run.lock"},
                                       "postcheck_advertise_settle_seconds": 60, "postcheck_advertise_settle_this_node": True,
                                       "postcheck_kubelet_restarted_at": "t1"}
    result, _calls = _run(monkeypatch, {"step": "postcheck"}, NoHostvars(), check_mode=True, gpuharden_postcheck_settle_seconds=5, **variables)
    assert result["ansible_facts"]["postcheck_lock"] is None and result["ansible_facts"]["postcheck_node_audit"] is PLAN
