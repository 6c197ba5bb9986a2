# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.node_maintenance_step: one step of role node_maintenance's task files, with the
role's variables (node_maintenance_*) read here rather than spelled out in Jinja, delegated to the controller.

- ``cordon_drain`` (cordon_drain.yml): gpuharden.k8s.node_maintenance cordons the node and evicts its pods
  (node_maintenance_state cordoned: cordons only); its result, handed over (plugins/plugin_utils/_handover.py, as
  DRAIN, on the inventory host: the task is delegated without delegate_facts), tells ``uncordon`` whether the node was
  cordoned before by someone else (``preexisting_cordon``, node_maintenance's record).
- ``uncordon`` (uncordon.yml): makes the node schedulable again, waiting node_maintenance_ready_timeout for Ready; skipped,
  with the reason, where node_maintenance_keep_preexisting_cordon keeps a cordon someone else made before the drain.
- ``restart_device_plugin`` (restart_device_plugin.yml): evicts the node's device plugin pods (their DaemonSets start
  them again).
- ``budget_verdict`` (budget.yml, per host, after the batch's node_maintenance_budget, whose hand-over it takes): fails this host with the line
  the budget gives where its step may not start now, says (warning, check mode) that a real run would defer it, and
  says whether the step may start in this play and batch (``allowed_in``, [play, batch] or []: cordon_drain.yml checks
  the budget itself unless it is this play and batch).  It opens no connection.
- ``budget_record`` (budget.yml, per host, before the batch's node_maintenance_budget): records, as this host's fact
  ``gpuharden_budget_record`` ({node, wanted}), its Node and whether it wants a disruptive step now (node_maintenance_budget
  reads the batch's records in hostvars, where a role's defaults are not).  It opens no connection.

The module runs with the task's check mode, on the controller with node_maintenance_controller_python (the task is
delegated there; the role's YAML does not name the interpreter); the result is its own.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.action.node_maintenance_budget import BUDGET
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

MODULE = "gpuharden.k8s.node_maintenance"
ARGUMENT_SPEC = {"step": {"type": "str", "required": True, "choices": ["cordon_drain", "uncordon", "restart_device_plugin", "budget_verdict", "budget_record"]}}
# the hand-overs the steps read: the drain's (cordon_drain to uncordon) and the batch's budget (node_maintenance_budget's)
DRAIN = "__node_maintenance_drain"
RECORD = "gpuharden_budget_record"  # budget.yml's fact: this host's Node and whether it wants a disruptive step now
SETTINGS = ("node_name", "kubeconfig", "kube_context", "state", "force", "delete_emptydir_data", "grace_period", "timeout", "retry_interval",
            "owner", "purpose", "ready_timeout", "keep_preexisting_cordon")


def _connection(settings):
    """The API connection options: the kubeconfig and context where set (else the module's defaults)."""
    options = {"nodes": [settings["node_name"]]}
    if settings["kubeconfig"]:
        options["kubeconfig"] = settings["kubeconfig"]
    if settings["kube_context"]:
        options["context"] = settings["kube_context"]
    return options


def drain_args(settings):
    """node_maintenance's options for the cordon and drain (the grace period only where not negative)."""
    args = dict(_connection(settings), state="cordoned" if settings["state"] == "cordoned" else "drained",
                force=boolean(settings["force"], strict=False), delete_emptydir_data=boolean(settings["delete_emptydir_data"], strict=False),
                timeout=float(settings["timeout"]), retry_interval=float(settings["retry_interval"]), owner=settings["owner"],
                purpose=settings["purpose"])
    if int(settings["grace_period"]) >= 0:
        args["grace_period"] = int(settings["grace_period"])
    return args


def uncordon_args(settings, drained):
    """node_maintenance's options for the uncordon, or None where a cordon someone else made before the drain stays."""
    node = ((drained or {}).get("nodes") or {}).get(settings["node_name"]) or {}
    if boolean(settings["keep_preexisting_cordon"], strict=False) and boolean(node.get("preexisting_cordon", False), strict=False):
        return None
    return dict(_connection(settings), state="uncordoned", ready_timeout=int(settings["ready_timeout"]), owner=settings["owner"])


def restart_args(settings):
    return dict(_connection(settings), state="device_plugin_restarted", timeout=float(settings["timeout"]))


def budget_record(node, wanted):
    """This host's record for the batch's budget, as the fact node_maintenance_budget reads in hostvars."""
    return {"changed": False, "ansible_facts": {RECORD: {"node": node, "wanted": boolean(wanted, strict=False)}}}


def budget_verdict(node, budget, wanted, play_name, batch):
    """This host's part of the batch's budget: (the failure line or None, the check-mode line or None, allowed_in)."""
    budget = budget or {}
    allowed_in = [play_name, list(batch)] if boolean(wanted, strict=False) and node in (budget.get("allowed") or []) else []
    return (budget.get("not_started") or {}).get(node), (budget.get("would_defer") or {}).get(node), allowed_in


class ActionModule(StageAction):
    NAME = "node_maintenance_step"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def decide_task(self, args, task_vars):
        settings = {name: self.variable("node_maintenance_" + name) for name in SETTINGS}
        step = args["step"]
        if step == "budget_verdict":
            return self._verdict(settings["node_name"], task_vars)
        if step == "budget_record":
            return budget_record(settings["node_name"], self.variable("node_maintenance_budget_wanted"))
        if step == "uncordon":
            module_args = uncordon_args(settings, _handover.taken_over(task_vars, DRAIN))
            if module_args is None:
                return {"skipped": True, "changed": False,
                        "skip_reason": "%s was cordoned before the drain, by someone else: it stays cordoned (node_maintenance_keep_preexisting_cordon)"
                        % settings["node_name"]}
        else:
            module_args = drain_args(settings) if step == "cordon_drain" else restart_args(settings)
        done = self.run_module(MODULE, module_args, on_controller(self._task, task_vars, self.role_variable("node_maintenance_controller_python")))
        if step == "cordon_drain":
            drained = {key: value for key, value in done.items() if key not in ("ansible_facts", "invocation")}
            done = dict(done, ansible_facts=_handover.handed_over(DRAIN, drained))
        return done

    def _verdict(self, node, task_vars):
        wanted = self.variable("node_maintenance_budget_wanted")
        failure, would_defer, allowed_in = budget_verdict(node, _handover.taken_over(task_vars, BUDGET), wanted, task_vars.get("ansible_play_name"),
                                                          task_vars.get("ansible_play_batch") or [])
        if failure:
            raise AnsibleActionFail(failure)
        result = {"changed": False, "allowed_in": allowed_in}
        if would_defer:
            result["warnings"] = [would_defer]
        return result
