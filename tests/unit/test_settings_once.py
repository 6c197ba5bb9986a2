# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 15, item 5: each role's options are mapped to its module once, for harden, bootstrap and the audit.

The mapping is written once, in the settings table (core/_settings.py feeds/feed_as), and built by
core/_role_options.py; each role's vars/main.yml exposes it through the lookup gpuharden.k8s.role_options.  The role's
module call takes that map (module_defaults, or the module's arguments), and the role's ``<role>_audit_options`` (the
same map) goes to node_audit (or the drift check's dry run), so the desired state cannot be spelt two ways.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _role_options, _settings

REPO = Path(__file__).resolve().parents[2]

# role -> (its audit option fact, the module its tasks call with the same options)
ROLES = {
    "device_permissions": ("device_permissions_audit_options", "gpuharden.k8s.nvidia_device_nodes"),
    "container_runtime": ("container_runtime_audit_options", "gpuharden.k8s.containerd_nvidia_runtime"),
    "kubelet_topology": ("kubelet_topology_audit_options", "gpuharden.k8s.kubelet_config"),
    "cgroup_limits": ("cgroup_limits_audit_options", "gpuharden.k8s.cgroup_memory"),
    "mig": ("mig_audit_options", "gpuharden.k8s.mig_layout"),
    "runtime_class": ("runtime_class_audit_options", "gpuharden.k8s.runtime_class"),
    "device_plugin": ("device_plugin_audit_options", "gpuharden.k8s.device_plugin"),
}

def _tasks(data):
    stack = list(data or [])
    while stack:
        task = stack.pop()
        if isinstance(task, dict):
            yield task
            for key in ("block", "rescue", "always"):
                stack.extend(task.get(key) or [])


PLANNER = "gpuharden.k8s.kubelet_topology_plan"
PLANNED = {"kubelet_topology": ("__kubelet_topology_stage.write_options",)}
# role -> the action that runs the role's module itself, reading the role's map by name (plugins/action/mig_stage.py,
# device_plugin_stage.py, container_runtime_stage.py)
RUN_BY_ACTION = {"mig": "gpuharden.k8s.mig_stage", "cgroup_limits": "gpuharden.k8s.cgroup_limits_immediate",
                 "device_permissions": "gpuharden.k8s.device_permissions_repair", "device_plugin": "gpuharden.k8s.device_plugin_stage",
                 "container_runtime": "gpuharden.k8s.container_runtime_stage", "runtime_class": "gpuharden.k8s.runtime_class_stage"}


def _action_reads(action, names):
    """Whether a task's action plugin reads one of the maps ``names`` as a role variable (StageAction.variable, or an
    argument left out read from the role's variable: StageAction.with_role_variables' (expression, default) pairs)."""
    source = (REPO / "plugins" / "action" / ("%s.py" % action.split(".")[-1])).read_text()
    return any(read % name in source for read in ('self.variable("%s")', 'self.role_variable("%s")', '("%s", None)') for name in names)


def _same_map(role, fact):
    """The names of roles/<role>/vars/main.yml that expose the map ``fact`` does: the same role's options of the same
    module, built by core/_role_options.py from the same settings (mig's audit map is its module map, or {} without a layout)."""
    defined = yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text())
    if fact not in defined:
        raise AssertionError("roles/%s/vars/main.yml defines no %s" % (role, fact))
    # and those the stage actions build where they read them (core/_role_options.py BUILT_WHERE_READ)
    defined = list(defined) + [name for name in _role_options.BUILT_WHERE_READ if _role_options.BUILDERS[name][0] == role]
    return {name for name in defined if name in _role_options.BUILDERS and _role_options.BUILDERS[name][:2] == _role_options.BUILDERS[fact][:2]}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_the_audit_takes_the_options_the_role_passes_its_module(role):
    fact, module = ROLES[role]
    names = _same_map(role, fact)
    assert fact in names, "%s: %s is not one of the role's options maps (core/_role_options.py BUILDERS)" % (role, fact)
    module_options = {entry["feeds"][1] for entry in _settings.ROLES[role]["settings"] if entry["feeds"] and entry["feeds"][0] == module.split(".")[-1]}
    assert module_options, "the settings table says no setting of %s feeds %s" % (role, module)
    callers, planned = [], []
    # kubelet_topology's write takes the options as its plan handed them on (kubelet_topology_plan's write_options: the
    # same, less the manager fields where the admission gate keeps them; tests/unit/test_kubelet_stage.py)
    accepted = tuple("{{ %s }}" % name for name in sorted(names)) + tuple("{{ %s }}" % name for name in PLANNED.get(role, ()))
    for path in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        for task in _tasks(yaml.safe_load(path.read_text())):
            defaults = task.get("module_defaults") or {}
            for given in [defaults.get(module), task.get(module) if isinstance(task.get(module), str) else None]:
                if given is not None:
                    assert " ".join(str(given).split()) in accepted, (path, given)
                    callers.append(path.name)
            if (task.get(PLANNER) or {}).get("options") in accepted:
                planned.append(path.name)
            # the plan's task gives no options: the action reads the role's map itself (plan.yml's task has no argument)
            if PLANNER in task and not task[PLANNER] and _action_reads(PLANNER, names):
                planned.append(path.name)
            if RUN_BY_ACTION.get(role) in task and _action_reads(RUN_BY_ACTION[role], names):
                callers.append(path.name)
            if isinstance(task.get(module), dict):
                spelt = sorted(set(task[module]) & module_options)
                assert not spelt, "%s calls %s with %s spelt out again" % (path.name, module, spelt)
    # kubelet_topology's write is the action kubelet_topology_apply's: it writes the plan's write_options
    # (tests/unit/test_kubelet_stage.py pins it), so the planner's task is where the role passes its options
    assert callers or role in PLANNED, "no task of roles/%s passes %s to %s" % (role, " or ".join(sorted(names)), module)
    assert planned or role not in PLANNED, "no task of roles/%s passes its options to %s" % (role, PLANNER)


def _imported_roles(tasks, base):
    """Roles a play's tasks import statically, following import_tasks files (role variables reach a play only so)."""
    roles = set()
    for task in _tasks(tasks):
        imported = task.get("ansible.builtin.import_role") or task.get("import_role")
        if imported:
            roles.add(imported["name"])
        path = task.get("ansible.builtin.import_tasks") or task.get("import_tasks")
        if path:
            roles |= _imported_roles(yaml.safe_load((base / path).read_text()), (base / path).parent)
    return roles


@pytest.mark.parametrize("playbook", sorted(path.name for path in (REPO / "playbooks").glob("*_*.yml")))
def test_every_play_with_the_kubelet_write_sees_the_cgroup_limits_settings(playbook):
    """kubelet_topology's kubelet write merges cgroup_limits_audit_kubelet_settings, a variable of role cgroup_limits:
    a play that imports kubelet_topology must import cgroup_limits too, or its kubelet write drops MemoryQoS (harden's
    disruptive play did, and a drift after `--remediate` found cgroup_limits drift)."""
    for play in yaml.safe_load((REPO / "playbooks" / playbook).read_text()) or []:
        if "hosts" not in play:
            continue
        roles = _imported_roles(play.get("pre_tasks", []) + play.get("tasks", []), REPO / "playbooks")
        if "gpuharden.k8s.kubelet_topology" in roles:
            assert "gpuharden.k8s.cgroup_limits" in roles, "%s, play %r" % (playbook, play.get("name"))
