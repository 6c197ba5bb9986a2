# SPDX-License-Identifier: GPL-3.0-or-later
"""drift_check.yml plans each node through harden's stage engine (issue 45 items 1 and 7): the engine's task file,
tasks/node_stages.yml, is the one place node_audit's options are mapped from the roles' variables, and the drift check
imports it plan only, so the audit drift reports is the one that plans harden.  (Replaces the test that kept the
drift check's own copy of those options, tasks/node_plan.yml, equal to the engine's.)"""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"


def _tasks(tasks):
    for task in tasks or []:
        if isinstance(task, dict):
            yield task
            for key in ("block", "rescue", "always"):
                yield from _tasks(task.get(key))


def _playbook_tasks(path):
    document = yaml.safe_load(path.read_text()) or []
    for entry in document:
        if isinstance(entry, dict) and ("hosts" in entry or "import_playbook" in entry or "ansible.builtin.import_playbook" in entry):
            for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                yield from _tasks(entry.get(section))
        else:
            yield from _tasks([entry])


def test_the_drift_check_audits_through_the_engine_plan_only():
    [play, _run_data] = yaml.safe_load((PLAYBOOKS / "drift_check.yml").read_text())
    [plan] = [task for task in play["tasks"] if task.get("ansible.builtin.import_tasks") == "tasks/node_stages.yml"]
    # plan only: no stage runs, no node is refused (plugins/action/node_stages.py, run_stages)
    assert plan["module_defaults"] == {"gpuharden.k8s.node_stages": {"run_stages": False}}
    # one mapping, read by the plan's actions (node_plan_pods, node_stages); the node: node_stages' default, the Node name
    # drift_play's start step gives each host too (gpuharden_k8s_node_name, else the inventory name)
    assert set(plan["vars"]) == {"__node_plan"}
    assert plan["vars"]["__node_plan"] == {"facts": False}
    # the nodes, the pods snapshot and the lock option are the drift_play action's start step's, handed over to every
    # host, where node_plan_pods and node_stages take them (tests/unit/test_drift_play.py, test_node_stages_action.py)
    assert not [task for task in play["tasks"] if "register" in task]
    # the engine's task leaves run_stages to the caller: a task's own argument would win over module_defaults
    [engine] = [task for task in _tasks(yaml.safe_load((PLAYBOOKS / "tasks" / "node_stages.yml").read_text())) if "gpuharden.k8s.node_stages" in task]
    assert "run_stages" not in engine["gpuharden.k8s.node_stages"] and engine["register"] == "gpuharden_node_plan"


def test_node_audits_options_are_written_once():
    """No playbook task runs node_audit itself: the engine does, from the one mapping of its options."""
    assert not (PLAYBOOKS / "tasks" / "node_plan.yml").exists()
    callers = sorted(str(path.relative_to(REPO)) for path in PLAYBOOKS.rglob("*.yml")
                     for task in _playbook_tasks(path) if "gpuharden.k8s.node_audit" in task or "node_audit" in task)
    assert callers == []
    # the mapping of the roles' desired state to the audit's options is the engine's (_stage_plan.audit_options): no
    # playbook writes an option of it, and one task asks for all of them (bootstrap's engine task asks for MIG alone)
    engine_tasks = [(str(path.relative_to(REPO)), task["gpuharden.k8s.node_stages"]) for path in PLAYBOOKS.rglob("*.yml")
                    for task in _playbook_tasks(path) if "gpuharden.k8s.node_stages" in task]
    assert all(set(options.get("audit") or {}) <= {"facts"} for _path, options in engine_tasks), engine_tasks
    mappings = sorted(path for path, options in engine_tasks if "device_nodes" in (options.get("audit_from_play") or ()))
    assert mappings == ["playbooks/tasks/node_stages.yml"]


def test_the_drift_check_runs_one_task_per_host_in_its_first_play():
    """Issue 45 item 7b: every task but the engine's runs once for the play (a task per host costs a worker process
    per host on the controller); the roles' audit_params files add container_runtime's one set_fact."""
    [play, _run_data] = yaml.safe_load((PLAYBOOKS / "drift_check.yml").read_text())
    per_host = [task["name"] for task in _tasks(play["tasks"]) if not task.get("run_once") and "ansible.builtin.import_tasks" not in task]
    assert per_host == []
    inputs = list(_tasks(yaml.safe_load((PLAYBOOKS / "tasks" / "node_plan_inputs.yml").read_text())))
    assert [task["name"] for task in inputs if "ansible.builtin.import_role" not in task and not task.get("run_once")] == [], inputs
