# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.cgroup_limits_immediate: the cgroup_limits stage's immediate fix on one node, in one task.

It runs gpuharden.k8s.cgroup_memory on the node with ``options`` and the UIDs of the node's GPU pods (from ``gpu_pods``,
the plan's listing, else ``gpu_pods_listed``, gpu_pods_info's result for the batch); the module's result is this task's
result (check mode and diff as the module's), with ``report`` added, which also goes to the run's statistics
(gpuharden_cgroup_limits, keyed by inventory host). The decisions are module_utils/cluster/_cgroup_limits_stage.py's.
An argument left out is the role's variable (ROLE_VARIABLES), as the role's tasks see it: roles/cgroup_limits/tasks/
immediate.yml calls the action without arguments but its ``step``:

- ``record`` (each host): this host's Kubernetes node name as its fact ``gpuharden_cgroup_limits_node``, which the
  listing reads in hostvars (a role's defaults are not there);
- ``list`` (run_once, delegated to the controller): gpuharden.k8s.gpu_pods_info for the nodes the batch's hosts
  recorded, in one API call, with cgroup_limits_kubeconfig, cgroup_limits_kube_context, cgroup_limits_resource_prefixes
  and cgroup_limits_controller_python; skipped where the plan's listing (cgroup_limits_gpu_pods) is given.  Its result
  is handed over (plugins/plugin_utils/_handover.py, as LISTED) to every host of the batch (run_once's facts reach
  them all), where ``fix`` takes it as ``gpu_pods_listed`` left out;
- ``fix`` (the default): the immediate fix above;
- ``preflight`` (tasks/preflight.yml, in check mode): cgroup_memory with the options alone, which refuses a node
  without cgroup v2 and its memory controller.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _cgroup_limits_stage
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

CGROUP_MEMORY = "gpuharden.k8s.cgroup_memory"
GPU_PODS_INFO = "gpuharden.k8s.gpu_pods_info"
NODE_FACT = "gpuharden_cgroup_limits_node"  # step record's fact: this host's Kubernetes node name
# step list's hand-over to step fix: gpu_pods_info's result for the batch
LISTED = "__cgroup_limits_pods_listed"
ARGUMENT_SPEC = {
    "step": {"type": "str", "default": "fix", "choices": ["fix", "record", "list", "preflight"]},
    "options": {"type": "dict"},
    "node_name": {"type": "str"},
    "gpu_pods": {"type": "dict"},
    "gpu_pods_listed": {"type": "dict"},
}
# The role's variable each argument left out is read from (expression, default).
ROLE_VARIABLES = {"options": ("__cgroup_limits_memory_options", None), "node_name": ("cgroup_limits_node_name", None),
                  "gpu_pods": ("cgroup_limits_gpu_pods", None)}


def decide(args, host, run_cgroup_memory):
    """The task's result: cgroup_memory's run on the node's GPU pods, with the report and the statistics."""
    pods = _cgroup_limits_stage.gpu_pods(args["gpu_pods"], args["gpu_pods_listed"])
    result = run_cgroup_memory(dict(args["options"], pod_uids=_cgroup_limits_stage.pod_uids(pods, args["node_name"])))
    if result.get("failed"):
        return result
    report = _cgroup_limits_stage.report(pods, args["node_name"], result)
    return dict(result, report=report, ansible_stats={"data": {"gpuharden_cgroup_limits": {host: report}}, "per_host": False, "aggregate": True})


def batch_nodes(batch, hostvars):
    """The Kubernetes node names the batch's hosts recorded (step record), in the batch's order."""
    recorded = [(hostvars[host].get("ansible_facts") or {}).get(NODE_FACT) if host in hostvars else None for host in batch]
    return [node for node in recorded if node]


def listing_args(nodes, settings):
    """gpu_pods_info's options for the batch: the kubeconfig and context only where set."""
    args = {"nodes": nodes, "resource_prefixes": settings["resource_prefixes"]}
    for option, name in (("kubeconfig", "kubeconfig"), ("context", "kube_context")):
        if settings[name]:
            args[option] = settings[name]
    return args


class ActionModule(StageAction):
    NAME = "cgroup_limits_immediate"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def decide_task(self, args, task_vars):
        # the options only where the step runs cgroup_memory: the record and the listing need none (built from the
        # role's variables, they would refuse a task outside the role for nothing)
        wanted = {name: ROLE_VARIABLES[name] for name in ROLE_VARIABLES if name != "options" or args["step"] in ("fix", "preflight")}
        args = self.with_role_variables(args, wanted)
        if args["gpu_pods_listed"] is None:
            args["gpu_pods_listed"] = _handover.taken_over(task_vars, LISTED)
        step = args["step"]
        if step == "list":
            return self._list(args, task_vars)
        needed = {"fix": ("options", "node_name"), "record": ("node_name",), "preflight": ("options",)}[step]
        for name in needed:
            if not args[name]:
                raise GpuhardenError("cgroup_limits_immediate: %s is required (the role's %s)" % (name, ROLE_VARIABLES[name][0]))
        if step == "record":
            return {"changed": False, "ansible_facts": {NODE_FACT: args["node_name"]}}
        if step == "preflight":
            return self.run_module(CGROUP_MEMORY, args["options"], task_vars)
        return decide(args, task_vars["inventory_hostname"], lambda module_args: self.run_module(CGROUP_MEMORY, module_args, task_vars))

    def _list(self, args, task_vars):
        if args["gpu_pods"] is not None:
            return {"skipped": True, "changed": False, "skip_reason": "the plan's listing of the GPU pods is used (cgroup_limits_gpu_pods)"}
        settings = {name: self.role_variable("cgroup_limits_" + name) for name in ("kubeconfig", "kube_context", "resource_prefixes")}
        module_args = listing_args(batch_nodes(task_vars.get("ansible_play_batch") or [], task_vars.get("hostvars") or {}), settings)
        listed = self.run_module(GPU_PODS_INFO, module_args, on_controller(self._task, task_vars, self.role_variable("cgroup_limits_controller_python")))
        listed.pop("invocation", None)
        return dict(listed, ansible_facts=_handover.handed_over(LISTED, {key: value for key, value in listed.items() if key != "ansible_facts"}))
