# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.unharden_report: one node's verdict at the end of the uninstall.

It reads the node's results by the variable names its options give, else what the steps handed over
(_unharden_run.HANDOVERS: the unharden_files passes, unharden_cluster, why the drained pass failed) and why the drained
pass was deferred (registered as _unharden_run.DEFERRED) and whether the rollout took the host for the drained pass (unharden_rollout's fact on localhost), lets
module_utils/cluster/_unharden_run.py ``report`` decide, and returns what was left in conflict as the run's stats
(``gpuharden_unharden_conflicts``, aggregated per inventory host: ansible-core's strategy reads ``ansible_stats``
from any task's result, as set_stats returns it) and the message the node fails with, if any (``failure``, also handed over).
It never fails itself: ansible-core records stats only from a successful result, so the task after it (unharden_node
step=release then_fail=report) fails the node.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _unharden_run
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

STAT = "gpuharden_unharden_conflicts"
# option: what it reads where the task does not name a variable (a hand-over, or the registered deferral)
OPTIONS = {
    "passes": [_unharden_run.HANDOVERS["first_pass"], _unharden_run.HANDOVERS["drained_pass"]],
    "cluster": _unharden_run.HANDOVERS["cluster"],
    "failed": _unharden_run.HANDOVERS["failed"],
    "deferred": _unharden_run.DEFERRED,
}
HANDED_OVER = frozenset(_unharden_run.HANDOVERS.values())


def why(result):
    """Why the drained pass was deferred or failed, from unharden_node's result (step deferred or failed), or a message."""
    return result.get("why") if hasattr(result, "get") else result


def in_rollout(task_vars, host):
    """Whether unharden_rollout took ``host`` for the drained pass (its fact on localhost)."""
    localhost = (task_vars.get("hostvars") or {}).get("localhost") or {}
    rollout = localhost.get(_unharden_run.ROLLOUT) if hasattr(localhost, "get") else None
    return host in ((rollout or {}).get("hosts") or [])


class ActionModule(ActionBase):
    """Thin shell: read the named results of this host, let the planner decide."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        given = {option: value for option, value in self._task.args.items() if value is not None}
        args = dict(OPTIONS, **given)
        unknown = sorted(set(args) - set(OPTIONS))
        if unknown or not isinstance(args["passes"], list):
            raise AnsibleActionFail("unharden_report: options are %s (names of this host's variables; passes a list); got %s"
                                    % (", ".join(OPTIONS), ", ".join(sorted(self._task.args))))

        def read(option, name):
            """The variable the task names for ``option``; else that option's default: a hand-over, or the registered deferral."""
            if option in given or name not in HANDED_OVER:
                return task_vars.get(name) if name else None
            return _handover.taken_over(task_vars, name)

        host = task_vars["inventory_hostname"]
        node = self._templar.copy_with_new_env(available_variables=task_vars).template(_unharden_run.node_name(host, task_vars))
        verdict = _unharden_run.report(node, [read("passes", name) for name in args["passes"]], cluster=read("cluster", args["cluster"]),
                                       failed=why(read("failed", args["failed"])), deferred=why(read("deferred", args["deferred"])),
                                       drain_expected=in_rollout(task_vars, host))
        result.update(changed=False, node=node, conflicts=verdict["conflicts"], failure=verdict["failure"],
                      ansible_facts=_handover.handed_over(_unharden_run.HANDOVERS["report"], {"failure": verdict["failure"]}))
        if verdict["conflicts"]:
            result["ansible_stats"] = {"data": {STAT: {host: verdict["conflicts"]}}, "per_host": False, "aggregate": True}
        return result
