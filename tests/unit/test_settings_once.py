# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 15, item 5: each role's options are mapped to its module once, for harden, bootstrap and the audit.

The mapping is a ``__<role>_..._options`` variable in the role's vars/main.yml.  The role's module call takes it as
module_defaults, and the role's ``<role>_audit_options`` variable (vars/main.yml too) hands exactly that variable to
node_audit (or the drift check's dry run), so the desired state cannot be spelt two ways.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ONE_REFERENCE = re.compile(r"^\{\{ *(__[a-z_]+_options) *\}\}$")

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
# device_plugin's audit options leave the options that are none out (the module refuses null where it has choices),
# and its module call takes them so
DROPS_NONE = re.compile(r"^\{\{ *(__[a-z_]+_options) *\| *dict2items *\| *rejectattr\('value', 'none'\) *\| *items2dict *\}\}$")


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


def _audit_reference(role, variable):
    defined = yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text())
    if variable not in defined:
        raise AssertionError("roles/%s/vars/main.yml defines no %s" % (role, variable))
    return defined[variable]


@pytest.mark.parametrize("role", sorted(ROLES))
def test_the_audit_options_cost_no_task(role):
    """node_plan imports each role's tasks/audit_params.yml to expose its variables: no set_fact of an audit option,
    which would be one worker process per host (container_runtime keeps one task, for facts read through hostvars)."""
    variable, _module = ROLES[role]
    tasks = list(_tasks(yaml.safe_load((REPO / "roles" / role / "tasks" / "audit_params.yml").read_text())))
    assert not [task for task in tasks if variable in (task.get("ansible.builtin.set_fact") or {})]
    assert len(tasks) == (1 if role == "container_runtime" else 0), tasks


@pytest.mark.parametrize("role", sorted(ROLES))
def test_the_audit_takes_the_options_the_role_passes_its_module(role):
    fact, module = ROLES[role]
    text = " ".join(_audit_reference(role, fact).split())
    names = ONE_REFERENCE.findall(text) or DROPS_NONE.findall(text) or re.findall(r"(__[a-z_]+_options) if", text)
    assert len(names) == 1, "%s: %s is %r, not one reference to the role's module options" % (role, fact, text)
    [options] = names
    defined = yaml.safe_load((REPO / "roles" / role / "vars" / "main.yml").read_text())
    assert isinstance(defined.get(options), dict), "%s is not defined in roles/%s/vars/main.yml" % (options, role)
    callers, planned = [], []
    # kubelet_topology's write takes the options as its plan handed them on (kubelet_topology_plan's write_options: the
    # same, less the manager fields where the admission gate keeps them; tests/unit/test_kubelet_stage.py)
    accepted = ("{{ %s }}" % options, "{{ %s }}" % fact) + tuple("{{ %s }}" % name for name in PLANNED.get(role, ()))
    for path in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        for task in _tasks(yaml.safe_load(path.read_text())):
            defaults = task.get("module_defaults") or {}
            if module in defaults:
                assert " ".join(str(defaults[module]).split()) in accepted, (path, defaults[module])
                callers.append(path.name)
            if (task.get(PLANNER) or {}).get("options") == "{{ %s }}" % options:
                planned.append(path.name)
            if module in task:
                spelt = sorted(set(task[module] or {}) & set(defined[options]))
                assert not spelt, "%s calls %s with %s spelt out again" % (path.name, module, spelt)
    # kubelet_topology's write is the action kubelet_topology_apply's: it writes the plan's write_options
    # (tests/unit/test_kubelet_stage.py pins it), so the planner's task is where the role passes its options
    assert callers or role in PLANNED, "no task of roles/%s passes %s to %s" % (role, options, module)
    assert planned or role not in PLANNED, "no task of roles/%s passes %s to %s" % (role, options, PLANNER)


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
