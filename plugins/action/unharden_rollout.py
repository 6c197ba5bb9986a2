# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.unharden_rollout: plan the drained pass of the uninstall, once for the play.

It reads each play host's first-pass result (what unharden_files hands over, _unharden_run.HANDOVERS["first_pass"], or
the variable ``first_pass`` names), runs gpuharden.k8s.disruption_budget once (outside check mode too: it only reads)
when a host's kubelet files wait for a drain, with gpuharden_kubeconfig and gpuharden_max_unavailable unless the task
gives them, and returns the rollout
(module_utils/cluster/_unharden_run.py decides) as the fact _unharden_run.ROLLOUT of the host it runs for:
delegated to localhost with ``delegate_facts``, the next play's ``hosts`` and ``serial`` read it there (a play keyword
sees no play host's variables: ansible-core 2.19 executor/playbook_executor.py templates it with
``VariableManager.get_vars(play=play)``, where ``hostvars`` is available).
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _unharden_run
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import playbook_default
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import read_outside_check_mode

FACT = _unharden_run.ROLLOUT
PLAYBOOK = "unharden_gpu_nodes"


def play_hosts(hostvars, names, first_pass=None):
    """[{host, node, first_pass}] of ``names``: the Node name is the host's gpuharden_k8s_node_name, else its inventory
    name; ``first_pass`` the host's variable of that name where given, else what its first pass handed over (None where
    it has none)."""
    hosts = []
    for name in names:
        variables = hostvars[name]
        passed = variables.get(first_pass) if first_pass else _handover.taken_over(variables, _unharden_run.HANDOVERS["first_pass"])
        hosts.append({"host": name, "node": _unharden_run.node_name(name, variables), "first_pass": passed})
    return hosts


class ActionModule(ActionBase):
    """Thin shell: gather the hosts' first-pass results, read the budget when needed, let the planner decide."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def _option(self, args, task_vars, option):
        """The task's option, else the play's variable gpuharden_<option> (templated), else the settings table's default."""
        if args.get(option) is not None:
            return args[option]
        name = "gpuharden_" + option
        return self._templar.template(task_vars[name]) if name in task_vars else playbook_default(name, PLAYBOOK)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        unknown = sorted(set(args) - {"first_pass", "kubeconfig", "max_unavailable"})
        if unknown:
            raise AnsibleActionFail("unharden_rollout: options are first_pass, kubeconfig, max_unavailable; got %s" % ", ".join(sorted(args)))
        first_pass = args.get("first_pass")
        hostvars = task_vars["hostvars"]
        hosts = play_hosts(hostvars, task_vars["ansible_play_hosts"], first_pass)
        fleet = [entry["node"] for entry in play_hosts(hostvars, task_vars["ansible_play_hosts_all"], first_pass)]
        budget = None
        if _unharden_run.plan(hosts)["budget_needed"]:
            module_args = {"max_unavailable": str(self._option(args, task_vars, "max_unavailable")), "fleet": fleet}
            kubeconfig = self._option(args, task_vars, "kubeconfig")
            if kubeconfig:
                module_args["kubeconfig"] = kubeconfig
            # on the controller's Python (the task is delegated to localhost), never the play's node Python
            budget = read_outside_check_mode(self, "gpuharden.k8s.disruption_budget", module_args, on_controller(self._task, task_vars))
            if budget.get("failed"):
                raise AnsibleActionFail("unharden_rollout: the disruption budget could not be read: %s" % budget.get("msg"),
                                        result=budget)
        rollout = _unharden_run.plan(hosts, budget)
        rollout["fleet"] = fleet
        result.update(changed=False, rollout=rollout, budget=budget, ansible_facts={FACT: rollout})
        return result
