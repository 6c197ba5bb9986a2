# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.check_variables: refuse misspelt gpuharden variables before a run.

Ansible ignores a variable nobody reads, so `kubelet_topology_tppology_manager_policy: none` in a host_vars file
leaves the role default in force and the run reports success.  This action looks at the names of the variables
each host of the play has (inventory, extra vars, play vars), keeps those with the collection's prefixes
(``gpuharden_`` and each role's name plus ``_``) and fails on any the collection does not know, with the closest
known name.  It runs once for the play (``run_once``, on the first host of each serial batch) and checks every host
of every batch, so that a later batch's typo stops the run before the first batch is changed.  It reads the
collection's own files next to this plugin, so it works from an installed tarball:

* ``roles/*/meta/argument_specs.yml`` (every option of every entry point),
* ``roles/*/defaults/main.yml`` and ``roles/*/vars/main.yml`` (their keys),
* ``meta/variables.yml`` (the playbooks' own gpuharden_* variables),
* the names the collection's tasks set themselves (``register:`` and ``set_fact`` keys in ``roles/*/tasks``,
  ``roles/*/handlers``, ``playbooks/`` and ``playbooks/tasks/``), which later plays of a run still see.

The functions above ActionModule are pure (a ``load(path)`` callable reads YAML), for the unit tests.
"""

from __future__ import annotations

import difflib
import fnmatch
import os

import yaml
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

COLLECTION_PREFIX = "gpuharden_"
ALLOW_VARIABLE = "gpuharden_allow_unknown_variables"
EXTRA_VARIABLE = "gpuharden_known_extra_variables"
# A name without one of the prefixes is still reported when it is this close to a known name: a typo in the
# prefix itself (kubelet_toplogy_cpu_manager_policy).  High, so that a site's own variables do not trip it.
PREFIX_TYPO_CUTOFF = 0.9
SUGGESTION_CUTOFF = 0.6
SET_FACT_ACTIONS = ("set_fact", "ansible.builtin.set_fact", "ansible.legacy.set_fact")
# Hosts named in the failure message per variable before "and N more".
HOSTS_SHOWN = 5


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """Safe YAML that reads Ansible's !unsafe and !vault values as plain data (only the names matter here)."""


def _untagged(loader, _suffix, node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_scalar(node)


_Loader.add_multi_constructor("!", _untagged)


def load_yaml(path):
    # Ansible's own DataLoader takes ~7x longer for the ~40 files.
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_Loader)  # noqa: S506 (a safe loader)


def collection_root():
    """The collection's top directory: plugins/action/<this file> -> ../.."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _yaml_files(directory):
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, name) for name in os.listdir(directory) if name.endswith((".yml", ".yaml")))


def _load_mapping(load, path):
    if not os.path.isfile(path):
        return {}
    data = load(path)
    return data if isinstance(data, dict) else {}


def names_set_by_tasks(data):
    """Variable names a task file or playbook sets itself: register: targets and set_fact keys, at any depth."""
    names = set()
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if isinstance(item.get("register"), str):
                names.add(item["register"])
            for action in SET_FACT_ACTIONS:
                if isinstance(item.get(action), dict):
                    names.update(key for key in item[action] if key != "cacheable")
            stack.extend(value for value in item.values() if isinstance(value, list | dict))
    return names


def role_names(root):
    roles = os.path.join(root, "roles")
    if not os.path.isdir(roles):
        return []
    return sorted(name for name in os.listdir(roles) if os.path.isdir(os.path.join(roles, name)) and not name.startswith("."))


def known_variables(root, load):
    """(prefixes, known names) of the collection below ``root``; ``load(path)`` returns a YAML file's data."""
    roles = role_names(root)
    prefixes = (COLLECTION_PREFIX,) + tuple(role + "_" for role in roles)
    known = set(_load_mapping(load, os.path.join(root, "meta", "variables.yml")).get("variables") or {})
    task_files = _yaml_files(os.path.join(root, "playbooks")) + _yaml_files(os.path.join(root, "playbooks", "tasks"))
    for role in roles:
        base = os.path.join(root, "roles", role)
        specs = _load_mapping(load, os.path.join(base, "meta", "argument_specs.yml")).get("argument_specs") or {}
        for entry in specs.values():
            known.update((entry or {}).get("options") or {})
        for part in ("defaults", "vars"):
            known.update(_load_mapping(load, os.path.join(base, part, "main.yml")))
        task_files += _yaml_files(os.path.join(base, "tasks")) + _yaml_files(os.path.join(base, "handlers"))
    for path in task_files:
        known.update(names_set_by_tasks(load(path)))
    return prefixes, frozenset(known)


def _is_extra(name, extra):
    return any(name == pattern or fnmatch.fnmatchcase(name, pattern) for pattern in extra)


def unknown_variables(names, prefixes, known, extra=()):
    """[(name, suggestion or None)] for the names in ``names`` the collection does not know.

    A name counts when it has one of ``prefixes``, or when it is within PREFIX_TYPO_CUTOFF of a known name (the
    prefix itself misspelt).  Names starting with ``_`` (internal) or ``ansible_`` never count, nor those ``extra``
    (names or shell patterns) allows.
    """
    candidates = sorted(known)
    found = []
    for name in sorted(set(names)):
        if name in known or name.startswith(("_", "ansible_")) or _is_extra(name, extra):
            continue
        if name.startswith(prefixes):
            match = difflib.get_close_matches(name, candidates, n=1, cutoff=SUGGESTION_CUTOFF)
        else:
            match = difflib.get_close_matches(name, candidates, n=1, cutoff=PREFIX_TYPO_CUTOFF)
            if not match:
                continue
        found.append((name, match[0] if match else None))
    return found


def failure_message(unknown_by_host, lead="unknown variables, nothing was changed"):
    """One line per unknown name: the suggestion and the hosts that have it."""
    hosts_by_name, suggestion = {}, {}
    for host, unknown in unknown_by_host.items():
        for name, match in unknown:
            hosts_by_name.setdefault(name, []).append(host)
            suggestion[name] = match
    lines = []
    for name in sorted(hosts_by_name):
        hosts = sorted(hosts_by_name[name])
        where = ", ".join(hosts[:HOSTS_SHOWN]) + (" and %d more" % (len(hosts) - HOSTS_SHOWN) if len(hosts) > HOSTS_SHOWN else "")
        hint = "did you mean %s?" % suggestion[name] if suggestion[name] else "no gpuharden.k8s variable is close"
        lines.append("%s (%s) on %s" % (name, hint, where))
    return (
        "%s: %s. The collection reads none of them, so its defaults would apply. Fix the name, or list your own "
        "variables in %s (names or patterns), or set %s=true to only warn."
        % (lead, "; ".join(lines), EXTRA_VARIABLE, ALLOW_VARIABLE)
    )


def _as_list(value, where):
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return list(value)
    raise AnsibleActionFail("%s on %s must be a list of variable names or patterns, got %r" % (EXTRA_VARIABLE, where, value))


def _as_bool(value, where):
    if isinstance(value, bool) or value is None:
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0", ""):
        return False
    raise AnsibleActionFail("%s on %s must be a boolean, got %r" % (ALLOW_VARIABLE, where, value))


class ActionModule(ActionBase):
    """Thin shell: gather the variable names and opt-outs of this host and of every other host of the play, then the
    pure functions above decide."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        self.validate_argument_spec(argument_spec={})
        me = task_vars.get("inventory_hostname")
        # This host with everything it sees (inventory, extra vars, the play's own vars, which are every host's), then
        # every other host of the play, in every serial batch (its inventory and extra vars), so that a typo in a
        # later batch's host_vars stops the run before the first batch is changed.  One run for the play (run_once):
        # reading the collection's files and a worker process per host cost about 60 ms of controller CPU each.
        checks = [(me, set(task_vars), lambda name: self._templar.template(task_vars.get(name)))]
        hostvars = task_vars.get("hostvars") or {}
        for host in task_vars.get("ansible_play_hosts_all") or []:
            if host != me and host in hostvars:
                variables = hostvars[host]
                checks.append((host, set(variables), lambda name, variables=variables: variables.get(name)))

        prefixes, known = known_variables(collection_root(), load_yaml)
        failing, allowed = {}, {}
        for host, names, setting in checks:
            extra = _as_list(setting(EXTRA_VARIABLE) if EXTRA_VARIABLE in names else None, host)
            unknown = unknown_variables(names, prefixes, known, extra)
            if unknown:
                allow = _as_bool(setting(ALLOW_VARIABLE) if ALLOW_VARIABLE in names else None, host)
                (allowed if allow else failing)[host] = unknown

        result.update(
            changed=False,
            checked_hosts=sorted(host for host, _names, _setting in checks),
            unknown={host: [{"name": name, "suggestion": match} for name, match in unknown]
                     for host, unknown in sorted({**failing, **allowed}.items())},
        )
        if allowed:
            result["warnings"] = [failure_message(allowed, lead="unknown variables (allowed by %s)" % ALLOW_VARIABLE)]
        if failing:
            result.update(failed=True, msg=failure_message(failing))
        else:
            result["msg"] = "the gpuharden variables of %s are known" % ", ".join(result["checked_hosts"])
        return result
