# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.mig_plan: the MIG stage's plan (roles/mig/tasks/plan.yml), in one task.

Read-only (the role runs it in check mode).  Where the plan's node_audit refused the mig check (the GPU Operator's MIG
manager owns the layout: ``refused``, [{what, why, fix}]), nothing is planned and the refusal is the stage's result,
said as a warning; else gpuharden.k8s.mig_layout runs on the node in check mode and its result is this task's.  Either
way the result says ``disruptive``: the layout changes or a mode change waits for a reset (the node is drained).
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

MIG_LAYOUT = "gpuharden.k8s.mig_layout"
ARGUMENT_SPEC = {
    "options": {"type": "dict", "required": True},
    "refused": {"type": "list", "elements": "dict", "default": []},
}


def decide(refused, run_mig_layout):
    """The plan: the refusal (nothing planned), or mig_layout's check-mode result, with ``disruptive``."""
    if refused:
        return {"changed": False, "reset_required": False, "disruptive": False, "refused": refused,
                "warnings": ["mig: layout left alone: %s: %s; fix: %s" % (entry.get("what"), entry.get("why"), entry.get("fix")) for entry in refused]}
    result = run_mig_layout()
    if result.get("failed"):
        return result
    return dict(result, disruptive=bool(result.get("changed") or result.get("reset_required")))


class ActionModule(ActionBase):
    _requires_connection = True
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        validation = ArgumentSpecValidator(ARGUMENT_SPEC).validate(self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("mig_plan: %s" % "; ".join(validation.error_messages))
        if not self._task.check_mode:
            raise AnsibleActionFail("mig_plan reads only: run it with check_mode: true (it runs mig_layout in check mode)")
        args = validation.validated_parameters
        return decide(args["refused"], lambda: self._execute_module(module_name=MIG_LAYOUT, module_args=dict(args["options"]), task_vars=task_vars))
