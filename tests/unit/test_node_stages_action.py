# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 1: the stage engine's action (plugins/action/node_stages.py): one task audits the node once, plans,
and runs the stages it owns with the task's check mode and diff.  The node modules are replaced by a recorder of the
_execute_module calls (module name, arguments, check mode); the plan is the real planner's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ansible import context
from ansible.errors import AnsibleActionFail
from ansible.utils.context_objects import CLIArgs
from ansible_collections.gpuharden.k8s.plugins.action import node_stages
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

GPU_FACTS = {"gpuharden": {"driver_gpus": {"0000:01:00.0": {}}, "gpu_count": 1}}


def _audit_result(facts=GPU_FACTS, operator=None, **statuses):
    checks = {"device_nodes": {"status": "ok"}, "containerd": {"status": "ok"}, "kubelet": {"status": "ok"},
              "mig": {"status": "skipped"}, "cgroup_memory": {"status": "ok"}}
    checks.update({name: {"status": status} for name, status in statuses.items()})
    return {"changed": False, "checks": checks, "summary": {"node_stages": _node_audit.node_stages(checks)},
            "ansible_facts": facts, "lock": {"held": True}, "gpu_operator": operator}


class Recorder:
    def __init__(self, results):
        self.results = results
        self.calls = []

    def __call__(self, action, module_name, module_args, task_vars):
        self.calls.append((module_name, module_args, action._task.check_mode))
        return dict(self.results[module_name])


@pytest.fixture
def cliargs(monkeypatch):
    def set_tags(tags=("all",), skip_tags=()):
        monkeypatch.setattr(context, "CLIARGS", CLIArgs({"tags": tuple(tags), "skip_tags": tuple(skip_tags)}))
    set_tags()
    return set_tags


class Templar:
    """The play's variables are plain values here: templating returns them as they are."""

    @staticmethod
    def template(value):
        return value


def _run(monkeypatch, results, args, check_mode=False, task_vars=None):
    recorder = Recorder(results)
    monkeypatch.setattr(node_stages.ActionModule, "_execute_module",
                        lambda self, module_name, module_args, task_vars: recorder(self, module_name, module_args, task_vars))
    task = SimpleNamespace(args=args, async_val=0, check_mode=check_mode, diff=True, action="gpuharden.k8s.node_stages")
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp/x"))
    action = node_stages.ActionModule(task, connection, None, None, Templar(), None)
    return action.run(task_vars=dict({"inventory_hostname": "gpu-a"}, **(task_vars or {}))), recorder.calls, task


ARGS = {"node_name": "gpu-a", "audit": {"facts": True, "device_nodes": {"policy": "default"}},
        "stages": {"device_permissions": {"policy": "default", "backup": False, "gpu_operator": {"takeover": ["device_nodes"]}}}}
PERMISSIONS = {"changed": True, "diff": {"before": "a", "after": "b"}, "reboot_or_reload_required": True}


def test_a_drifted_node_runs_its_stage_once_after_one_audit_in_check_mode_with_diff(monkeypatch, cliargs):
    results = {"gpuharden.k8s.node_audit": _audit_result(device_nodes="drift", operator={"device_nodes": "absent"}),
               "gpuharden.k8s.nvidia_device_nodes": PERMISSIONS}
    result, calls, task = _run(monkeypatch, results, ARGS, check_mode=True)
    # the audit runs outside check mode (it takes the lock), the stage in the task's check mode
    assert [(name, check) for name, _args, check in calls] == [("gpuharden.k8s.node_audit", False),
                                                               ("gpuharden.k8s.nvidia_device_nodes", True)]
    assert task.check_mode is True
    assert calls[0][1] == {"facts": True, "device_nodes": {"policy": "default"}, "node_name": "gpu-a"}
    # the audit's GPU Operator reading, with the role's own takeover list
    assert calls[1][1]["gpu_operator"] == {"device_nodes": "absent", "takeover": ["device_nodes"]}
    assert result["changed"] is True and result["diff"] == [{"before": "a", "after": "b"}]
    assert result["stages"]["device_permissions"]["changed"] is True
    assert result["plan"]["stages"][0] == {"stage": "device_permissions", "side": "node", "drains": False, "action": "run",
                                           "why": "its check (device_nodes) is drift", "changed": True}
    # what gpuharden_node_plan was: node_audit's result
    assert result["checks"]["device_nodes"]["status"] == "drift" and result["lock"] == {"held": True}
    assert result["ansible_facts"] == GPU_FACTS
    assert result["ansible_stats"]["data"] == {"device_permissions_reload_required": ["gpu-a"]}


