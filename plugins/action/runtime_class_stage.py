# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.runtime_class_stage: role runtime_class's write, once for the play on the controller
(roles/runtime_class/tasks/main.yml: delegate_to localhost, run_once).

One gpuharden.k8s.runtime_class run with the role's options map (runtime_class_audit_options, what the drift check's
dry run takes) and the write's own (kubeconfig, context, force, the nodes to check), on the role's controller Python
(runtime_class_controller_python), never the play's node Python.  The module's result is this task's.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

RUNTIME_CLASS = "gpuharden.k8s.runtime_class"
ARGUMENT_SPEC = {}


def module_args(options, kubeconfig, context, force, nodes):
    """runtime_class's options: the role's map, then the write's own (an empty kubeconfig or context: the client's default)."""
    args = dict(options, force=boolean(force, strict=False), nodes=list(nodes or ()))
    if kubeconfig:
        args["kubeconfig"] = kubeconfig
    if context:
        args["context"] = context
    return args


class ActionModule(StageAction):
    NAME = "runtime_class_stage"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def decide_task(self, args, task_vars):
        module_args_ = module_args(self.variable("runtime_class_audit_options"), self.variable("runtime_class_kubeconfig"),
                                   self.variable("runtime_class_kube_context"), self.variable("runtime_class_force"),
                                   self.variable("runtime_class_nodes"))
        python = self.variable("runtime_class_controller_python")
        return self.run_module(RUNTIME_CLASS, module_args_, on_controller(self._task, task_vars, python))
