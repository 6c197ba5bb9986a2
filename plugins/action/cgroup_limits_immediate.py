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

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _cgroup_limits_stage
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

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


class ActionModule(ActionBase):
    _requires_connection = True
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        validation = ArgumentSpecValidator(ARGUMENT_SPEC).validate(self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("cgroup_limits_immediate: %s" % "; ".join(validation.error_messages))
        try:
            return decide(validation.validated_parameters, task_vars["inventory_hostname"],
                          lambda module_args: self._execute_module(module_name=CGROUP_MEMORY, module_args=module_args, task_vars=task_vars))
        except GpuhardenError as error:
            raise AnsibleActionFail("%s (fix: %s)" % (error.msg, error.result["fix"]) if "fix" in error.result else error.msg) from None
