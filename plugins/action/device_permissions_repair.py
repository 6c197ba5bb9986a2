# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.device_permissions_repair: role device_permissions' repair (roles/device_permissions/tasks/main.yml),
in one task.

It runs gpuharden.k8s.nvidia_device_nodes on the node with the role's options (``__device_permissions_module_options``)
and ``backup`` (device_permissions_backup); the module's result is this task's (check mode and diff as the module's),
and a host whose running driver still uses other NVreg_DeviceFile* values (the module's reboot_or_reload_required)
goes to the run's statistics, device_permissions_reload_required (a list of inventory hosts, aggregated over the run;
the role's YAML did this with set_stats).
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

NVIDIA_DEVICE_NODES = "gpuharden.k8s.nvidia_device_nodes"
RELOAD_STAT = "device_permissions_reload_required"
ARGUMENT_SPEC = {}


def decide(options, backup, host, run_module):
    """The task's result: nvidia_device_nodes' run with ``backup``, and this host in the run's statistics where the
    driver must be reloaded (an empty list otherwise, so that the statistic is there on every run)."""
    result = run_module(dict(options, backup=boolean(backup, strict=False)))
    if result.get("failed"):
        return result
    reload_required = [host] if result.get("reboot_or_reload_required") else []
    return dict(result, ansible_stats={"data": {RELOAD_STAT: reload_required}, "per_host": False, "aggregate": True})


class ActionModule(StageAction):
    NAME = "device_permissions_repair"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def decide_task(self, args, task_vars):
        options = self.variable("__device_permissions_module_options")
        return decide(options, self.variable("device_permissions_backup"), task_vars["inventory_hostname"],
                      lambda module_args: self.run_module(NVIDIA_DEVICE_NODES, module_args, task_vars))
