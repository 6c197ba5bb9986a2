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
  stats, and the node fails when its drained pass was not started (the budget deferred it, or the rollout took it but
  never reached it) or something is left in conflict.

What one step hands to a later one, it hands over in Python (plugins/plugin_utils/_handover.py: a fact of the host,
stamped with this ansible-playbook run), by the names in HANDOVERS, so that the playbook registers, names and templates
none of it.
"""

from __future__ import annotations

# What each step hands over (plugins/plugin_utils/_handover.py), by step: the action that sets it and those that read it.
HANDOVERS = {
    "lock": "__unharden_lock",  # unharden_node step=lock: {owner, path, node}; read by steps failed, release, cluster
    "cluster": "__unharden_cluster",  # unharden_node step=cluster (once for the play, every host): read by unharden_report
    "first_pass": "__unharden_files",  # unharden_files with defer_disruptive (play 1): read by unharden_rollout and _report
    "drained_pass": "__unharden_kubelet_files",  # unharden_files without it (play 2): read by unharden_report
    "failed": "__unharden_failed",  # unharden_node step=failed: {node, why}; read by steps stopped and unharden_report
    "report": "__unharden_report",  # unharden_report: {failure}; read by unharden_node step=release then_fail=report
}
# Registered by the playbook, where the drained pass's include_tasks reads it in its `when` (a task an action cannot
# skip): unharden_node step=deferred, why the budget did not start the drained pass; unharden_report reads it too.
DEFERRED = "__unharden_deferred"
# unharden_rollout's fact on localhost (delegate_facts): the second play's hosts and serial (play keywords read it).
ROLLOUT = "__unharden_rollout"
NODE_NAME = "gpuharden_k8s_node_name"


def node_name(host, variables):
    """The Node name of inventory host ``host``: its gpuharden_k8s_node_name, else the inventory name."""
    return variables.get(NODE_NAME) or host


def run_owner(given, now, number):
    """The run's name in the node locks: gpuharden_run_owner where given, else ``unharden@<UTC time>-<number>``
    (``now`` a datetime in UTC, ``number`` a random one: two runs started in the same second differ)."""
    return given or "unharden@%s-%d" % (now.strftime("%Y%m%dT%H%M%S"), number)


def failure_message(node, failed_task, failed_result):
    """The message a node fails with where one of its steps failed (a rescue's ansible_failed_task and _result)."""
    return "%s: %s failed: %s" % (node, (failed_task or {}).get("name") or "a step", (failed_result or {}).get("msg") or "failed")


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


def report(node, passes, cluster=None, failed=None, deferred=None, drain_expected=False):
    """This node's verdict.

    ``passes``: its unharden_files results, the first pass first (None where a pass did not run); ``cluster``:
    unharden_cluster's result (all nodes; None where it did not run); ``failed``: why its drained pass failed (the
    message); ``deferred``: why it was not started; ``drain_expected``: the rollout took this host for the drained pass
    (one whose pass neither ran, failed nor was deferred never got there, the second play ended before it: its kubelet
    files are still gpuharden's).  Returns ``{"conflicts": [...], "failure": the message the node fails with, or
    None}``; ``conflicts`` is empty where the node fails for ``failed`` (the report of a node that stopped half-way is
    that step's failure)."""
    if failed:
        return {"conflicts": [], "failure": failed}
    conflicts = [conflict for result in passes for conflict in (result or {}).get("conflicts") or []]
    conflicts += [conflict for conflict in (cluster or {}).get("conflicts") or [] if conflict.get("node") == node]
    drained = len(passes) > 1 and passes[-1] is not None
    failure = None
    if deferred:
        failure = deferred
    elif drain_expected and not drained:
        failure = ("%s: the kubelet's files were not put back: the drained pass did not reach this node (its play ended first). "
                   "Run the uninstall again." % node)
    elif conflicts:
        failure = ("%s: left as they are, changed since gpuharden wrote them: %s. Restore them by hand, or run again with "
                   "gpuharden_unharden_force=true." % (node, "; ".join(conflict["reason"] for conflict in conflicts)))
    return {"conflicts": conflicts, "failure": failure}