def test_a_compliant_node_runs_the_audit_only(monkeypatch, cliargs):
    result, calls, _task = _run(monkeypatch, {"gpuharden.k8s.node_audit": _audit_result()}, ARGS)
    assert [name for name, _args, _check in calls] == ["gpuharden.k8s.node_audit"]
    assert result["changed"] is False and "diff" not in result and result["stages"] == {}
    assert "ansible_stats" not in result


def test_tags_leave_the_stage_out(monkeypatch, cliargs):
    cliargs(tags=["container_runtime"])
    results = {"gpuharden.k8s.node_audit": _audit_result(device_nodes="drift", containerd="drift")}
    result, calls, _task = _run(monkeypatch, results, ARGS)
    assert [name for name, _args, _check in calls] == ["gpuharden.k8s.node_audit"]
    actions = {entry["stage"]: entry["action"] for entry in result["plan"]["stages"]}
    assert actions["device_permissions"] == "left_out" and actions["container_runtime"] == "play"
    cliargs(skip_tags=["container_runtime"])
    result, calls, _task = _run(monkeypatch, dict(results, **{"gpuharden.k8s.nvidia_device_nodes": PERMISSIONS}), ARGS)
    assert [name for name, _args, _check in calls] == ["gpuharden.k8s.node_audit", "gpuharden.k8s.nvidia_device_nodes"]


def test_a_node_without_a_gpu_fails_unless_allowed(monkeypatch, cliargs):
    audit = _audit_result(facts={"gpuharden": {"driver_gpus": {}, "gpu_count": 0, "nvml": {"reason": {"code": "library_missing"}}}})
    result, calls, _task = _run(monkeypatch, {"gpuharden.k8s.node_audit": audit}, ARGS)
    assert result["failed"] is True and result["msg"].startswith("gpu-a shows no NVIDIA GPU (no /proc/driver/nvidia/gpus, NVML: library_missing)")
    assert len(calls) == 1 and result["lock"] == {"held": True}  # the rescue gives the lock back
    result, _calls, _task = _run(monkeypatch, {"gpuharden.k8s.node_audit": audit}, dict(ARGS, allow_non_gpu_nodes=True))
    assert not result.get("failed")


def test_a_failed_audit_or_stage_fails_the_task_with_its_message(monkeypatch, cliargs):
    result, _calls, _task = _run(monkeypatch, {"gpuharden.k8s.node_audit": {"failed": True, "msg": "lock held by x"}}, ARGS)
    assert result["failed"] is True and result["msg"] == "node_audit failed: lock held by x"
    results = {"gpuharden.k8s.node_audit": _audit_result(device_nodes="drift"),
               "gpuharden.k8s.nvidia_device_nodes": {"failed": True, "msg": "/dev/nvidia0: permission denied"}}
    result, _calls, _task = _run(monkeypatch, results, ARGS)
    assert result["failed"] is True and result["msg"] == "device_permissions failed: /dev/nvidia0: permission denied"
    assert result["plan"]["stages"][0]["action"] == "run"


def test_a_stage_to_run_without_its_options_is_refused(monkeypatch, cliargs):
    results = {"gpuharden.k8s.node_audit": _audit_result(device_nodes="drift")}
    with pytest.raises(AnsibleActionFail, match="stages.device_permissions is missing"):
        _run(monkeypatch, results, dict(ARGS, stages={}))


