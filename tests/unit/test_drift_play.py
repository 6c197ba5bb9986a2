# SPDX-License-Identifier: GPL-3.0-or-later
"""drift_check.yml's decisions in Python (issue 45 items 1 and 7): the planner of the gpuharden.k8s.drift_play action
(plugins/module_utils/audit/_drift_play.py) decides the run's start (Node names, lock, pods snapshot), whether and how
the cluster side runs (consistency check, RuntimeClass dry run, in the module or handed to `gpuharden drift`) and each
host's verdict; `gpuharden drift` reads the steps' results (drift_report.Outcomes.take_drift_play)."""

from __future__ import annotations

import datetime

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _drift_play as plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

from gpuharden import drift_report
from tests.unit.test_drift_playbook import PLAYBOOKS, _tasks

CONTROLLER = {"host": "ctl", "pid": 1}
SAME = {"postcheck_consistency": True, "postcheck_nvml": True, "postcheck_kubeconfig": "/k", "postcheck_kube_context": "",
        "postcheck_controller_python": "/py", "cgroup_limits_kubeconfig": "/k", "cgroup_limits_kube_context": "",
        "runtime_class_kubeconfig": "/k", "runtime_class_kube_context": "", "runtime_class_controller_python": "/py",
        "runtime_class_audit_options": {"name": "nvidia", "handler": "nvidia"},
        "kubelet_topology_admission_check": True, "kubelet_topology_ignore_unadmittable_workloads": False}


def _plan(node, status="clean", kubelet_plan=None, report=True):
    entry = {"node_name": node, "findings": [], "checks": {"kubelet": {"status": status, "details": {"plan": kubelet_plan}}}}
    if report:
        entry["node_report"] = {"gpus": 2}
    return entry


def test_start_names_the_nodes_and_keeps_the_lock_of_the_settings_table():
    started = plan.start(dict(SAME), ["a", "b"], {"b": "node-b"}, CONTROLLER, "drift@x-1")
    assert started["node_names"] == {"a": "a", "b": "node-b"} and started["nodes"] == ["a", "node-b"]
    # gpuharden_lock_timeout's drift_check default is 60 (the settings table's by_playbook), the path the table's
    assert started["lock"] == {"owner": "drift@x-1", "path": "/run/gpuharden/run.lock", "timeout": 60, "controller": CONTROLLER}
    assert started["pods_snapshot"] is True
    given = plan.start(dict(SAME, gpuharden_run_owner="ci-7", gpuharden_lock_path="/tmp/l", gpuharden_lock_timeout="5"), ["a"], {}, CONTROLLER, "x")
    assert given["lock"] == {"owner": "ci-7", "path": "/tmp/l", "timeout": 5, "controller": CONTROLLER}


def test_the_lock_options_are_those_node_stages_takes():
    """node_audit's lock option (owner, path, timeout, controller): the keys the drift check always gave it."""
    assert set(plan.start(dict(SAME), ["a"], {}, CONTROLLER, "x")["lock"]) == {"owner", "path", "timeout", "controller"}


def test_the_made_up_owner_is_harden_s_form():
    when = datetime.datetime(2026, 12, 7, 10, 1, 2, tzinfo=datetime.UTC)
    assert plan.made_up_owner(when, 42) == "drift@20261207T100102-42"


@pytest.mark.parametrize("change", [{"cgroup_limits_kubeconfig": "/other"}, {"cgroup_limits_kube_context": "ctx"}, {"postcheck_nvml": False},
                                    {"postcheck_consistency": "no"}])
def test_the_pods_are_kept_only_for_a_consistency_check_of_the_same_identity(change):
    assert plan.start(dict(SAME, **change), ["a"], {}, CONTROLLER, "x")["pods_snapshot"] is False


def test_bad_settings_are_named():
    with pytest.raises(GpuhardenError, match="gpuharden_lock_timeout='soon'"):
        plan.start(dict(SAME, gpuharden_lock_timeout="soon"), ["a"], {}, CONTROLLER, "x")
    with pytest.raises(GpuhardenError, match="postcheck_nvml='maybe' is not a boolean"):
        plan.start(dict(SAME, postcheck_nvml="maybe"), ["a"], {}, CONTROLLER, "x")


