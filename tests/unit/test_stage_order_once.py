# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 15, item 5: the stage order is written once (playbooks/tasks/stages.yml).

harden_gpu_nodes.yml and bootstrap_gpu_node.yml import that file instead of naming the stages themselves; only
harden's budgeted rollout play names the two steps that drain a node, and it keeps the file's order between them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
STAGE_ROLES = ("device_permissions", "container_runtime", "runtime_class", "kubelet_topology", "mig",
               "cgroup_limits", "device_plugin")


def _tasks(tasks):
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


def _play_tasks(play):
    for key in ("pre_tasks", "tasks", "post_tasks"):
        yield from _tasks(play.get(key))


def _role_step(task):
    """(role, tasks_from) for a task that imports or includes one of the stage roles, else None.  An import of a role's
    audit_params.yml is no step: it runs no task (container_runtime's one sets facts), it exposes the role's
    variables to the play (the disruptive play imports cgroup_limits' so, for the kubelet write)."""
    for action in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
        spec = task.get(action)
        if spec:
            role = spec["name"].rpartition(".")[2]
            step = str(spec.get("tasks_from", "main")).removesuffix(".yml")
            if role in STAGE_ROLES and step != "audit_params":
                return role, step
    return None


def _stage_steps():
    return [step for step in map(_role_step, _tasks(yaml.safe_load((PLAYBOOKS / "tasks" / "stages.yml").read_text()))) if step]


def test_the_order_is_the_documented_one():
    assert _stage_steps() == [
        ("device_permissions", "main"), ("container_runtime", "main"),
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
    stages_run = imports[0]["vars"]["__stages_run"]
    if isinstance(stages_run, str):  # one reference to a fact the play sets from its plan
        fact = stages_run.strip("{} ")
        [stages_run] = [task["ansible.builtin.set_fact"][fact] for task in _play_tasks(first)
                        if fact in (task.get("ansible.builtin.set_fact") or {})]
    assert set(stages_run) == {"device_permissions", "container_runtime", "kubelet_topology", "mig", "cgroup_limits"}
    named = [(play["name"], step) for play in plays for step in map(_role_step, _play_tasks(play)) if step]
    rollout = [(name, step) for name, step in named if "disruptive stages" in name]
    assert [step for _name, step in rollout] == ([("kubelet_topology", "main"), ("mig", "main")]
                                                 if playbook == "harden_gpu_nodes.yml" else [])
    assert [entry for entry in named if entry not in rollout] == []


def test_the_drains_run_inline_only_where_the_playbook_says_so():
    inline = {}
    for playbook in ("harden_gpu_nodes.yml", "bootstrap_gpu_node.yml"):
        for play in yaml.safe_load((PLAYBOOKS / playbook).read_text()):
            for task in _play_tasks(play):
                if task.get("ansible.builtin.import_tasks") == "tasks/stages.yml":
                    inline[playbook] = task["vars"]["__stages_inline_disruptive"]
    # harden drains in its budgeted rollout play; bootstrap drains a node that still has its bootstrap taint inline
    assert inline == {"harden_gpu_nodes.yml": False, "bootstrap_gpu_node.yml": True}
