# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.node_maintenance_budget: the fleet's disruption budget at the start of a batch
of disruptive steps (roles/node_maintenance budget.yml), once for the batch (run_once, delegated to the controller).

It reads which hosts of the batch want a disruptive step now and their Node names (the fact gpuharden_budget_record,
{node, wanted}, that budget.yml's node_maintenance_step budget_record sets on each host that reaches it), adds to the nodes that stop
the rollout those of the hosts gone from the play (stop_on_failure), runs gpuharden.k8s.disruption_budget once
(outside check mode too: it only reads) where a host wants a step, and returns its result with, per node of the batch
that may not start, the line the role fails it with (not_started) or, in check mode, says (would_defer).  No host
wants a step: no API call, nothing deferred.  An option the task does not give is the role's variable
(node_maintenance_max_unavailable, node_maintenance_fleet, ...), where the task runs in the role; the module runs with
node_maintenance_controller_python (else the playbook's Python), which the role's YAML does not spell out.  The
result is handed over (plugins/plugin_utils/_handover.py, as BUDGET) to every host of the batch (run_once's facts
reach them all), where node_maintenance_step's budget_verdict takes it.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._role_options import UNDEFINED
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import read_outside_check_mode, readable, role_setting

ARGUMENT_SPEC = {
    "kubeconfig": {"type": "str", "default": ""},
    "context": {"type": "str", "default": ""},
    "max_unavailable": {"type": "str", "required": True},
    "fleet": {"type": "list", "elements": "str", "default": []},
    "out_of_service_taints": {"type": "list", "elements": "raw", "default": []},
    "stopped_by": {"type": "list", "elements": "str", "default": []},
    "stop_on_failure": {"type": "bool", "default": True},
}
# An option the task does not give: the node_maintenance role's variable (budget.yml gives none), where defined.
ROLE_VARIABLES = {"kubeconfig": "node_maintenance_kubeconfig", "context": "node_maintenance_kube_context",
                  "max_unavailable": "node_maintenance_max_unavailable", "fleet": "node_maintenance_fleet",
                  "out_of_service_taints": "node_maintenance_out_of_service_taints", "stopped_by": "node_maintenance_stopped_by",
                  "stop_on_failure": "node_maintenance_stop_on_failure"}
RECORD = "gpuharden_budget_record"  # node_maintenance_step budget_record's fact: {node, wanted}
CONTROLLER_PYTHON = "node_maintenance_controller_python"
BUDGET = "__node_maintenance_budget"  # the hand-over of the batch's budget to node_maintenance_step's budget_verdict
EXHAUSTED_HINT = " (a play that runs the change on several nodes at once: serial 1, or a larger node_maintenance_max_unavailable)"


def _record(hostvars, host):
    """The host's budget record (budget.yml), or {} where the role never reached it there."""
    return (hostvars[host].get("ansible_facts") or {}).get(RECORD) or {}


def batch_nodes(hostvars, batch):
    """The Nodes of the batch's hosts that reached budget.yml and want a disruptive step now, in the batch's order."""
    return [_record(hostvars, host)["node"] for host in batch if boolean(_record(hostvars, host).get("wanted", False), strict=False)]


def stopped_nodes(hostvars, stopped_by, play_hosts_all, play_hosts, stop_on_failure):
    """The nodes that stop the rollout: those given, and (stop_on_failure) those of the hosts gone from the play."""
    gone = [host for host in play_hosts_all if host not in play_hosts] if stop_on_failure else []
    return list(stopped_by) + [_record(hostvars, host).get("node", "unknown") for host in gone]


def deferral_lines(deferred, check_mode):
    """Per deferred node, the line the role fails it with, or (check mode) says."""
    if check_mode:
        return {}, {node: "%s: a real run would not start the disruptive step now: %s" % (node, why) for node, why in deferred.items()}
    return {node: "%s: disruptive step not started: %s%s" % (node, why, EXHAUSTED_HINT if "budget exhausted" in why else "")
            for node, why in deferred.items()}, {}


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        given = dict(self._task.args)
        for option, variable in ROLE_VARIABLES.items():
            if option not in given:
                value = role_setting(self._templar, variable, task_vars)
                if value is not UNDEFINED:
                    given[option] = value
        validation = ArgumentSpecValidator(ARGUMENT_SPEC).validate(given)
        if validation.error_messages:
            raise AnsibleActionFail("node_maintenance_budget: %s" % "; ".join(validation.error_messages))
        args = validation.validated_parameters
        hostvars = task_vars.get("hostvars") or {}
        batch = batch_nodes(hostvars, task_vars.get("ansible_play_batch", []))
        result.update(changed=False, allowed=[], deferred={}, not_started={}, would_defer={})
        if not batch:
            result["skipped_reason"] = "no host of the batch wants a disruptive step now"
            return _handing_over(result)
        module_args = {"max_unavailable": args["max_unavailable"], "fleet": args["fleet"], "batch": batch,
                       "out_of_service_taints": args["out_of_service_taints"],
                       "stopped_by": stopped_nodes(hostvars, args["stopped_by"], task_vars.get("ansible_play_hosts_all", []),
                                                   task_vars.get("ansible_play_hosts", []), args["stop_on_failure"])}
        for option in ("kubeconfig", "context"):
            if args[option]:
                module_args[option] = args[option]
        check_mode = bool(self._task.check_mode)
        python = self._templar.resolve_variable_expression(CONTROLLER_PYTHON) if CONTROLLER_PYTHON in task_vars else None
        budget = read_outside_check_mode(self, "gpuharden.k8s.disruption_budget", module_args, on_controller(self._task, task_vars, python))
        if budget.get("failed"):
            raise AnsibleActionFail("the disruption budget could not be checked: %s" % budget.get("msg", "failed"), result=budget)
        result.update(readable(budget))
        result["not_started"], result["would_defer"] = deferral_lines(budget.get("deferred") or {}, check_mode)
        return _handing_over(result)


def _handing_over(result):
    """The task's result, which it also hands over as BUDGET."""
    return dict(result, ansible_facts=_handover.handed_over(BUDGET, {key: value for key, value in result.items() if key != "ansible_facts"}))