def test_the_cluster_side_folds_the_runtime_class_into_the_consistency_run():
    plans = [_plan("a", "drift", {"topology_manager_policy": "single-numa-node"}), _plan("b"), _plan("c", report=False)]
    decided = plan.cluster_plan(dict(SAME), ["a", "b", "c"], plans, "/tmp/snap")
    assert decided["node_reports"] == {"a": {"gpus": 2}, "b": {"gpus": 2}}
    assert decided["consistency"] == {"kubeconfig": "/k", "context": None, "nodes": ["a", "b"], "pods_snapshot": "/tmp/snap",
                                      "runtime_class": {"name": "nvidia", "handler": "nvidia", "nodes": ["a", "b", "c"]},
                                      "admission": {"a": {"topology_manager_policy": "single-numa-node"}}}
    assert decided["runtime_class_folded"] and not decided["in_process"]
    # the module run checked it: no dry run by itself; a module run that failed did not
    assert not plan.runtime_class_alone(decided, {"findings": [], "runtime_class_check": {"changed": False}})
    assert plan.runtime_class_alone(decided, {"failed": True, "msg": "refused"})
    assert plan.module_args(decided["consistency"]) == {key: value for key, value in decided["consistency"].items() if key != "context"}


def test_another_identity_runs_the_runtime_class_dry_run_by_itself_with_its_own_options():
    decided = plan.cluster_plan(dict(SAME, runtime_class_kube_context="admin"), ["a"], [_plan("a")], None)
    assert decided["consistency"]["runtime_class"] is None and decided["consistency"]["pods_snapshot"] is None
    assert decided["runtime_class"] == {"name": "nvidia", "handler": "nvidia", "kubeconfig": "/k", "context": "admin", "nodes": ["a"]}
    assert plan.runtime_class_alone(dict(decided, in_process=True), None)
    assert plan.runtime_class_alone(decided, {"findings": [], "runtime_class_check": None})


def test_in_process_the_folded_dry_run_is_left_to_the_cli():
    decided = plan.cluster_plan(dict(SAME, gpuharden_drift_cluster_in_process="true"), ["a"], [_plan("a")], None)
    assert decided["in_process"] and not plan.runtime_class_alone(decided, None)
    # no consistency check at all: the dry run runs in the play
    off = plan.cluster_plan(dict(SAME, postcheck_consistency=False, gpuharden_drift_cluster_in_process=True), ["a"], [_plan("a")], None)
    assert off["consistency"] is None and plan.runtime_class_alone(off, None)


def test_admission_and_cluster_objects_follow_their_switches():
    plans = [_plan("a", "drift", {"p": 1})]
    assert plan.cluster_plan(dict(SAME, kubelet_topology_ignore_unadmittable_workloads=True), ["a"], plans, None)["consistency"]["admission"] == {}
    assert plan.cluster_plan(dict(SAME, kubelet_topology_admission_check=False), ["a"], plans, None)["consistency"]["admission"] == {}
    off = plan.cluster_plan(dict(SAME, gpuharden_drift_cluster_objects=False), ["a"], plans, None)
    assert off["runtime_class"] is None and off["consistency"]["runtime_class"] is None and not plan.runtime_class_alone(off, {})


def test_the_verdict_fails_where_asked_and_records_the_run_data():
    node_plan = dict(_plan("node-a"), findings=[{"id": "x", "severity": "error", "stage": "kubelet"}], summary={"stages": ["kubelet"]})
    decided = plan.verdict({}, node_plan, {"findings": [{"node": "node-a", "id": "gpu_not_advertised", "severity": "error"}]})
    assert decided["failure"] == "node-a drifted: x, gpu_not_advertised (stages to run: kubelet)"
    assert [entry["id"] for entry in decided["run_data"]["consistency_findings"]] == ["gpu_not_advertised"]
    assert plan.verdict({"gpuharden_drift_fail": False}, node_plan, None)["failure"] == ""
    assert plan.verdict({"gpuharden_drift_fail_severity": "critical"}, node_plan, None)["failure"] == ""
    # a consistency check that could not run leaves every host not checked
    assert plan.verdict({}, node_plan, {"failed": True, "msg": "403"})["failure"] == "node-a not checked: 403"
    with pytest.raises(GpuhardenError, match="gpuharden_node_plan is NoneType"):
        plan.verdict({}, None, None)


def _event(action, result, host="gpu-a"):
    return {"event": "runner_on_ok", "event_data": {"host": host, "task_action": action, "task": "t", "res": result}}


