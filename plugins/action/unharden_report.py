# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.unharden_report: one node's verdict at the end of the uninstall.

It reads the node's results by the names its options give (the registered unharden_files passes and unharden_cluster,
the facts set when the drained pass failed or was deferred), lets module_utils/cluster/_unharden_run.py ``report``
decide, and returns what was left in conflict as the run's stats (``gpuharden_unharden_conflicts``, aggregated per
inventory host: ansible-core's strategy reads ``ansible_stats`` from any task's result, as set_stats returns it) and
the message the node fails with, if any (``failure``).  It never fails itself: ansible-core records stats only from a
successful result, so the task after it fails the node.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _unharden_run

NODE_NAME = "gpuharden_k8s_node_name"
STAT = "gpuharden_unharden_conflicts"
OPTIONS = ("passes", "cluster", "failed", "deferred")


class ActionModule(ActionBase):
    """Thin shell: read the named results of this host, let the planner decide."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        unknown = sorted(set(args) - set(OPTIONS))
        passes = args.get("passes") or []
        if unknown or not isinstance(passes, list):
            raise AnsibleActionFail("unharden_report: options are %s (names of this host's variables; passes a list); got %s"
                                    % (", ".join(OPTIONS), ", ".join(sorted(args))))

        def read(name):
            return task_vars.get(name) if name else None

        host = task_vars["inventory_hostname"]
        node = self._templar.copy_with_new_env(available_variables=task_vars).template(task_vars.get(NODE_NAME) or host)
        verdict = _unharden_run.report(node, [read(name) for name in passes], cluster=read(args.get("cluster")),
                                       failed=read(args.get("failed")), deferred=read(args.get("deferred")))
        result.update(changed=False, node=node, conflicts=verdict["conflicts"], failure=verdict["failure"])
        if verdict["conflicts"]:
            result["ansible_stats"] = {"data": {STAT: {host: verdict["conflicts"]}}, "per_host": False, "aggregate": True}
        return result
