# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.cluster_stage_gate: whether harden runs a cluster-side stage, decided once for
the play from every host's plan (module_utils/core/_stage_plan.py runtime_class_needed, device_plugin_needed).

It reads the play's hosts' variables (hostvars: each node's plan, gpuharden_node_plan; the plan's one LIST, node_plan_pods'
hand-over, with its dry runs of the two stages; a failed rollout step, harden_node step=failed's hand-over)
and returns ``run`` with ``why``; it contacts no host.  harden_gpu_nodes.yml asks it for the device plugin stage; the
RuntimeClass stage's gate (runtime_class_gate) is decided in harden_rollout step=restarts, the task before the stages.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.action import node_plan_pods
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run, _stage_plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import playbook_default
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

ARGUMENT_SPEC = {"stage": {"type": "str", "required": True, "choices": ["runtime_class", "device_plugin"]}}
# the plan's one LIST of the batch (tasks/node_plan_inputs.yml), with its dry runs: node_plan_pods' hand-over to each host,
# this run's only; in a host's variables given to the gates below, under this name
GPU_PODS = node_plan_pods.LISTED


def _get(value, *path, default=None):
    for key in path:
        if not hasattr(value, "get"):
            return default
        value = value.get(key)
        if value is None:
            return default
    return value


def runtime_class_gate(batch_vars):
    """batch_vars: each host of the serial batch's variables ({name: value}, only those read here)."""
    dry_run = _get(batch_vars[0], GPU_PODS, "runtime_class_check") if batch_vars else None
    restarts = [bool(_get(variables, "gpuharden_node_plan", "plan", "runs", "container_runtime")) for variables in batch_vars]
    run = _stage_plan.runtime_class_needed(dry_run, restarts)
    why = ("the plan's dry run of it would change or report something, or did not run, or a node's containerd changes" if run
           else "the plan's dry run of it would change and report nothing, and no node's containerd changes")
    return run, why


def device_plugin_gate(play_vars, failed_hosts):
    """play_vars: each host of the play's variables; failed_hosts: the hosts whose rollout step failed."""
    if failed_hosts:
        return False, "the rollout stopped at a failed node (%s): a plugin update would wait on it" % ", ".join(sorted(failed_hosts))
    skip_default = playbook_default("gpuharden_skip_compliant_stages")
    run = _stage_plan.device_plugin_needed(
        skip_compliant=all(boolean(variables.get("gpuharden_skip_compliant_stages", skip_default), strict=False) for variables in play_vars),
        dry_runs=[_get(variables, GPU_PODS, "device_plugin_check") for variables in play_vars],
        node_runs=[_get(variables, "gpuharden_node_plan", "plan", "runs") for variables in play_vars],
        gpu_node_set=["gpuharden_gpu_node" in variables for variables in play_vars],
        driver_gpus=[_get(variables, "ansible_facts", "gpuharden", "driver_gpus") for variables in play_vars])
    why = ("a node-side stage ran, the plan's dry run of it would change or report something (or did not run), a host "
           "sets gpuharden_gpu_node, or a node's facts show no GPU" if run
           else "the plan's dry run of it would change and report nothing, and no node-side stage ran")
    return run, why


READ = ("gpuharden_node_plan", "ansible_facts", "gpuharden_skip_compliant_stages", "gpuharden_gpu_node")


def gate_variables(hosts_vars, names):
    """What the gates read of each host (its hostvars): ``names``, and GPU_PODS as node_plan_pods handed it over in this
    run (absent where it did not, or a fact cache kept an earlier run's)."""
    this_run = _handover.this_run() if hosts_vars else None
    gated = []
    for host_vars in hosts_vars:
        variables = {name: host_vars[name] for name in names if name in host_vars}
        listed = _handover.taken_over(host_vars, GPU_PODS, run=this_run)
        if listed is not None:
            variables[GPU_PODS] = listed
        gated.append(variables)
    return gated


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        hostvars = task_vars.get("hostvars") or {}

        if args["stage"] == "runtime_class":
            run, why = runtime_class_gate(gate_variables([hostvars[host] for host in task_vars.get("ansible_play_batch", [])], READ))
        else:
            this_run = _handover.this_run()
            failed = [host for host in task_vars.get("ansible_play_hosts_all", [])
                      if _handover.taken_over(hostvars[host], _harden_run.FAILED, run=this_run)]
            run, why = device_plugin_gate(gate_variables([hostvars[host] for host in task_vars.get("ansible_play_hosts", [])], READ), failed)
        result.update(changed=False, run=run, why=why)
        return result