def test_the_cli_reads_the_steps_results():
    outcomes = drift_report.Outcomes()
    outcomes.feed(_event("gpuharden.k8s.drift_play", {"node_names": {"gpu-a": "node-a"}, "nodes": ["node-a"], "lock": {}}))
    consistency = {"findings": [{"node": "node-a", "id": "gpu_not_advertised"}], "ran_in": "module", "kept": {"node-a": "why"},
                   "runtime_class_check": {"changed": True}}
    outcomes.feed(_event("gpuharden.k8s.drift_play", {"consistency": consistency, "consistency_options": None, "runtime_class": None,
                                                      "consistency_identity": {"kubeconfig": "/k", "context": None}, "api_retries": 2}))
    assert outcomes.node_names == {"gpu-a": "node-a"} and outcomes.consistency_ran_in == "module"
    assert outcomes.consistency == consistency["findings"] and outcomes.kept == {"node-a": "why"}
    assert outcomes.runtime_class == {"changed": True} and outcomes.consistency_invocation == {"kubeconfig": "/k", "context": None}
    assert outcomes.api_retries == 2 and outcomes.consistency_options is None


def test_the_cli_reads_a_failed_module_run_and_the_hand_over():
    failed = drift_report.Outcomes()
    failed.feed(_event("gpuharden.k8s.drift_play", {"consistency": {"failed": True, "msg": "forbidden", "access": {"kind": "forbidden"}},
                                                    "runtime_class": {"changed": False, "action": "none"}}))
    assert failed.consistency is None and failed.consistency_error == "forbidden" and failed.consistency_access == {"kind": "forbidden"}
    assert failed.runtime_class == {"changed": False, "action": "none"}
    handed = drift_report.Outcomes()
    handed.feed(_event("gpuharden.k8s.drift_play", {"consistency": None, "consistency_options": {"nodes": ["a"]}, "node_reports": {"a": {}}}))
    assert handed.consistency_options == {"nodes": ["a"]} and handed.node_reports == {"a": {}} and handed.consistency_ran_in is None


def test_the_drift_check_decides_nothing_in_jinja_but_the_engine_s_inputs():
    """The play's steps are drift_play tasks; the engine's task takes the start step's decisions."""
    first, second = yaml.safe_load((PLAYBOOKS / "drift_check.yml").read_text())
    steps = [task["gpuharden.k8s.drift_play"]["step"] for task in _tasks(first["tasks"] + second["tasks"]) if "gpuharden.k8s.drift_play" in task]
    assert steps == ["start", "cluster", "verdict", "fail"]
    assert "vars" not in first and "vars" not in second
    [engine] = [task for task in first["tasks"] if task.get("ansible.builtin.import_tasks") == "tasks/node_stages.yml"]
    # the nodes, the pods snapshot and the lock: the start step's hand-over (node_plan_pods and node_stages take it)
    assert engine["vars"]["__node_plan"] == {"facts": False}
    [start] = [task for task in first["tasks"] if task.get("gpuharden.k8s.drift_play", {}).get("step") == "start"]
    assert "register" not in start and start["run_once"] is True