def test_plan_only_runs_the_audit_and_refuses_no_node(monkeypatch, cliargs):
    audit = _audit_result(facts={"gpuharden": {}}, device_nodes="drift")
    result, calls, _task = _run(monkeypatch, {"gpuharden.k8s.node_audit": audit}, dict(ARGS, run_stages=False))
    assert [name for name, _args, _check in calls] == ["gpuharden.k8s.node_audit"]
    assert not result.get("failed") and result["changed"] is False
    assert result["plan"]["stages"][0]["action"] == "run" and "stages" not in result
    # the node's name comes with its audit: drift_check.yml and gpuharden drift name the host's node by it
    assert result["node_name"] == ARGS["node_name"] and result["checks"] == audit["checks"]


def test_the_play_gives_the_defaults_and_the_roles_options(monkeypatch, cliargs):
    results = {"gpuharden.k8s.node_audit": _audit_result(device_nodes="drift"), "gpuharden.k8s.nvidia_device_nodes": PERMISSIONS}
    play = {"gpuharden_k8s_node_name": "node-a", "gpuharden_skip_compliant_stages": "false",
            "device_permissions_audit_options": {"policy": "restricted", "group": "video"}, "device_permissions_backup": "yes"}
    result, calls, _task = _run(monkeypatch, results, {"audit": {"device_nodes": {}}}, task_vars=play)
    assert calls[0][1]["node_name"] == "node-a"
    assert result["node_name"] == "node-a"
    assert calls[1][1] == {"policy": "restricted", "group": "video", "backup": True}
    # gpuharden_skip_compliant_stages=false: every stage
    assert result["plan"]["runs"]["container_runtime"] is True
    result, calls, _task = _run(monkeypatch, results, {"audit": {}})
    assert calls[0][1]["node_name"] == "gpu-a"
    assert result["plan"]["runs"]["container_runtime"] is False


LOCK = {"owner": "harden@x", "controller": {"pid": 1}, "hold": True, "release_if_nothing_cluster_side": True}
def _listed(reading, run=None):
    """The plan's LIST as node_plan_pods hands it over to the host (a fact stamped with this run, or ``run``)."""
    return _handover.handed_over(node_stages.GPU_PODS, reading, run=run)


CLEAN_PLUGIN = _listed({"device_plugin_check": {"changed": False}})
ONE_BATCH = {"ansible_play_batch": ["gpu-a", "gpu-b"], "ansible_play_hosts_all": ["gpu-a", "gpu-b"]}


def _audit_lock(monkeypatch, check_mode=False, lock=LOCK, **task_vars):
    results = {"gpuharden.k8s.node_audit": _audit_result(), "gpuharden.k8s.nvidia_device_nodes": PERMISSIONS}
    _result, calls, _task = _run(monkeypatch, results, dict(ARGS, lock=lock), check_mode=check_mode, task_vars=task_vars)
    return calls[0][1].get("lock")


