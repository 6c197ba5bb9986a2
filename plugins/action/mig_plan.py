# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.mig_plan: the MIG stage's plan (roles/mig/tasks/plan.yml), in one task.

Read-only (the role runs it in check mode).  Where the plan's node_audit refused the mig check (the GPU Operator's MIG
manager owns the layout: ``refused``, [{what, why, fix}]), nothing is planned and the refusal is the stage's result,
said as a warning; else gpuharden.k8s.mig_layout runs on the node in check mode and its result is this task's.  Either
way the result says ``disruptive``: the layout changes or a mode change waits for a reset, and ``drain``: disruptive
and mig_drain (apply.yml cordons and drains the node, and uncordons it after).
``options`` and ``refused`` default to the role's ``__mig_module_options`` and ``__mig_operator_refused``.
A plan that did not fail hands ``disruptive`` over (DISRUPTIVE, plugins/plugin_utils/_handover.py) to harden's rollout
and stage steps: handed over in this run = the MIG plan ran.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

MIG_LAYOUT = "gpuharden.k8s.mig_layout"
ARGUMENT_SPEC = {
    "options": {"type": "dict"},
    "refused": {"type": "list", "elements": "dict"},
}
# whether the layout change drains the node, handed over to harden_node step=draining, harden_rollout, stage_steps
DISRUPTIVE = _harden_run.DRAINING_PLANS["mig"]


def decide(refused, run_mig_layout, drain=True):
    """The plan: the refusal (nothing planned), or mig_layout's check-mode result, with ``disruptive`` and ``drain``."""
    if refused:
        return {"changed": False, "reset_required": False, "disruptive": False, "drain": False, "refused": refused,
                "warnings": ["mig: layout left alone: %s: %s; fix: %s" % (entry.get("what"), entry.get("why"), entry.get("fix")) for entry in refused]}
    result = run_mig_layout()
    if result.get("failed"):
        return result
    disruptive = bool(result.get("changed") or result.get("reset_required"))
    return dict(result, disruptive=disruptive, drain=disruptive and drain)


class ActionModule(StageAction):
    NAME = "mig_plan"
    ARGUMENT_SPEC = ARGUMENT_SPEC
    READ_ONLY = True

    def decide_task(self, args, task_vars):
        refused = self.variable("__mig_operator_refused") if args["refused"] is None else args["refused"]
        options = self.variable("__mig_module_options") if args["options"] is None else args["options"]
        planned = decide(refused, lambda: self.run_module(MIG_LAYOUT, options, task_vars), boolean(self.variable("mig_drain"), strict=False))
        return planned if planned.get("failed") else with_handover(planned)


def with_handover(planned):
    """The plan's result, handing over whether it is disruptive (a failed plan's facts are not kept: nothing handed over)."""
    facts = dict(planned.get("ansible_facts") or {}, **_handover.handed_over(DISRUPTIVE, bool(planned.get("disruptive"))))
    return dict(planned, ansible_facts=facts)
