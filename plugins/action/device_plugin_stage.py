# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.device_plugin_stage: one step of role device_plugin (roles/device_plugin/tasks/main.yml).

A thin shell over the pure planner plugins/module_utils/cluster/_device_plugin_stage.py: it reads the role's
``device_plugin_*`` variables as the role's tasks see them and runs the modules the planner's answers call for.

- ``node`` (per host): whether the host is a GPU node, from device_plugin_gpu_node or the run's GPU facts, else from a
  stat of the driver's GPU list on the node (ansible.builtin.stat, read-only, also in check mode); the step hands its
  answer over to the step apply itself (plugins/plugin_utils/_handover.py, as NODE_RESULT): no registered variable.
- ``apply`` (run_once, delegated to localhost): gpuharden.k8s.device_plugin with the role's options map, on the
  controller's Python (device_plugin_controller_python), labelling the GPU nodes of the play and unlabelling its
  CPU-only ones in the same run; its result is the task's (the role registers it as device_plugin_result).
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin_stage as plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _role_options
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

DEVICE_PLUGIN = "gpuharden.k8s.device_plugin"
STAT = "ansible.legacy.stat"
ARGUMENT_SPEC = {"step": {"type": "str", "required": True, "choices": ["node", "apply"]}}
# The map of the label and taint the role sets on GPU nodes (the settings table, through core/_role_options.py).
LABEL_OPTIONS = "__device_plugin_label_options"


class ActionModule(StageAction):
    NAME = "device_plugin_stage"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def decide_task(self, args, task_vars):
        task_vars = task_vars or {}
        if args["step"] == "node":
            return self._node(task_vars)
        return self._apply(task_vars)

    def _node(self, task_vars):
        node_name = self.variable("device_plugin_node_name")
        is_gpu, source = plan.gpu_node_known(self.variable("device_plugin_gpu_node"), task_vars.get("ansible_facts"))
        if source is None:
            found = self.run_module(STAT, {"path": plan.DRIVER_GPUS, "get_checksum": False}, task_vars)
            if found.get("failed"):
                return dict(found, msg="stat %s: %s" % (plan.DRIVER_GPUS, found.get("msg", "failed")))
            is_gpu, source = bool((found.get("stat") or {}).get("exists")), plan.DRIVER_GPUS
        part = plan.node_part(node_name, is_gpu, source)
        return dict(part, changed=False, msg="%s is %s (%s)" % (node_name, "a GPU node" if part["gpu_node"] else "CPU-only", source),
                    ansible_facts=_handover.handed_over(plan.NODE_RESULT, part))

    def _apply(self, task_vars):
        hostvars = task_vars.get("hostvars") or {}
        play_hosts = list(task_vars.get("ansible_play_hosts") or [])
        # what the step node of this run handed over on each host (None where it did not run, or in an earlier run only)
        registered = {host: _handover.taken_over(hostvars[host], plan.NODE_RESULT) for host in play_hosts if host in hostvars}
        parts, missing = plan.parts_of(play_hosts, registered)
        label_options = _role_options.options(LABEL_OPTIONS, {name: self.variable(name) for name in _role_options.inputs(LABEL_OPTIONS)})
        labels = plan.node_labels(label_options, parts, self.variable("device_plugin_label_nodes"), self.variable("device_plugin_unlabel_cpu_nodes"))
        if missing and labels is not None:
            # never a guess either way: a host taken for CPU-only would lose its label
            self._display.warning("device_plugin: %s neither labelled nor unlabelled: the role's GPU-node step did not run there"
                                  % ", ".join(missing))
        module_args = plan.module_args(self.variable("device_plugin_audit_options"), self.variable("device_plugin_kubeconfig"),
                                       self.variable("device_plugin_kube_context"), labels)
        done = self.run_module(DEVICE_PLUGIN, module_args, on_controller(self._task, task_vars, self.variable("device_plugin_controller_python")))
        return {key: value for key, value in done.items() if key != "invocation"}
