# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.cgroup_limits_immediate: the cgroup_limits stage's immediate fix on one node, in one task.

It runs gpuharden.k8s.cgroup_memory on the node with ``options`` and the UIDs of the node's GPU pods (from ``gpu_pods``,
the plan's listing, else ``gpu_pods_listed``, gpu_pods_info's result for the batch); the module's result is this task's
result (check mode and diff as the module's), with ``report`` added, which also goes to the run's statistics
(gpuharden_cgroup_limits, keyed by inventory host). The decisions are module_utils/cluster/_cgroup_limits_stage.py's.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _cgroup_limits_stage
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

CGROUP_MEMORY = "gpuharden.k8s.cgroup_memory"
ARGUMENT_SPEC = {
    "options": {"type": "dict", "required": True},
    "node_name": {"type": "str", "required": True},
    "gpu_pods": {"type": "dict"},
    "gpu_pods_listed": {"type": "dict"},
}


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
        return decide(args, task_vars["inventory_hostname"], lambda module_args: self.run_module(CGROUP_MEMORY, module_args, task_vars))
