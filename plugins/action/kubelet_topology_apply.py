# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.kubelet_topology_apply: the kubelet stage's write on one node, in one task.

It writes what the plan decided (``stage``: kubelet_topology_plan's result, registered by roles/kubelet_topology as
``__kubelet_topology_stage``).  One gpuharden.k8s.kubelet_config run on the node with the plan's ``write_options``:
stopped first and the checkpoints removed where the change is disruptive, restarted, healthz polled, the files put
back when the kubelet does not come back (the host then fails with the kubelet's reason).  After a restart, and where
``kubelet_topology_kubeconfig`` is set, it waits for Node Ready with kubectl on the node (the kubelet's kubeconfig is a
node's file, and the node may not have the Kubernetes client the collection's controller-side modules use).  The
module's result is this task's (check mode and diff as the module's), with ``uncordon``: who makes the node
schedulable again (module_utils/cluster/_kubelet_stage.py maintenance()), and ``uncordon_tasks``, the tasks file the
role's YAML includes for it (maintenance_tasks(): the user's, the role's node_maintenance_uncordon.yml, or ""),
and ``ready``, the wait's result where it ran.  The role's variables are read as the role's tasks see them.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _kubelet_stage
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

KUBELET_CONFIG = "gpuharden.k8s.kubelet_config"
COMMAND = "ansible.builtin.command"
STAGE = "__kubelet_topology_stage"
SETTINGS = ("kubelet_topology_healthz_url", "kubelet_topology_health_timeout", "kubelet_topology_log_file", "kubelet_topology_log_lines",
            "kubelet_topology_kubeconfig", "kubelet_topology_node_name", "kubelet_topology_uncordon_tasks", "kubelet_topology_drain")
ARGUMENT_SPEC = {"stage": {"type": "dict"}}


def decide(stage, settings, check_mode, run_module):
    """The task's result: the write, the wait for Node Ready after a restart, and who uncordons."""
    written = run_module(KUBELET_CONFIG, _kubelet_stage.write_args(stage, settings))
    written.pop("invocation", None)
    if written.get("failed"):
        return written
    written["uncordon"] = _kubelet_stage.maintenance(stage["disruptive"], check_mode, settings["kubelet_topology_uncordon_tasks"],
                                                     boolean(settings["kubelet_topology_drain"], strict=False))
    written["uncordon_tasks"] = _kubelet_stage.maintenance_tasks(written["uncordon"], settings["kubelet_topology_uncordon_tasks"], "uncordon")
    argv = _kubelet_stage.ready_wait(written, settings)
    if argv is not None:
        waited = run_module(COMMAND, {"argv": argv})
        written["ready"] = {key: waited.get(key) for key in ("cmd", "rc", "stdout", "stderr")}
        if waited.get("failed") or waited.get("rc"):
            written.update(failed=True, msg="kubelet_topology: node %s not Ready after the kubelet restart: %s" % (
                settings["kubelet_topology_node_name"], (waited.get("stderr") or waited.get("msg") or "").strip()))
    return written


class ActionModule(StageAction):
    NAME = "kubelet_topology_apply"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def decide_task(self, args, task_vars):
        stage = args["stage"] if args["stage"] is not None else self._templar.resolve_variable_expression(STAGE)
        settings = {name: self._templar.resolve_variable_expression(name) for name in SETTINGS}
        return decide(stage, settings, bool(task_vars.get("ansible_check_mode")),
                      lambda name, module_args: self.run_module(name, module_args, task_vars))
