# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The uninstall's decisions across the run: the rollout of the kubelet's drained way back (which hosts, in which
order, in batches of what size), and each node's report at the end.

playbooks/unharden_gpu_nodes.yml decided this in Jinja (a group_by into three groups, a batch size set as a fact on
localhost); the action gpuharden.k8s.unharden_rollout decides it here, once for the play, from each host's first-pass
result (unharden_files ``deferred``: its kubelet files wait for a drain) and the fleet's disruption budget
(gpuharden.k8s.disruption_budget, the same module and arithmetic as harden's rollout).

- Hosts: those whose kubelet files were deferred, in the play's order, the ones whose Node is unavailable already
  first (they take no slot of the budget: draining a node that is down already costs nothing).
- Batches: ``serial: [1, batch]``: a canary alone, then ``batch`` at a time, where ``batch`` is the budget less the
  fleet's nodes unavailable outside the rollout, and never below 1 (the budget role defers a node that may not start).
- Report (action gpuharden.k8s.unharden_report): a node whose drained pass failed fails with that step's message; else
  what was left in conflict on it (its files, from both passes, and its Node's labels and taints) goes to the run's
  stats, and the node fails when its drained pass was not started (the budget) or something is left in conflict.
"""

from __future__ import annotations


def needs_drain(first_pass):
    """Whether a host's first-pass unharden_files result left its kubelet files for the drained pass."""
    return bool((first_pass or {}).get("deferred"))


def plan(hosts, budget=None):
    """The rollout.

    ``hosts``: the play's hosts in order, each ``{"host", "node", "first_pass"}`` (the host's registered unharden_files
    result, or None where the task did not run).  ``budget``: disruption_budget's result (``budget``, ``unavailable``:
    [{node, reasons}]), read only when some host needs a drain (None otherwise).

    Returns ``{"hosts": [inventory names, in rollout order], "nodes": [their Node names], "serial": [1, batch],
    "budget_needed": bool}``."""
    rollout = [host for host in hosts if needs_drain(host.get("first_pass"))]
    if not rollout or budget is None:
        return {"hosts": [], "nodes": [], "serial": [1, 1], "budget_needed": bool(rollout)}
    unavailable = [entry["node"] for entry in budget.get("unavailable") or []]
    first = [host for host in rollout if host["node"] in unavailable]
    then = [host for host in rollout if host["node"] not in unavailable]
    ordered = first + then
    rollout_nodes = {host["node"] for host in rollout}
    outside = [node for node in unavailable if node not in rollout_nodes]
    batch = max(int(budget.get("budget") or 0) - len(outside), 1)
    return {"hosts": [host["host"] for host in ordered], "nodes": [host["node"] for host in ordered],
            "serial": [1, batch], "budget_needed": True}


def report(node, passes, cluster=None, failed=None, deferred=None):
    """This node's verdict.

    ``passes``: its unharden_files results (None where a pass did not run); ``cluster``: unharden_cluster's result
    (all nodes; None where it did not run); ``failed``: why its drained pass failed; ``deferred``: why it was not
    started.  Returns ``{"conflicts": [...], "failure": the message the node fails with, or None}``; ``conflicts`` is
    empty where the node fails for ``failed`` (the report of a node that stopped half-way is that step's failure)."""
    if failed:
        return {"conflicts": [], "failure": "%s: %s" % (node, failed)}
    conflicts = [conflict for result in passes for conflict in (result or {}).get("conflicts") or []]
    conflicts += [conflict for conflict in (cluster or {}).get("conflicts") or [] if conflict.get("node") == node]
    failure = None
    if deferred:
        failure = deferred
    elif conflicts:
        failure = ("%s: left as they are, changed since gpuharden wrote them: %s. Restore them by hand, or run again with "
                   "gpuharden_unharden_force=true." % (node, "; ".join(conflict["reason"] for conflict in conflicts)))
    return {"conflicts": conflicts, "failure": failure}
