# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.kubelet_topology_plan: the kubelet stage's plan, and its admission gate, in one task each.

Read-only (the tasks of roles/kubelet_topology run it in check mode).  Without ``stage``: the plan.  It runs
gpuharden.k8s.kubelet_config on the node in check mode (the module's result is this task's result), or takes
``audited_plan`` (node_audit's kubelet check, which harden read before any stage wrote), and adds what the plan means
for the run (module_utils/cluster/_kubelet_stage.py stage()): ``disruptive``, ``changes``, ``service``, ``switch``
(the Topology Manager policy becomes one that refuses GPU pods it cannot align), and ``write_options``, the options the
role's write takes.  With ``stage`` (the plan task's result) and ``workloads_listed`` (gpu_workloads_info's result for
the batch): the admission gate (_kubelet_stage.admission()).  A node it keeps is planned again without the Topology,
CPU and Memory Manager fields, and the workloads that keep it go to the run's statistics (gpuharden_topology_blocked).
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _kubelet_stage
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

KUBELET_CONFIG = "gpuharden.k8s.kubelet_config"
ARGUMENT_SPEC = {
    "options": {"type": "dict"},
    "audited_plan": {"type": "raw"},
    "admission_check": {"type": "bool", "default": True},
    "stage": {"type": "dict"},
    "node_name": {"type": "str"},
    "gpus": {"type": "list", "elements": "dict", "default": []},
    "workloads_listed": {"type": "dict"},
    "ignore_unadmittable_workloads": {"type": "bool", "default": False},
}


def decide_plan(plan, options, admission_check):
    """The plan task's result: the kubelet plan with what it means for the run; the plan's ``changed`` (the write would
    change a file) becomes ``would_change``, as this task changes nothing."""
    decided = _kubelet_stage.stage(plan, admission_check)
    return dict(plan, **decided, gated=decided["switch"] is not None, write_options=options, would_change=bool(plan["changed"]),
                changed=False)


def decide_admission(stage, node_name, gpus, listed, ignore, replan):
    """The admission task's result: the gate's verdict, and the stage again (planned without the managers through
    ``replan(options)`` where the gate keeps them)."""
    if not stage.get("switch"):
        return dict(stage, admission=None)
    verdict = _kubelet_stage.admission(stage["switch"], node_name, gpus, listed, ignore)
    decided = dict(stage, admission=verdict)
    if not verdict["managers"]:
        options = _kubelet_stage.without_managers(stage["write_options"])
        decided = dict(decide_plan(replan(options), options, False), admission=verdict, switch=stage["switch"],
                       gated=stage["gated"], host=stage.get("host"))
    # only a change the gate blocks: a forced one (ignore_unadmittable_workloads) is no blocked change
    if not verdict["managers"]:
        decided["ansible_stats"] = {"data": {"gpuharden_topology_blocked": {node_name: verdict["blocked"]}}, "per_host": False, "aggregate": True}
    return decided


class ActionModule(StageAction):
    NAME = "kubelet_topology_plan"
    ARGUMENT_SPEC = ARGUMENT_SPEC
    READ_ONLY = True

    def decide_task(self, args, task_vars):
        options = args["options"]
        if args["stage"] is not None:
            if args["stage"].get("switch") and not args["node_name"]:
                raise GpuhardenError("kubelet_topology_plan: node_name is required with stage")
            return decide_admission(args["stage"], args["node_name"], args["gpus"], args["workloads_listed"],
                                    args["ignore_unadmittable_workloads"], lambda narrowed: self._kubelet_plan(narrowed, task_vars))
        if options is None:
            raise GpuhardenError("kubelet_topology_plan: options (kubelet_config's) is required without stage")
        audited = args["audited_plan"]
        plan = dict(audited, audited=True) if isinstance(audited, dict) else self._kubelet_plan(options, task_vars)
        # host: the batch's workload listing is made by the first host whose plan needs the admission check
        return dict(decide_plan(plan, options, args["admission_check"]), host=task_vars["inventory_hostname"])

    def _kubelet_plan(self, options, task_vars):
        result = self.run_module(KUBELET_CONFIG, options, task_vars)
        if result.get("failed"):
            raise GpuhardenError("kubelet_config: %s" % result.get("msg", result))
        result.pop("invocation", None)
        return result
