# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 1: harden_gpu_nodes.yml's steps around the stages in Python (plugins/action/harden_node.py over
module_utils/core/_harden_run.py), where the playbook built them in Jinja: the run's name in the locks, the verdicts that
fail a node, the draining steps that run, the run lock given back, the end-of-run check for a run without GPU nodes.
node_lock is replaced by a recorder of the _execute_module calls."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible_collections.gpuharden.k8s.plugins.action import harden_node
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run as run
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

# this ansible-playbook run, as plugin_utils/_handover.py stamps a hand-over, and an earlier one (a fact cache kept it)
THIS_RUN = {"boot_id": "b", "pid_ns": "pid:[1]", "pid": 7, "start": 9}
EARLIER_RUN = dict(THIS_RUN, pid=6)
# the draining plans' hand-overs (kubelet_topology_plan, mig_plan)
KUBELET, MIG = run.DRAINING_PLANS["kubelet_topology"], run.DRAINING_PLANS["mig"]


def _handed(name, why, stamp=None):
    return _handover.handed_over(name, why, run=stamp or THIS_RUN)[name]


class Templar:
    @staticmethod
    def template(value):
        return value


def _run(monkeypatch, args, lock=None, check_mode=False, **task_vars):
    calls = []

    def execute(self, module_name, module_args, task_vars):
        calls.append((module_name, module_args))
        return dict(lock or {"changed": True})

    monkeypatch.setattr(harden_node.ActionModule, "_execute_module", execute)
    monkeypatch.setattr(_handover, "this_run", lambda: THIS_RUN)
    task = SimpleNamespace(args=args, async_val=0, check_mode=check_mode, diff=False, action="gpuharden.k8s.harden_node")
    action = harden_node.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None, Templar(), None)
    return action.run(task_vars=dict({"inventory_hostname": "gpu-a"}, **task_vars)), calls


def test_start_names_the_run_the_node_and_the_controller_process(monkeypatch):
    monkeypatch.setattr(harden_node._node_lock, "controller_identity", lambda: {"pid": 7, "start": 9})
    result, calls = _run(monkeypatch, {"step": "start"})
    facts = result["ansible_facts"]
    assert calls == [] and facts["__harden_node"] == "gpu-a" and facts["__harden_controller"] == {"pid": 7, "start": 9}
    assert facts["__harden_owner"].startswith("harden@") and result["changed"] is False
    result, _calls = _run(monkeypatch, {"step": "start"}, gpuharden_run_owner="nightly", gpuharden_k8s_node_name="node-a")
    assert result["ansible_facts"]["__harden_owner"] == "nightly" and result["ansible_facts"]["__harden_node"] == "node-a"
    assert run.run_owner("", datetime.datetime(2026, 7, 1, 12, 0, 3), 42) == "harden@20260701T120003-42"

    def unreadable():
        raise OSError("no /proc")

    monkeypatch.setattr(harden_node._node_lock, "controller_identity", unreadable)
    with pytest.raises(AnsibleActionFail, match="cannot read this controller's processes in /proc: no /proc"):
        _run(monkeypatch, {"step": "start"})


