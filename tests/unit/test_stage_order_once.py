# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 15, item 5: the stage order is written once (the stage registry, module_utils/core/_stage_plan.py STAGES;
playbooks/tasks/stages.yml runs the stages the play owns in that order, after the stage engine ran its own).

harden_gpu_nodes.yml and bootstrap_gpu_node.yml import that file instead of naming the stages themselves; only
harden's budgeted rollout play names the two steps that drain a node, and it keeps the file's order between them, and
harden runs the last stage, the device plugin, after that play, from the one file stages.yml imports it from.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _stage_plan, _vocabulary

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
STAGE_ROLES = _vocabulary.STAGES  # the one stage list (issue 45 item 3)


def _tasks(tasks):
    """Every task, into blocks and into the task files of playbooks/tasks/ that a task imports (stage_*.yml)."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))
        imported = _tasks_file(task)
        if imported.removeprefix("tasks/").startswith("stage_"):
            yield from _tasks(yaml.safe_load((PLAYBOOKS / "tasks" / imported.removeprefix("tasks/")).read_text()))


def _tasks_file(task):
    """The tasks file a task imports or includes, else ""."""
    spec = task.get("ansible.builtin.import_tasks") or task.get("ansible.builtin.include_tasks") or ""
    return str(spec.get("file", "") if isinstance(spec, dict) else spec)


def _play_tasks(play):
    for key in ("pre_tasks", "tasks", "post_tasks"):
        yield from _tasks(play.get(key))


def _role_step(task):
    """(role, tasks_from) for a task that imports or includes one of the stage roles, else None.  An import of a role's
    audit_params.yml is no step: it runs no task (container_runtime's one sets facts), it exposes the role's
    variables to the play (the disruptive play imports cgroup_limits' so, for the kubelet write).  Nor is its
    preflight.yml, which only checks variables (harden checks the device plugin's before any stage runs)."""
    for action in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
        spec = task.get(action)
        if spec:
            role = spec["name"].rpartition(".")[2]
            step = str(spec.get("tasks_from", "main")).removesuffix(".yml")
            if role in STAGE_ROLES and step not in ("audit_params", "preflight"):
                return role, step
    return None


def _stage_steps():
    return [step for step in map(_role_step, _tasks(yaml.safe_load((PLAYBOOKS / "tasks" / "stages.yml").read_text()))) if step]


def test_the_order_is_the_documented_one():
    # the stage engine runs device_permissions, the first stage, itself (node_stages); the play runs the others
    assert [stage.name for stage in _stage_plan.STAGES if stage.engine] == ["device_permissions"]
    assert _stage_plan.STAGE_NAMES[0] == "device_permissions"
    assert _stage_steps() == [
        ("container_runtime", "main"),
        # the RuntimeClass's handler comes from the container_runtime stage, and the plugin runs with that class
        ("runtime_class", "main"),
        # both plans before the budget, so that the budget knows whether this node drains
        ("kubelet_topology", "plan"), ("mig", "plan"),
        ("kubelet_topology", "apply"), ("mig", "apply"),
        # the kubelet stage writes cgroup_limits' kubelet settings (MemoryQoS) before memory.high is set
        ("cgroup_limits", "main"),
        # last: it advertises what the node ended up with
        ("device_plugin", "main"),
    ]


@pytest.mark.parametrize("playbook", ["harden_gpu_nodes.yml", "bootstrap_gpu_node.yml"])
def test_the_playbook_imports_the_one_order_and_names_no_stage_itself(playbook):
    plays = yaml.safe_load((PLAYBOOKS / playbook).read_text())
    first = plays[0]
    imports = [task for task in _play_tasks(first) if task.get("ansible.builtin.import_tasks") == "tasks/stages.yml"]
    assert len(imports) == 1, "%s: its first play imports tasks/stages.yml %d times" % (playbook, len(imports))
    # the stage engine's plan (node_stages: node_audit's stage table, or every stage with skip_compliant false), the
    # task before it registers; the planner's node stages are the audit's
    if playbook == "harden_gpu_nodes.yml":  # through tasks/node_stages.yml (the drift check's inputs and audit)
        stages_run = imports[0]["vars"]["__stages"]["plan"]
        registered = re.fullmatch(r"\{\{ (\w+) \}\}", stages_run).group(1)
        engines = [task for task in yaml.safe_load((PLAYBOOKS / "tasks" / "node_stages.yml").read_text())
                   if "gpuharden.k8s.node_stages" in task and task.get("register") == registered]
    else:
        # bootstrap_node's step plan runs the engine and hands its plan over to stage_steps (no plan in __stages:
        # test_bootstrap_plan.py checks the hand-over), before the import
        assert "plan" not in imports[0]["vars"]["__stages"]
        tasks = list(_play_tasks(first))
        engines = [task for task in tasks if (task.get("gpuharden.k8s.bootstrap_node") or {}).get("step") == "plan"]
        assert engines and tasks.index(engines[0]) < tasks.index(imports[0])
    assert len(engines) == 1, playbook
    assert tuple(stage for stage, _check in _node_audit.NODE_STAGES) == _stage_plan.NODE_STAGE_NAMES
    named = [(play["name"], step) for play in plays for step in map(_role_step, _play_tasks(play)) if step]
    rollout = [(name, step) for name, step in named if "disruptive stages" in name]
    assert [step for _name, step in rollout] == ([("kubelet_topology", "main"), ("mig", "main")]
                                                 if playbook == "harden_gpu_nodes.yml" else [])
    # harden's device plugin stage runs in a later play (tasks/stage_device_plugin.yml, the file stages.yml imports)
    later = [(name, step) for name, step in named if step == ("device_plugin", "main") and "device plugin" in name]
    assert len(later) == (1 if playbook == "harden_gpu_nodes.yml" else 0), named
    assert [entry for entry in named if entry not in rollout and entry not in later] == []


def test_the_drains_run_inline_only_where_the_playbook_says_so():
    inline = {}
    for playbook in ("harden_gpu_nodes.yml", "bootstrap_gpu_node.yml"):
        for play in yaml.safe_load((PLAYBOOKS / playbook).read_text()):
            for task in _play_tasks(play):
                if task.get("ansible.builtin.import_tasks") == "tasks/stages.yml":
                    inline[playbook] = task["vars"]["__stages"]["inline_disruptive"]
    # harden drains in its budgeted rollout play; bootstrap drains a node that still has its bootstrap taint inline
    assert inline == {"harden_gpu_nodes.yml": False, "bootstrap_gpu_node.yml": True}


def test_harden_runs_the_device_plugin_after_its_rollout_and_before_the_post_check():
    """Found with the real kubelet: a node whose kubelet is stopped (the stale checkpoint the rollout repairs) never lets
    its plugin pod go, so a plugin rollout before the repair waited 300 s and failed the run (tasks/stage_device_plugin.yml)."""
    plays = yaml.safe_load((PLAYBOOKS / "harden_gpu_nodes.yml").read_text())
    [stages] = [task for task in _play_tasks(plays[0]) if task.get("ansible.builtin.import_tasks") == "tasks/stages.yml"]
    assert stages["vars"]["__stages"]["device_plugin_later"] is True
    names = [play["name"] for play in plays]
    rollout = next(index for index, name in enumerate(names) if "disruptive stages" in name)
    def imported(task):
        return _tasks_file(task) or str(task.get("ansible.builtin.import_role", {}).get("name"))

    steps = [(index, imported(task)) for index, play in enumerate(plays) for task in _play_tasks(play)]
    [plugin] = [index for index, step in steps if step == "tasks/stage_device_plugin.yml"]
    postcheck = [index for index, step in steps if step == "gpuharden.k8s.postcheck"]
    assert plugin > rollout and postcheck == [plugin]
    tasks = [imported(task) for task in _play_tasks(plays[plugin])]
    assert tasks.index("tasks/stage_device_plugin.yml") < tasks.index("gpuharden.k8s.postcheck")
    # not after a rollout that stopped at a failed node (its kubelet may be stopped: the plugin's update would hang there)
    # Decided once for the play, on the task just before the stage and with its tags (deciding on every host read every
    # host's variables on every host)
    play_tasks = list(_play_tasks(plays[plugin]))
    [position] = [index for index, task in enumerate(play_tasks) if _tasks_file(task) == "tasks/stage_device_plugin.yml"]
    stage, decision = play_tasks[position], play_tasks[position - 1]
    # the gate (plugins/action/cluster_stage_gate.py): no plugin update after a failed rollout step, nor where the
    # plan's dry run of it found nothing to do and no node-side stage ran (tests/unit/test_cluster_stage_gate.py)
    assert decision["gpuharden.k8s.cluster_stage_gate"] == {"stage": "device_plugin"}
    assert decision["run_once"] is True and decision["tags"] == stage["tags"]
    assert stage["when"] == "%s.run" % decision["register"]
