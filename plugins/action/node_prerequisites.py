# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.node_prerequisites: role node_prerequisites' work in one task (issue 45: its decisions left the
role's Jinja for module_utils/cluster/_node_prerequisites_plan.py).  Copies the wheels (ansible.builtin.copy's own
action, which transfers the directory) and runs gpuharden.k8s.node_venv, both with the host's own Python; its result is
node_venv's, which the role's set_fact hands over (a module's facts would reach the play only as injected facts, which
ansible-core 2.20 deprecates)."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _node_prerequisites_plan as plan

# vars/node_python.yml's name for the host's own Python (every gpuharden play that runs on the nodes loads it)
HOST_PYTHON = "__gpuharden_host_python"


class ActionModule(ActionBase):
    """Thin shell: read the role's variables, let the planner decide, run the copy and node_venv."""

    TRANSFERS_FILES = False  # the copy action it runs transfers the wheels itself
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = dict(task_vars or {})
        result = super().run(tmp, task_vars)
        if self._task.args:
            raise AnsibleActionFail("node_prerequisites takes no arguments: it reads the role's node_prerequisites_* variables")
        templar = self._templar.copy_with_new_env(available_variables=task_vars)
        values = {name: templar.template(task_vars[name]) for name in plan.READ if name in task_vars}
        missing = [name for name in plan.READ if name not in values]
        if missing:
            raise AnsibleActionFail("node_prerequisites: %s undefined (run it from the role node_prerequisites, whose defaults set them)"
                                    % ", ".join(missing))
        host_python = templar.template(task_vars[HOST_PYTHON]) if HOST_PYTHON in task_vars else None
        decided = plan.plan(values, host_python)
        if decided["interpreter"]:
            task_vars["ansible_python_interpreter"] = decided["interpreter"]
        copied = None
        if decided["copy"]:
            copied = self._copy(decided["copy"], task_vars)
            if copied.get("failed"):
                return dict(result, **copied)
        venv = self._execute_module(module_name="gpuharden.k8s.node_venv", module_args=decided["venv_args"], task_vars=task_vars)
        result.update(venv)
        result["wheels"] = copied
        result["changed"] = bool(venv.get("changed") or (copied or {}).get("changed"))
        return result

    def _copy(self, args, task_vars):
        task = self._task.copy()
        task.args = dict(args)
        loader = self._shared_loader_obj.action_loader
        copy = loader.get("ansible.legacy.copy", task=task, connection=self._connection, play_context=self._play_context,
                          loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        return copy.run(task_vars=task_vars)
