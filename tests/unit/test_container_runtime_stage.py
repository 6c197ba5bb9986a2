# SPDX-License-Identifier: GPL-3.0-or-later
"""Role container_runtime's write and the containerd restarts' steps (module_utils/cluster/_container_runtime_stage.py,
the actions container_runtime_stage, container_runtime_wave and runtime_class_stage): the pure decisions with the node
faked, then the role's and the stage file's tasks in a real ansible-playbook run on localhost, where nothing reaches
containerd."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import ansible_runner
import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.action.runtime_class_stage import module_args as runtime_class_args
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _container_runtime_stage as stage

REPO = Path(__file__).resolve().parents[2]
ENV = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
SETTINGS = {"container_runtime_config": "/etc/containerd/config.toml", "container_runtime_service": "containerd",
            "container_runtime_backup": True, "container_runtime_restart": True, "container_runtime_ready_timeout": "30",
            "container_runtime_audit_options": {"path": "/etc/containerd/config.toml", "runtime_name": "nvidia", "gpu_operator": {}}}
WRITTEN = {"changed": True, "runtime_name": "nvidia", "restart_required": True, "restarted": True,
           "changes": [{"path": "/etc/containerd/conf.d/99-nvidia.toml"}],
           "readiness": {"ready": True, "error": None}, "rollback": None}


class Node:
    """The node as the action's modules see it: the paths that exist, and containerd_nvidia_runtime's result."""

    def __init__(self, existing, written=None):
        self.existing, self.written, self.calls = set(existing), written or WRITTEN, []

    def __call__(self, name, module_args):
        self.calls.append((name, module_args))
        if name == stage.STAT:
            return {"stat": {"exists": module_args["path"] in self.existing}}
        return json.loads(json.dumps(self.written))


def test_one_stat_where_the_configuration_directory_is_there():
    node = Node({"/etc/containerd"})
    result = stage.decide(SETTINGS, "gpu-a", True, node)
    assert [name for name, _args in node.calls] == [stage.STAT, stage.CONTAINERD]
    assert result["changed"] is True and "failed" not in result
    assert result["ansible_facts"] == {"container_runtime_handler": "nvidia", "container_runtime_restart_required": False}


def test_without_the_directory_a_unit_shows_containerd_is_installed():
    node = Node({"/usr/lib/systemd/system/containerd.service"})
    assert "failed" not in stage.decide(SETTINGS, "gpu-a", True, node)
    assert [args["path"] for name, args in node.calls if name == stage.STAT] == [
        "/etc/containerd", "/etc/systemd/system/containerd.service", "/lib/systemd/system/containerd.service",
        "/usr/lib/systemd/system/containerd.service"]
    assert node.calls[-1][0] == stage.CONTAINERD


def test_without_directory_and_unit_the_host_fails_before_anything_is_written():
    node = Node(set())
    settings = dict(SETTINGS, container_runtime_config="/opt/absent/config.toml", container_runtime_service="ctrd")
    result = stage.decide(settings, "gpu-a", True, node)
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"] == ("container_runtime: no /opt/absent and no ctrd.service on gpu-a; install containerd before "
                             "adding the NVIDIA runtime.")
    assert stage.CONTAINERD not in [name for name, _args in node.calls]


def test_the_module_takes_the_role_options_and_the_write_s_own():
    node = Node({"/etc/containerd"})
    stage.decide(SETTINGS, "gpu-a", True, node)
    assert node.calls[-1][1] == {"path": "/etc/containerd/config.toml", "runtime_name": "nvidia", "gpu_operator": {},
                                 "backup": True, "restart": "if_required", "service": "containerd", "ready_timeout": 30}
    assert stage.module_args(SETTINGS, False)["restart"] == "never"


def test_a_restart_left_to_the_user_is_reported_pending():
    written = dict(WRITTEN, restarted=False, readiness=None)
    result = stage.decide(dict(SETTINGS, container_runtime_restart=False), "gpu-a", False, Node({"/etc/containerd"}, written))
    assert result["ansible_facts"]["container_runtime_restart_required"] is True and "failed" not in result
    assert stage.decide(SETTINGS, "gpu-a", False, Node({"/etc/containerd"}, dict(written, restart_required=False))
                        )["ansible_facts"]["container_runtime_restart_required"] is False


def test_a_module_failure_is_the_task_s_as_the_module_gave_it():
    failed = {"failed": True, "msg": "/etc/containerd/config.toml: invalid TOML"}
    assert stage.decide(SETTINGS, "gpu-a", True, Node({"/etc/containerd"}, failed)) == failed


@pytest.mark.parametrize(("again", "said"), [
    ({"ready": True, "error": None}, "restarted with them: it serves again."),
    ({"ready": False, "error": "containerd is failed after the restart"},
     "restarted with them: it does not come back either (containerd is failed after the restart): see its log."),
])
def test_containerd_that_did_not_come_back_fails_the_host_naming_files_reason_and_the_second_restart(again, said):
    written = dict(WRITTEN, readiness={"ready": False, "error": "containerd is failed after the restart"},
                   rollback={"restored": ["/etc/containerd/conf.d/99-nvidia.toml"], "readiness": again})
    result = stage.decide(SETTINGS, "gpu-a", True, Node({"/etc/containerd"}, written))
    assert result["failed"] is True and result["restarted"] is True and result["rollback"] == written["rollback"]
    assert result["msg"] == ("containerd did not come back with the new configuration (/etc/containerd/conf.d/99-nvidia.toml): "
                             "containerd is failed after the restart. The files were put back as they were "
                             "(/etc/containerd/conf.d/99-nvidia.toml) and containerd " + said)


def test_no_failure_without_a_restart_or_once_containerd_serves():
    assert stage.rollback_failure("containerd", WRITTEN) is None
    assert stage.rollback_failure("containerd", dict(WRITTEN, restarted=False, readiness=None)) is None


WAVE = {"index": 1, "nodes": ["node-b", "node-c"], "settle": ["node-a"], "before": ["node-a"]}


@pytest.mark.parametrize(("step", "runs", "node", "not_started", "expected"), [
    (None, True, "node-a", {}, True),
    (None, False, "node-a", {}, False),
    (WAVE, True, "node-b", {}, True),
    (WAVE, True, "node-a", {}, False),  # the canary's wave is over
    (WAVE, False, "node-b", {}, False),
])
def test_a_host_runs_the_stage_in_its_own_wave_where_its_plan_runs_it(step, runs, node, not_started, expected):
    decided = stage.wave_host(step, runs, node, not_started, "host")
    assert decided["run"] is expected and decided["reason"]


def test_a_host_the_gate_stopped_fails_with_the_gate_s_reason_even_where_its_plan_skips_the_stage():
    reason = "containerd not restarted, the restarts stopped: node-a is not Ready"
    for runs in (True, False):
        assert stage.wave_host(WAVE, runs, "node-b", {"host": reason}, "host") == {"failed": True, "msg": reason}


def test_runtime_class_takes_the_role_options_and_leaves_an_empty_kubeconfig_or_context_to_the_client():
    options = {"name": "nvidia", "handler": "nvidia"}
    assert runtime_class_args(options, "", "", "false", []) == dict(options, force=False, nodes=[])
    assert runtime_class_args(options, "/k", "ctx", True, ["n"]) == dict(options, force=True, nodes=["n"], kubeconfig="/k", context="ctx")


def _run(tmp, plays, inventory):
    (Path(tmp) / "pb.yml").write_text(yaml.safe_dump(plays))
    return ansible_runner.run(private_data_dir=tmp, playbook=str(Path(tmp) / "pb.yml"), envvars=ENV, quiet=True, inventory=inventory)


def test_the_role_stops_before_any_write_without_containerd(tmp_path):
    """The role's main.yml (include_role, standalone): no configuration directory and no unit fails the host with the
    message naming both (tasks/audit_params.yml set the facts before)."""
    record = "{{ {'outcome': outcome, 'handler': container_runtime_handler, 'pending': container_runtime_restart_required} | to_json }}"
    values = {"container_runtime_config": str(tmp_path / "absent/config.toml"), "container_runtime_service": "gpuharden-test-no-such-unit",
              "container_runtime_runtime_name": "nvidia-test"}
    plays = [{
        "hosts": "localhost", "gather_facts": False, "vars": values,
        "tasks": [{"ansible.builtin.import_role": {"name": "gpuharden.k8s.container_runtime", "tasks_from": "audit_params"}},
                  {"block": [{"ansible.builtin.include_role": {"name": "gpuharden.k8s.container_runtime"}},
                             {"ansible.builtin.set_fact": {"outcome": None}}],
                   "rescue": [{"ansible.builtin.set_fact": {"outcome": "{{ ansible_failed_result.msg }}"}}]},
                  {"ansible.builtin.copy": {"dest": str(tmp_path / "out.json"), "content": record}}],
    }]
    with tempfile.TemporaryDirectory() as tmp:
        run = _run(tmp, plays, "localhost ansible_connection=local ansible_python_interpreter=%s" % sys.executable)
        assert run.rc == 0, run.stdout.read()[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["handler"] == "nvidia-test" and out["pending"] is False
    assert out["outcome"] == ("container_runtime: no %s and no gpuharden-test-no-such-unit.service on localhost; install containerd "
                              "before adding the NVIDIA runtime." % (tmp_path / "absent"))


def test_every_node_at_once_the_gate_waits_for_nothing_and_a_host_whose_plan_skips_the_stage_includes_no_role(tmp_path):
    """tasks/stage_container_runtime.yml as tasks/stages.yml runs it where the playbook gives no waves (a step of None)."""
    # as tasks/stages.yml includes it: once per step label (the actions take the step by it)
    rc, tail, events = _include_the_stage(tmp_path, {"container_runtime": False, "node_name": "node-a", "container_runtime_steps": [None],
                                                    "container_runtime_waves": ["every node"], "container_runtime_here": []})
    assert rc == 0, tail
    gates = [event["event_data"] for event in events if event.get("event") == "runner_on_skipped"
             and event["event_data"].get("task", "").startswith("Stage | containerd restarts | has the previous wave come back")]
    assert len(gates) == 1
    out = _host_step(events)
    assert out["run"] is False and "plan" in out["reason"]
    assert not _role_tasks(events)


def test_a_wave_step_is_taken_by_its_label_and_a_node_of_another_wave_includes_no_role(tmp_path):
    """The include's loop item is the step's label (tasks/stages.yml loops over container_runtime_waves): the host step
    takes the step and the Node name from step stages' result; a node whose plan runs the stage waits for its wave."""
    rc, tail, events = _include_the_stage(
        tmp_path, {"container_runtime": True, "node_name": "node-a", "container_runtime_steps": [{"index": 0, "nodes": ["node-b"]}],
                   "container_runtime_waves": ["wave 0: node-b"], "container_runtime_here": []})
    assert rc == 0, tail
    out = _host_step(events)
    assert out["run"] is False and out["reason"] == "node node-a restarts containerd in another wave"
    assert not _role_tasks(events)