def test_the_engine_builds_the_audits_lock_from_plain_options_and_the_plays_variables(monkeypatch, cliargs):
    """harden's lock mapping, once Jinja in harden_gpu_nodes.yml: path and timeout from the play, no lock in check mode,
    and given back at once on a compliant node only where nothing cluster-side will touch it."""
    lock = _audit_lock(monkeypatch, **CLEAN_PLUGIN, **ONE_BATCH)
    assert lock == {"owner": "harden@x", "hold": True, "controller": {"pid": 1}, "path": "/run/gpuharden/run.lock", "timeout": 600,
                    "release_if_compliant": True}
    assert _audit_lock(monkeypatch, gpuharden_lock_path="/tmp/l", gpuharden_lock_timeout="5", **CLEAN_PLUGIN, **ONE_BATCH)["timeout"] == 5
    assert _audit_lock(monkeypatch, check_mode=True, **CLEAN_PLUGIN, **ONE_BATCH) is None
    assert _audit_lock(monkeypatch, lock=None) is None
    # the dry run would change the plugin, failed, did not run; the play runs in batches; the host labels itself
    assert _audit_lock(monkeypatch, **_listed({"device_plugin_check": {"changed": True}}), **ONE_BATCH)["release_if_compliant"] is False
    assert _audit_lock(monkeypatch, **_listed({"device_plugin_check": {"failed": True, "changed": False}}),
                       **ONE_BATCH)["release_if_compliant"] is False
    # a clean dry run an earlier run handed over (a fact cache kept it) is no dry run of this run
    earlier = _listed({"device_plugin_check": {"changed": False}}, run=dict(_handover.this_run(), pid=1, start=0))
    assert _audit_lock(monkeypatch, **earlier, **ONE_BATCH)["release_if_compliant"] is False
    assert _audit_lock(monkeypatch, **ONE_BATCH)["release_if_compliant"] is False
    assert _audit_lock(monkeypatch, **CLEAN_PLUGIN, ansible_play_batch=["gpu-a"], ansible_play_hosts_all=["gpu-a", "gpu-b"])["release_if_compliant"] is False
    assert _audit_lock(monkeypatch, gpuharden_gpu_node=True, **CLEAN_PLUGIN, **ONE_BATCH)["release_if_compliant"] is False
    assert _audit_lock(monkeypatch, gpuharden_skip_compliant_stages=False, **CLEAN_PLUGIN, **ONE_BATCH)["release_if_compliant"] is False
    assert "release_if_compliant" not in _audit_lock(monkeypatch, lock=dict(LOCK, release_if_nothing_cluster_side=False), **CLEAN_PLUGIN, **ONE_BATCH)


def test_a_lock_without_owner_is_the_harden_runs_the_start_step_named(monkeypatch, cliargs):
    """harden_gpu_nodes.yml gives the lock without owner: node_stages takes the owner and controller harden_node
    step=start set on the host (facts injected as variables or not), and refuses a lock it cannot name."""
    harden_lock = {"hold": True, "release_if_nothing_cluster_side": False}
    started = {"__harden_owner": "harden@s", "__harden_controller": {"pid": 3}}
    assert _audit_lock(monkeypatch, lock=harden_lock, **started) == {
        "owner": "harden@s", "hold": True, "controller": {"pid": 3}, "path": "/run/gpuharden/run.lock", "timeout": 600}
    assert _audit_lock(monkeypatch, lock=harden_lock, ansible_facts=started)["owner"] == "harden@s"
    # a given owner is the task's (drift_check.yml's), with its own controller or none
    assert "controller" not in _audit_lock(monkeypatch, lock=dict(harden_lock, owner="drift@d"), **started)
    assert _audit_lock(monkeypatch, lock=dict(harden_lock, owner="drift@d"), **started)["owner"] == "drift@d"
    with pytest.raises(AnsibleActionFail, match="lock.owner is not given and harden_node step=start did not name this run on gpu-a"):
        _audit_lock(monkeypatch, lock=harden_lock)
    # check mode takes no lock: nothing to name
    assert _audit_lock(monkeypatch, check_mode=True, lock=harden_lock) is None


def test_the_audits_options_come_from_the_roles_variables_where_asked(monkeypatch, cliargs):
    """audit_from_play: node_audit's options built from the play (tasks/node_stages.yml's, once Jinja there); audit wins."""
    play = {"device_permissions_audit_options": {"policy": "restricted"}, "mig_audit_options": {"config": "all-1g"},
            "container_runtime_audit_options": {"runtime": "nvidia"},
            **_listed({"gpu_operator": {"nodes": {"gpu-a": {"owned": []}}}}), "gpuharden_operator_takeover": ["containerd"]}
    results = {"gpuharden.k8s.node_audit": _audit_result()}
    _result, calls, _task = _run(monkeypatch, results, {"audit": {"facts": False, "containerd": {"runtime": "given"}},
                                                         "audit_from_play": ["gpu_operator", "device_nodes", "containerd", "mig"]},
                                 task_vars=play)
    assert calls[0][1] == {"facts": False, "node_name": "gpu-a", "device_nodes": {"policy": "restricted"}, "containerd": {"runtime": "given"},
                           "mig": {"config": "all-1g"}, "gpu_operator": {"owned": [], "takeover": ["containerd"], "error": None}}
    # a role's variables missing from the play: refused, naming them, before the node is read
    with pytest.raises(AnsibleActionFail, match="cgroup_limits_audit_kubelet_settings, kubelet_topology_audit_options|kubelet_topology_audit_options, "
                       "cgroup_limits_audit_kubelet_settings"):
        _run(monkeypatch, results, {"audit_from_play": ["kubelet"]}, task_vars=play)


