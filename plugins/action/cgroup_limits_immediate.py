# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.cgroup_limits_immediate: the cgroup_limits stage's immediate fix on one node, in one task.

It runs gpuharden.k8s.cgroup_memory on the node with ``options`` and the UIDs of the node's GPU pods (from ``gpu_pods``,
the plan's listing, else ``gpu_pods_listed``, gpu_pods_info's result for the batch); the module's result is this task's
result (check mode and diff as the module's), with ``report`` added, which also goes to the run's statistics
(gpuharden_cgroup_limits, keyed by inventory host). The decisions are module_utils/cluster/_cgroup_limits_stage.py's.
An argument left out is the role's variable (ROLE_VARIABLES), as the role's tasks see it: roles/cgroup_limits/tasks/
immediate.yml calls the action without arguments.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _cgroup_limits_stage
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

CGROUP_MEMORY = "gpuharden.k8s.cgroup_memory"
ARGUMENT_SPEC = {
    "options": {"type": "dict"},
    "node_name": {"type": "str"},
    "gpu_pods": {"type": "dict"},
    "gpu_pods_listed": {"type": "dict"},
}
# The role's variable each argument left out is read from (expression, default).
ROLE_VARIABLES = {"options": ("__cgroup_limits_memory_options", None), "node_name": ("cgroup_limits_node_name", None),
                  "gpu_pods": ("cgroup_limits_gpu_pods", None), "gpu_pods_listed": ("__cgroup_limits_pods_listed", None)}


def decide(args, host, run_cgroup_memory):
    """The task's result: cgroup_memory's run on the node's GPU pods, with the report and the statistics."""
    pods = _cgroup_limits_stage.gpu_pods(args["gpu_pods"], args["gpu_pods_listed"])
    result = run_cgroup_memory(dict(args["options"], pod_uids=_cgroup_limits_stage.pod_uids(pods, args["node_name"])))
    if result.get("failed"):
        return result
    report = _cgroup_limits_stage.report(pods, args["node_name"], result)
    return dict(result, report=report, ansible_stats={"data": {"gpuharden_cgroup_limits": {host: report}}, "per_host": False, "aggregate": True})


class ActionModule(StageAction):
    NAME = "cgroup_limits_immediate"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def decide_task(self, args, task_vars):
        args = self.with_role_variables(args, ROLE_VARIABLES)
        for name in ("options", "node_name"):
            if not args[name]:
                raise GpuhardenError("cgroup_limits_immediate: %s is required (the role's %s)" % (name, ROLE_VARIABLES[name][0]))
        return decide(args, task_vars["inventory_hostname"], lambda module_args: self.run_module(CGROUP_MEMORY, module_args, task_vars))