def test_the_step_of_a_host_that_restarts_includes_the_role(tmp_path):
    """The same step for a node of the wave (step stages' container_runtime_here names it): the role runs, and fails
    here (no containerd in a temporary directory), which a condition that never held would not show."""
    _rc, _out, events = _include_the_stage(
        tmp_path, {"container_runtime": True, "node_name": "node-b", "container_runtime_steps": [{"index": 0, "nodes": ["node-b"]}],
                   "container_runtime_waves": ["wave 0: node-b"], "container_runtime_here": ["wave 0: node-b"]},
        container_runtime_service="gpuharden-test-no-such-unit")
    assert _host_step(events) == {"run": True, "reason": "wave 0", "changed": False}
    failed = [event["event_data"]["res"]["msg"] for event in _role_tasks(events) if event["event"] == "runner_on_failed"]
    assert failed and "install containerd before adding the NVIDIA runtime" in failed[0], failed


def _include_the_stage(tmp_path, stages_run, **variables):
    """tasks/stage_container_runtime.yml included as tasks/stages.yml does it, once per step label, for one host whose
    step stages gave ``stages_run``; the role would fail (no containerd in a temporary directory) where it runs."""
    plays = [{
        "hosts": "localhost", "gather_facts": False,
        "vars": dict({"__stages_run": stages_run, "container_runtime_config": str(tmp_path / "absent/config.toml")}, **variables),
        "tasks": [{"ansible.builtin.include_tasks": str(REPO / "playbooks/tasks/stage_container_runtime.yml"),
                   "loop": stages_run["container_runtime_waves"]}],
    }]
    with tempfile.TemporaryDirectory() as tmp:
        run = _run(tmp, plays, "localhost ansible_connection=local ansible_python_interpreter=%s" % sys.executable)
        return run.rc, run.stdout.read()[-3000:], list(run.events)


def _host_step(events):
    [result] = [event["event_data"]["res"] for event in events if event.get("event") == "runner_on_ok"
                and event["event_data"].get("task", "").startswith("Stage | containerd restarts | fail the node")]
    return {key: result[key] for key in ("run", "reason", "changed")}


def _role_tasks(events):
    return [event for event in events if event.get("event") in ("runner_on_ok", "runner_on_failed")
            and str(event["event_data"].get("role", "")).endswith("container_runtime")]
