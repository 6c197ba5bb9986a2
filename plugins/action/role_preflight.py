# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.role_preflight: check a role's variables before the role reads or changes anything.

A thin shell over the pure rules of plugins/module_utils/cluster/_role_preflight.py: it reads the variables the role's
rules name, templated as a task of the role templates them (the host's value, else the role default), and fails with one
line per broken rule (each names the variable, its value and the rule), or passes.  It runs on the controller and opens
no connection to the node.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail, AnsibleUndefinedVariable
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _role_preflight as rules
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._role_options import UNDEFINED
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import role_setting

ARGUMENT_SPEC = {"role": {"type": "str", "required": True, "choices": sorted(rules.ROLES)}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def _setting(self, name, undefined):
        """One variable, templated as a task of the role templates it; undefined maps the ones a role may lack."""
        value = role_setting(self._templar, name)
        if value is not UNDEFINED:
            return value
        if name in undefined:
            return undefined[name]
        raise AnsibleUndefinedVariable("%r is undefined" % name)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        _valid, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        role = args["role"]
        names, undefined, _rules = rules.ROLES[role]
        settings = {name: self._setting(name, undefined) for name in names}
        if role == "runtime_class":
            # The RuntimeClass serves the whole play: each host's containerd runtime name (set by roles/container_runtime).
            hostvars = task_vars.get("hostvars") or {}
            settings["runtime_class_play_handlers"] = [hostvars[host]["container_runtime_handler"] for host in task_vars.get("ansible_play_hosts") or []
                                                       if host in hostvars and "container_runtime_handler" in hostvars[host]]
        problems = rules.problems(role, settings)
        if problems:
            raise AnsibleActionFail("%s: %s" % (role, " ".join(" ".join(problems).split())), result={"problems": problems})
        result.update(changed=False, problems=[], msg="%s: the role's variables are consistent" % role)
        return result
