# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.container_runtime_stage: role container_runtime's write on one node, in one task
(roles/container_runtime/tasks/main.yml).

Where neither containerd's configuration directory nor its unit is on the node, the host fails before anything is
written; else one gpuharden.k8s.containerd_nvidia_runtime run with the role's options (it writes, restarts containerd
and waits until it serves again, and puts the files back where it does not).  The module's result is this task's
(check mode and diff as the module's), with the facts container_runtime_handler and container_runtime_restart_required;
the host fails, naming the files and containerd's reason, where containerd did not come back after the restart.

The decisions are module_utils/cluster/_container_runtime_stage.py's; the role's variables are read as its tasks see them.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _container_runtime_stage as stage
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

ARGUMENT_SPEC = {}


class ActionModule(StageAction):
    NAME = "container_runtime_stage"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def decide_task(self, args, task_vars):
        settings = {name: self.variable(name) for name in stage.SETTINGS if name != "container_runtime_audit_options"}
        # the options map the audit checks (roles/container_runtime/vars/main.yml): the settings-once test finds this read
        settings["container_runtime_audit_options"] = self.variable("container_runtime_audit_options")
        return stage.decide(settings, task_vars.get("inventory_hostname"), boolean(settings["container_runtime_restart"], strict=False),
                            lambda name, module_args: self.run_module(name, module_args, task_vars))