def test_the_start_step_hands_its_decisions_to_the_plan_and_the_cluster_side(monkeypatch):
    """Step start's decisions reach every host as a hand-over (a run_once task's facts; no registered variable):
    node_plan_pods takes the nodes and the snapshot where __node_plan leaves them out, step cluster the Node names and
    the plan's pods snapshot (node_plan_pods' hand-over)."""
    from types import SimpleNamespace

    from ansible_collections.gpuharden.k8s.plugins.action import drift_play as action
    from ansible_collections.gpuharden.k8s.plugins.action import node_plan_pods

    step = action.ActionModule.__new__(action.ActionModule)
    monkeypatch.setattr(step, "_settings", lambda names, task_vars: dict(SAME, gpuharden_lock_timeout=60, gpuharden_lock_path="/run/l"),
                        raising=False)
    monkeypatch.setattr(action._node_lock, "controller_identity", lambda: CONTROLLER)
    started = step._start({"ansible_play_hosts": ["a", "b"], "hostvars": {"a": {}, "b": {"gpuharden_k8s_node_name": "node-b"}}})
    handed = started["ansible_facts"]
    assert _handover.taken_over(handed, action.START) == {key: started[key] for key in ("node_names", "nodes", "lock", "pods_snapshot")}
    assert started["nodes"] == ["a", "node-b"] and started["pods_snapshot"] is True

    # node_plan_pods: the nodes and the snapshot from the hand-over, where __node_plan leaves them out
    seen = []
    monkeypatch.setattr(node_plan_pods.ActionModule, "_execute_module",
                        lambda self, module_name, module_args, task_vars: seen.append(module_args) or {"pods_snapshot": "/tmp/snap"})
    task = SimpleNamespace(args={}, async_val=0, check_mode=False, diff=False, action="gpuharden.k8s.node_plan_pods")
    lister = node_plan_pods.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x")), None, None,
                                         SimpleNamespace(template=lambda value: value), None)
    settings = {name: None for name in node_plan_pods._stage_plan.LIST_SETTINGS}
    listed = lister.run(task_vars=dict(handed, __node_plan={"facts": False}, device_plugin_label_nodes=False, **{
        name: value for name, value in settings.items() if name != "device_plugin_label_nodes"}))
    assert seen[0]["nodes"] == ["a", "node-b"] and seen[0]["pods_snapshot"] is True
    # an earlier run's start (a fact cache kept it) is not this run's: the batch's hosts then
    stale = {name: dict(value, run=dict(value["run"], pid=-1)) for name, value in handed.items()}
    lister.run(task_vars=dict(stale, __node_plan={"facts": False}, ansible_play_batch=["a"], hostvars={"a": {}}, **settings))
    assert seen[1]["nodes"] == ["a"] and seen[1]["pods_snapshot"] is False

    # step cluster: the Node names from step start's hand-over, the snapshot from node_plan_pods'
    decided = {}

    def cluster_plan(settings, nodes, plans, pods_snapshot):
        decided.update(nodes=nodes, pods_snapshot=pods_snapshot)
        return {"consistency": None, "runtime_class": None, "runtime_class_folded": False, "in_process": False}

    monkeypatch.setattr(action.plan, "cluster_plan", cluster_plan)
    monkeypatch.setattr(action.plan, "runtime_class_alone", lambda decided, consistency: False)
    step._cluster(dict(handed, **listed["ansible_facts"], ansible_play_hosts=["a", "b"], hostvars={"a": {}, "b": {}}))
    assert decided == {"nodes": ["a", "node-b"], "pods_snapshot": "/tmp/snap"}


@pytest.mark.parametrize(("failure", "failed"), [("gpu-a drifted: kubelet_setting (stages to run: kubelet_topology)", True), ("", False)])
def test_the_fail_step_fails_the_host_with_its_verdict_s_failure_only(failure, failed):
    """drift_check.yml's last task: the verdict step never fails (stats come only from a successful result), this one does."""
    from ansible_collections.gpuharden.k8s.plugins.action import drift_play as action

    step = action.ActionModule.__new__(action.ActionModule)
    # what step verdict hands over, as Ansible injects a task's facts into the host's variables
    task_vars = dict(_handover.handed_over(action.VERDICT, {"failure": failure}))
    decided = step._fail(task_vars)
    if failed:
        assert decided == {"failed": True, "msg": failure}
    else:  # skipped, not ok: the verdict's result, with the run's stats, stays the one a per-host callback keeps
        assert decided.get("skipped") is True and "fail severity" in decided["skip_reason"] and "failed" not in decided
    with pytest.raises(GpuhardenError, match="after step verdict"):
        step._fail({})
    # a fact cache's verdict of an earlier run is not this run's
    stale = {name: dict(value, run=dict(value["run"], pid=-1)) for name, value in task_vars.items()}
    with pytest.raises(GpuhardenError, match="after step verdict"):
        step._fail(stale)


def test_the_cluster_step_s_consistency_check_reaches_each_host_s_verdict(monkeypatch):
    """Step cluster hands the consistency check over (a run_once task's facts: every host); step verdict decides with it
    and hands its failure to step fail."""
    from ansible_collections.gpuharden.k8s.plugins.action import drift_play as action

    step = action.ActionModule.__new__(action.ActionModule)
    seen = {}

    def verdict(settings, node_plan, consistency):
        seen["consistency"] = consistency
        return {"run_data": {}, "failure": "gpu-a: the consistency check could not run"}

    monkeypatch.setattr(action.plan, "verdict", verdict)
    monkeypatch.setattr(step, "_settings", lambda names, task_vars: {}, raising=False)
    cluster = {"findings": [], "failed": True, "msg": "forbidden"}
    handed = _handover.handed_over(action.CLUSTER, {"consistency": cluster})
    decided = step._verdict(dict(handed, inventory_hostname="gpu-a"))
    assert seen["consistency"] == cluster
    assert step._fail(dict(decided["ansible_facts"])) == {"failed": True, "msg": "gpu-a: the consistency check could not run"}