def test_verdicts_fail_only_the_node_the_run_decided_so(monkeypatch):
    # of=restarts: harden_rollout step=restarts' hand-over to every host of the batch (no registered variable)
    restarts = {"restart_not_allowed": {"gpu-a": "containerd not changed: budget exhausted"}}
    result, _calls = _run(monkeypatch, {"step": "verdict", "of": "restarts"}, **{run.RESTARTS: _handed(run.RESTARTS, restarts)})
    assert result["failed"] is True and result["msg"] == "containerd not changed: budget exhausted"
    result, _calls = _run(monkeypatch, {"step": "verdict", "of": "restarts"}, inventory_hostname="gpu-b",
                          **{run.RESTARTS: _handed(run.RESTARTS, restarts)})
    assert "failed" not in result
    # an earlier run's (a fact cache kept it) fails nothing
    result, _calls = _run(monkeypatch, {"step": "verdict", "of": "restarts"}, ansible_facts={run.RESTARTS: _handed(run.RESTARTS, restarts, EARLIER_RUN)})
    assert "failed" not in result
    # of=cordons: the rollout step's decision on localhost (a fact there)
    localhost = {"ansible_facts": {"__harden_rollout_plan": {"hosts": ["gpu-a"], "release_failed": {"gpu-b": "nb not Ready"}}}}
    result, _calls = _run(monkeypatch, {"step": "verdict", "of": "cordons"}, hostvars={"localhost": localhost})
    assert "failed" not in result and result["changed"] is False
    result, _calls = _run(monkeypatch, {"step": "verdict", "of": "cordons"}, inventory_hostname="gpu-b", hostvars={"localhost": localhost})
    assert result["failed"] is True and result["msg"] == "nb not Ready"
    # the rollout's records of the second play
    result, _calls = _run(monkeypatch, {"step": "verdict", "of": "failed"}, __harden_node="na",
                          __harden_failed=_handed(run.FAILED, "Drain failed: PDB"))
    assert result["msg"] == "na: Drain failed: PDB"
    result, _calls = _run(monkeypatch, {"step": "verdict", "of": "deferred"}, ansible_facts={run.DEFERRED: _handed(run.DEFERRED, "budget exhausted")})
    assert result["msg"] == "budget exhausted"
    for kind in ("failed", "deferred"):
        result, _calls = _run(monkeypatch, {"step": "verdict", "of": kind})
        assert "failed" not in result, kind
        # an earlier run's hand-over, kept by a persistent fact cache, fails nothing in this run
        name = run.FAILED if kind == "failed" else run.DEFERRED
        result, _calls = _run(monkeypatch, {"step": "verdict", "of": kind}, **{name: _handed(name, "old", EARLIER_RUN)})
        assert "failed" not in result, kind
    with pytest.raises(AnsibleActionFail, match="step=verdict needs it"):
        _run(monkeypatch, {"step": "verdict"})
    with pytest.raises(AnsibleActionFail, match="of is 'failed'"):
        _run(monkeypatch, {"step": "release", "of": "failed"})


def test_rescue_gives_the_lock_back_then_fails_the_node_with_the_step_that_failed(monkeypatch):
    failed = {"ansible_failed_task": {"name": "Stage | containerd"}, "ansible_failed_result": {"msg": "rollback"}}
    result, calls = _run(monkeypatch, {"step": "rescue"}, __harden_owner="harden@x", **failed)
    assert calls == [("gpuharden.k8s.node_lock", {"owner": "harden@x", "path": "/run/gpuharden/run.lock", "state": "released"})]
    assert result["failed"] is True and result["msg"] == "Stage | containerd failed: rollback" and result["changed"] is True
    result, _calls = _run(monkeypatch, {"step": "rescue"}, __harden_owner="harden@x")
    assert result["msg"] == "a stage failed: failed"
    # the owner is a fact of step start: read under ansible_facts too, where Ansible injects no fact as a variable
    _result, calls = _run(monkeypatch, {"step": "rescue"}, ansible_facts={"__harden_owner": "harden@y"})
    assert calls[0][1]["owner"] == "harden@y"
    # no owner (step start did not run): no lock to give back, the node still fails
    result, calls = _run(monkeypatch, {"step": "rescue"})
    assert calls == [] and result["failed"] is True and result["lock"] is None
    # the lock that cannot be given back is the failure
    result, _calls = _run(monkeypatch, {"step": "rescue"}, {"failed": True, "msg": "unreachable"}, __harden_owner="harden@x",
                          gpuharden_lock_path="/tmp/l", **failed)
    assert result["msg"] == "giving the node's run lock back failed: unreachable"


