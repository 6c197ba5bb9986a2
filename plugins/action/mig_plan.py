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

from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

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


class ActionModule(StageAction):
    NAME = "mig_plan"
    ARGUMENT_SPEC = ARGUMENT_SPEC
    READ_ONLY = True

    def decide_task(self, args, task_vars):
        return decide(args["refused"], lambda: self.run_module(MIG_LAYOUT, args["options"], task_vars))