def test_the_importing_task_s_one_mapping_gives_the_node_its_facts_and_its_lock(monkeypatch, cliargs):
    """playbooks/tasks/node_stages.yml leaves node_name, audit.facts and lock to the importing task's __node_plan."""
    lock = {"owner": "harden@x", "hold": True, "path": "/run/l", "timeout": 5}
    plan = {"node": "node-7", "facts": False, "lock": lock, "nodes": ["node-7"], "dry_runs": True}
    result, calls, _task = _run(monkeypatch, {"gpuharden.k8s.node_audit": _audit_result()}, {"run_stages": False},
                                task_vars={"__node_plan": plan})
    [(module, audit_args, _check)] = calls
    assert module == "gpuharden.k8s.node_audit" and audit_args["node_name"] == "node-7" and audit_args["facts"] is False
    assert audit_args["lock"]["owner"] == "harden@x" and audit_args["lock"]["hold"] is True and result["node_name"] == "node-7"
    # the task's own wins
    _result, calls, _task = _run(monkeypatch, {"gpuharden.k8s.node_audit": _audit_result()},
                                 {"run_stages": False, "node_name": "gpu-a", "audit": {"facts": True}}, task_vars={"__node_plan": plan})
    assert calls[0][1]["node_name"] == "gpu-a" and calls[0][1]["facts"] is True
    with pytest.raises(AnsibleActionFail, match="__node_plan must be a mapping of node, facts, lock"):
        _run(monkeypatch, {"gpuharden.k8s.node_audit": _audit_result()}, {}, task_vars={"__node_plan": {"nod": "x"}})


def test_a_mapping_without_lock_takes_the_lock_the_drift_checks_start_handed_over(monkeypatch, cliargs):
    """drift_check.yml's __node_plan gives no lock: drift_play step=start decided it and handed it over to every host
    (no registered variable); a hand-over of an earlier run (a fact cache kept it) is not taken, nor outside the
    importing task's mapping (a node_stages task of another playbook)."""
    from ansible_collections.gpuharden.k8s.plugins.action import drift_play

    lock = {"owner": "drift@d", "path": "/run/l", "timeout": 60, "controller": {"pid": 3}}
    started = _handover.handed_over(drift_play.START, {"node_names": {"gpu-a": "gpu-a"}, "nodes": ["gpu-a"], "lock": lock, "pods_snapshot": True})
    results = {"gpuharden.k8s.node_audit": _audit_result()}
    _result, calls, _task = _run(monkeypatch, results, {"run_stages": False}, task_vars=dict(started, __node_plan={"facts": False}))
    assert calls[0][1]["lock"] == {"owner": "drift@d", "hold": False, "path": "/run/l", "timeout": 60, "controller": {"pid": 3}}
    # the mapping's own lock wins (harden's)
    _result, calls, _task = _run(monkeypatch, results, {"run_stages": False},
                                 task_vars=dict(started, __node_plan={"lock": {"owner": "harden@h", "hold": True}}))
    assert calls[0][1]["lock"]["owner"] == "harden@h"
    earlier = {name: dict(value, run=dict(value["run"], pid=-1)) for name, value in started.items()}
    _result, calls, _task = _run(monkeypatch, results, {"run_stages": False}, task_vars=dict(earlier, __node_plan={"facts": False}))
    assert "lock" not in calls[0][1]
    _result, calls, _task = _run(monkeypatch, results, {"run_stages": False}, task_vars=started)
    assert "lock" not in calls[0][1]