def test_the_second_plays_records_and_draining_steps(monkeypatch):
    result, _calls = _run(monkeypatch, {"step": "deferred"}, ansible_failed_result={"msg": "budget exhausted"})
    # handed over, stamped with this run (a fact cache's from an earlier run counts for nothing)
    assert result["why"] == "budget exhausted" and "failed" not in result
    assert result["ansible_facts"] == {run.DEFERRED: _handed(run.DEFERRED, "budget exhausted")}
    deferred_facts = result["ansible_facts"]
    result, _calls = _run(monkeypatch, {"step": "deferred"})
    assert result["why"] == "the disruption budget could not be checked"
    result, _calls = _run(monkeypatch, {"step": "failed"}, __harden_node="na",
                          ansible_failed_task={"name": "Drain"}, ansible_failed_result={"msg": "PDB"})
    assert result["why"] == "Drain failed: PDB" and "failed" not in result
    assert result["ansible_facts"] == {run.FAILED: _handed(run.FAILED, "Drain failed: PDB")}
    # the last play's verdict reads what the rescue handed over (facts injected as variables, or not)
    for facts in (result["ansible_facts"], {"ansible_facts": result["ansible_facts"]}):
        verdict, _calls = _run(monkeypatch, {"step": "verdict", "of": "failed"}, __harden_node="na", **facts)
        assert verdict["failed"] is True and verdict["msg"] == "na: Drain failed: PDB"
    assert result["ansible_stats"] == {"data": {"gpuharden_rollout_failed": {"gpu-a": {"node": "na", "reason": "Drain failed: PDB"}}},
                                       "per_host": False, "aggregate": True}
    result, _calls = _run(monkeypatch, {"step": "failed"})
    assert result["why"] == "a disruptive step failed: failed"
    # which draining steps run: the plans' hand-overs of this run as Ansible's bool filter reads them, none where deferred
    result, _calls = _run(monkeypatch, {"step": "draining"}, __harden_owner="harden@x", __kubelet_topology_disruptive=_handed(KUBELET, "True"))
    assert (result["kubelet_topology"], result["mig"]) == (True, False)
    assert result["ansible_facts"] == {"node_maintenance_owner": "harden@x"}
    # a plan's hand-over of an earlier run (a fact cache kept it): that plan did not run in this one
    result, _calls = _run(monkeypatch, {"step": "draining"}, __kubelet_topology_disruptive=_handed(KUBELET, True, EARLIER_RUN),
                          __mig_disruptive=_handed(MIG, True))
    assert (result["kubelet_topology"], result["mig"]) == (False, True)
    # the deferred step's hand-over, as the rescue returned it: no draining step runs
    plans = {"__kubelet_topology_disruptive": _handed(KUBELET, True), "__mig_disruptive": _handed(MIG, "yes")}
    result, _calls = _run(monkeypatch, {"step": "draining"}, **plans, **deferred_facts)
    assert (result["kubelet_topology"], result["mig"]) == (False, False)
    result, _calls = _run(monkeypatch, {"step": "draining"}, **plans, __harden_deferred=_handed(run.DEFERRED, "old", EARLIER_RUN))
    assert (result["kubelet_topology"], result["mig"]) == (True, True)


def test_release_gives_the_lock_back_unless_the_plan_or_the_post_check_did(monkeypatch):
    result, calls = _run(monkeypatch, {"step": "release"}, __harden_owner="harden@x", gpuharden_node_plan={"lock": None})
    assert [call[0] for call in calls] == ["gpuharden.k8s.node_lock"] and "skipped" not in result
    for given_back in ({"gpuharden_node_plan": {"lock": {"held": False}}}, {"__postcheck_node_read": {"lock": {"held": False}}}):
        result, calls = _run(monkeypatch, {"step": "release"}, __harden_owner="harden@x", **given_back)
        assert calls == [] and result["skipped"] is True, given_back
    assert run.lock_still_held({"lock": {"held": True}}, {"skipped": True}) is True


def test_targeted_fails_a_run_whose_first_play_matched_no_host(monkeypatch):
    this_run = {"host": "c", "boot_id": "b", "pid_ns": "p", "pid": 7, "start": 9}
    monkeypatch.setattr(harden_node._node_lock, "controller_identity", lambda: dict(this_run, live=[], checked=10))
    # gpu-b was named by an earlier run (its facts kept by a persistent fact cache): that does not count
    hostvars = {"localhost": {}, "cp-1": {}, "gpu-a": {"ansible_facts": {"__harden_controller": dict(this_run, live=[[7, 9]])}},
                "gpu-b": {"__harden_controller": dict(this_run, pid=6)}}
    result, _calls = _run(monkeypatch, {"step": "targeted"}, hostvars=hostvars, ansible_play_hosts_all=["localhost", "gpu-b"])
    assert result["failed"] is True
    result, _calls = _run(monkeypatch, {"step": "targeted"}, hostvars=hostvars, ansible_play_hosts_all=["localhost", "cp-1", "gpu-a"])
    assert result["skipped"] is True
    result, _calls = _run(monkeypatch, {"step": "targeted"}, hostvars=hostvars, ansible_play_hosts_all=["cp-1"], ansible_limit="cp-1")
    assert result["failed"] is True and result["msg"] == (
        "No GPU node to harden: the hosts pattern 'gpu_nodes' (gpuharden_target_hosts, default gpu_nodes) matched no host of the "
        "inventory within --limit 'cp-1'. Put the GPU nodes in that group, or set gpuharden_target_hosts to their group or pattern.")
    result, _calls = _run(monkeypatch, {"step": "targeted"}, hostvars=hostvars, ansible_play_hosts_all=["localhost"],
                          gpuharden_target_hosts="gpu_nodez")
    assert "pattern 'gpu_nodez'" in result["msg"] and "--limit" not in result["msg"]
