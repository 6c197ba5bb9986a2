# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.unharden_files: the module of that name on the node, each option the task does not give
taken from the uninstall's play variable or role option that sets it (PLAY_OPTIONS), so that
playbooks/unharden_gpu_nodes.yml and tasks/unharden_kubelet_drained.yml pass none of them in Jinja.  The module's result
is the task's (its task_action stays gpuharden.k8s.unharden_files: what the lab tests read).

What the later steps read of it (which writers wait for the drained pass, what was left in conflict) it hands over
(plugins/plugin_utils/_handover.py): the first pass (defer_disruptive: it may leave files for a drain) to
unharden_rollout and unharden_report, the drained pass to unharden_report (module_utils/cluster/_unharden_run.py)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.action.unharden_node import play_setting
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _unharden_run
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

# module option: the variable it follows where the task does not give it (its default: the settings table's)
PLAY_OPTIONS = {
    "kubelet": "gpuharden_unharden_kubelet",
    "force": "gpuharden_unharden_force",
    "keep_backups": "gpuharden_unharden_keep_backups",
    "containerd_service": "container_runtime_service",
    "kubelet_service": "kubelet_topology_service",
    "kubelet_health_url": "kubelet_topology_healthz_url",
    "kubelet_health_timeout": "kubelet_topology_health_timeout",
}
BOOLEAN_OPTIONS = ("kubelet", "force", "keep_backups")


def handover_name(module_args):
    """The hand-over of this pass: the first (it defers what needs a drain) or the drained one."""
    return _unharden_run.HANDOVERS["first_pass" if module_args.get("defer_disruptive") else "drained_pass"]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        module_args = dict(self._task.args)
        for option, variable in PLAY_OPTIONS.items():
            if module_args.get(option) is None:
                module_args[option] = play_setting(self._templar, task_vars, variable, bool if option in BOOLEAN_OPTIONS else str)
        result.update(self._execute_module(module_name="gpuharden.k8s.unharden_files", module_args=module_args, task_vars=task_vars))
        if not result.get("failed"):
            passed = {"deferred": result.get("deferred") or [], "conflicts": result.get("conflicts") or []}
            result["ansible_facts"] = _handover.handed_over(handover_name(module_args), passed)
        return result
