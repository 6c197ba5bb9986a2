# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.stage_steps: which steps of playbooks/tasks/stages.yml run on this host, decided in Python.

``step: stages`` (first in tasks/stages.yml) reads the importing task's one mapping ``__stages`` (the stage engine's
result and the playbook's mode), the plan's LIST of GPU pods (node_plan_pods' hand-over, where the playbook made one)
and the host's Node name, and returns one plain value per include of the file (where ``__stages`` gives no plan, the
plan a task before handed over as PLAN: bootstrap_node's step plan; where it gives no container_runtime_steps or
runtime_class, harden_rollout step=restarts' hand-over RESTARTS: harden's); tasks/stages.yml registers it as
``__stages_run``.  ``step: drains`` (once the kubelet and MIG plans ran) reads that result and what the plans published
(their hand-overs of this run, _harden_run.DRAINING_PLANS: none where the plan did not run) and returns the steps
that depend on whether the node drains.  The decisions are module_utils/core/_stage_steps.py's.  No module runs: the
host is not contacted.
"""

from __future__ import annotations

from ansible.errors import AnsibleUndefinedVariable
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.action import node_plan_pods
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run, _stage_steps
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

ARGUMENT_SPEC = {"step": {"type": "str", "default": "stages", "choices": ["stages", "drains"]}}
# the importing task's mapping, the plan's LIST, the first step's registered result, what the draining plans hand over
STAGES = "__stages"
GPU_PODS = node_plan_pods.LISTED
STEPS = "__stages_run"
DISRUPTIVE = {"kubelet_disruptive": _harden_run.DRAINING_PLANS["kubelet_topology"], "mig_disruptive": _harden_run.DRAINING_PLANS["mig"]}
# the stage engine's plan of this node, as a task before this file hands it over (plugin_utils/_handover.py: this run's
# only), where the importing task's __stages gives none: {"plan": {"runs": ...}, "kubelet_plan": ...} (bootstrap_node
# step plan)
PLAN = "__stages_plan"
# harden_rollout step=restarts' hand-over (its restart_steps and runtime_class), where __stages gives neither key:
# {__stages key: the hand-over's key}
RESTARTS = _harden_run.RESTARTS
FROM_RESTARTS = {"container_runtime_steps": "restart_steps", "runtime_class": "runtime_class"}


class ActionModule(StageAction):
    NAME = "stage_steps"
    ARGUMENT_SPEC = ARGUMENT_SPEC
    _requires_connection = False

    def _stages(self, raw):
        """__stages, each key templated alone: one whose variable is undefined is left out (its default), as where a task
        that registers it was left out by --tags (harden's RuntimeClass gate, tagged like the stage it gates, which
        --tags then leaves out too); a required one left out is named by the planner."""
        if not isinstance(raw, dict):
            return self.variable(STAGES)
        stages = {}
        for key, value in raw.items():
            try:
                stages[key] = self._templar.template(value)
            except AnsibleUndefinedVariable:
                continue
        return stages

    def decide_task(self, args, task_vars):
        if args["step"] == "stages":
            host = task_vars["inventory_hostname"]
            if STAGES not in task_vars:
                raise GpuhardenError("stage_steps: __stages is not defined: the task importing playbooks/tasks/stages.yml sets it")
            stages = self._stages(task_vars[STAGES])
            if isinstance(stages, dict) and stages.get("plan") is None:
                handed = _handover.taken_over(task_vars, PLAN)
                if handed is not None:
                    stages = dict(stages, plan=handed)
            if isinstance(stages, dict) and any(stages.get(key) is None for key in FROM_RESTARTS):
                restarts = _handover.taken_over(task_vars, RESTARTS)
                if hasattr(restarts, "get"):
                    stages = dict(stages, **{key: restarts.get(handed_key) for key, handed_key in FROM_RESTARTS.items()
                                             if stages.get(key) is None})
            steps = _stage_steps.stage_steps(stages, node_name=self.role_variable("gpuharden_k8s_node_name", host),
                                             gpu_pods=_handover.taken_over(task_vars, GPU_PODS))
        else:
            if STEPS not in task_vars:
                raise GpuhardenError("stage_steps: step drains runs after step stages (registered as %s)" % STEPS)
            steps = _stage_steps.drain_steps(self.variable(STEPS), **{
                key: boolean(_handover.taken_over(task_vars, name, False), strict=False) for key, name in DISRUPTIVE.items()})
        return dict(steps, changed=False)
