# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The fleet-wide disruption budget: which nodes may start a disruptive step now (pure functions).

A disruptive step is one that evicts or restarts GPU workloads: a cordon and drain, a kubelet CPU or Memory
Manager policy change, a MIG layout change.  At most ``max_unavailable`` GPU nodes of the fleet may be
unavailable at once, and nodes that are already unavailable (cordoned, or not Ready) count against that budget.
This is the contract of the NVIDIA GPU Operator's upgrade controller (NVIDIA/k8s-operator-libs,
``pkg/upgrade/upgrade_state.go`` ``ApplyState``: ``maxUnavailable`` scaled over the managed GPU nodes,
``GetCurrentUnavailableNodes`` counted against it, ``GetUpgradesAvailable`` the slots left), taken here for every
disruptive step, not only driver upgrades.

One difference, on purpose: the operator scales a percentage with rounding UP
(``intstr.GetScaledValueFromIntOrPercent(..., true)``, as a DaemonSet's maxUnavailable); here it is rounded DOWN,
never below one node while the percentage is above zero.  A budget is a ceiling: 25% of a 9-node fleet is two nodes
here, not three.

Nodes that carry one of ``out_of_service_taints`` (a node being bootstrapped, registered cordoned with
``gpuharden.io/bootstrap``) serve no workload yet: they neither count against the budget nor need a slot.

``restart_waves`` orders the containerd restarts of a run: a canary first, alone, then waves within the budget
(see there).  ``left_cordoned`` names the cordons an ended gpuharden run left (node_maintenance's record).
"""

from __future__ import annotations

import re

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _drain
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

_BUDGET_RE = re.compile(r"^\s*([0-9]+)\s*(%?)\s*$")


def resolve_budget(max_unavailable, fleet_size):
    """``max_unavailable`` (a count, or ``"N%"`` of the fleet) as a number of nodes."""
    text = str(max_unavailable) if isinstance(max_unavailable, (int, str)) and not isinstance(max_unavailable, bool) else ""
    match = _BUDGET_RE.match(text)
    if not match:
        raise GpuhardenError("disruption budget: max_unavailable=%r must be a number of nodes (1) or a percentage of the "
                             "GPU fleet (25%%)" % (max_unavailable,))
    number, percent = int(match.group(1)), bool(match.group(2))
    if not percent:
        return number
    if number > 100:
        raise GpuhardenError("disruption budget: max_unavailable=%r is more than 100%% of the fleet" % (max_unavailable,))
    if number == 0 or fleet_size == 0:
        return 0
    return max(1, number * fleet_size // 100)


def unavailable_reasons(node):
    """Why a Node object is unavailable: cordoned, and/or its Ready condition is not True; [] when available."""
    reasons = []
    if (node.get("spec") or {}).get("unschedulable"):
        reasons.append("cordoned")
    conditions = {entry.get("type"): entry for entry in (node.get("status") or {}).get("conditions") or []}
    ready = conditions.get("Ready")
    if ready is None:
        reasons.append("no Ready condition")
    elif ready.get("status") != "True":
        reasons.append("NotReady (%s)" % (ready.get("reason") or ready.get("status") or "unknown"))
    return reasons


def _is_gpu_node(node, prefixes):
    status = node.get("status") or {}
    resources = set(status.get("capacity") or {}) | set(status.get("allocatable") or {})
    labels = (node.get("metadata") or {}).get("labels") or {}
    return any(name.startswith(prefix) for name in resources for prefix in prefixes) or labels.get("nvidia.com/gpu.present") == "true"


def _out_of_service(node, taint_keys):
    return any(taint.get("key") in taint_keys for taint in (node.get("spec") or {}).get("taints") or [])


def _fleet(nodes, fleet, resource_prefixes, out_of_service_taints):
    """(Node objects by name, every fleet node's name, the fleet nodes in service)."""
    prefixes = tuple(prefix for prefix in resource_prefixes if prefix)
    by_name = {(node.get("metadata") or {}).get("name"): node for node in nodes}
    fleet_names = set(fleet) | {name for name, node in by_name.items() if name and _is_gpu_node(node, prefixes)}
    in_service = {name for name in fleet_names if not (name in by_name and _out_of_service(by_name[name], out_of_service_taints))}
    return by_name, fleet_names, in_service


def _unavailable(by_name, names):
    """[{node, reasons}] of the nodes of ``names`` that are unavailable now, by name."""
    unavailable = []
    for name in sorted(names):
        reasons = ["not registered"] if name not in by_name else unavailable_reasons(by_name[name])
        if reasons:
            unavailable.append({"node": name, "reasons": reasons})
    return unavailable


def restart_waves(nodes, *, fleet, restarts, max_unavailable, resource_prefixes=("nvidia.com/",), out_of_service_taints=()):
    """The order of a run's service restarts (containerd's) over ``restarts`` (Node names, in the run's order).

    A restart whose new configuration the service cannot load takes the node's runtime down, on every node at once
    when every node restarts at once.  So: a canary first, alone - the first node of ``restarts`` that is available
    (a node already down for another reason would prove nothing by coming back) - and the others only once it has come
    back; then waves of at most the budget less the fleet's nodes that are unavailable now outside ``restarts``, but at
    least one node: a containerd restart keeps the node's containers running (their shims outlive the daemon) and the
    kubelet sees the runtime down for seconds at most, so a node down elsewhere slows the rollout to one node at a time
    instead of blocking the runtime's repair.  A budget of 0 allows no restart.  The nodes of ``restarts`` that are
    already unavailable (or out of service, or not registered) take nothing more away: they go with the first wave
    after the canary.  Returns {waves: [[node]], deferred: {node: reason}, wave_size, steps}: ``steps`` is what a
    playbook loops over, one per wave and a last one without nodes, each {index, nodes, settle, before}: ``settle``
    the previous wave's nodes that were available before their restart (each must be Ready again before this step
    goes on), ``before`` every node of the earlier waves (one that failed stops the rollout).
    """
    wanted = list(dict.fromkeys(restarts))
    by_name, fleet_names, in_service = _fleet(nodes, list(fleet) + wanted, resource_prefixes, out_of_service_taints)
    budget = resolve_budget(max_unavailable, len(in_service))
    if budget == 0:
        reason = "disruption budget max_unavailable %s = 0 node(s): no restart is started" % (max_unavailable,)
        return {"waves": [], "deferred": {name: reason for name in wanted}, "wave_size": 0, "steps": []}
    busy = _unavailable(by_name, in_service - set(wanted))
    size = max(1, budget - len(busy))
    available = [name for name in wanted if name in in_service and name in by_name and not unavailable_reasons(by_name[name])]
    free = [name for name in wanted if name not in available]
    canary = (available or free or [None])[0]
    if canary is None:
        return {"waves": [], "deferred": {}, "wave_size": size, "steps": []}
    rest = [name for name in available if name != canary]
    waves = [[canary]]
    first = [name for name in free if name != canary] + rest[:size]
    rest = rest[size:]
    if first:
        waves.append(first)
    waves.extend(rest[start:start + size] for start in range(0, len(rest), size))
    steps, before = [], []
    for index, wave in enumerate(waves + [[]]):
        previous = waves[index - 1] if index else []
        steps.append({"index": index, "nodes": wave, "settle": [name for name in previous if name in available], "before": list(before)})
        before.extend(wave)
    return {"waves": waves, "deferred": {}, "wave_size": size, "steps": steps}


def left_cordoned(nodes, *, fleet=(), resource_prefixes=("nvidia.com/",)):
    """[{node, record}] of the fleet's nodes (``fleet`` and every GPU Node) that a gpuharden run left cordoned: cordoned,
    with node_maintenance's record of the cordon.  Which of them a run may release is its own decision (its owner)."""
    by_name, fleet_names, _in_service = _fleet(nodes, fleet, resource_prefixes, ())
    left = []
    for name in sorted(fleet_names & set(by_name)):
        state = _drain.cordon_state(by_name[name])
        if state["unschedulable"] and state["record"] is not None:
            left.append({"node": name, "record": state["record"]})
    return left


def plan(nodes, *, fleet, batch, max_unavailable, resource_prefixes=("nvidia.com/",), out_of_service_taints=(), stopped_by=()):
    """Which of ``batch`` may start a disruptive step now.

    ``nodes`` are the cluster's Node objects; the fleet is ``fleet`` (the run's target nodes), ``batch`` and every Node that
    advertises a resource under ``resource_prefixes`` or is labelled ``nvidia.com/gpu.present=true``.  ``stopped_by``
    names nodes that already failed in this rollout: then nothing more starts.  Returns ``budget``, ``fleet_size``,
    ``unavailable`` (fleet nodes outside the batch that are unavailable, with reasons), ``allowed`` and
    ``deferred`` (node -> reason), in batch order.
    """
    batch = list(dict.fromkeys(batch))
    # the batch is the fleet's too: a node that advertises no GPU yet (no device plugin) still serves workloads
    by_name, fleet_names, in_service = _fleet(nodes, list(fleet) + batch, resource_prefixes, out_of_service_taints)
    budget = resolve_budget(max_unavailable, len(in_service))
    unavailable = _unavailable(by_name, in_service - set(batch))
    allowed, deferred = [], {}
    slots = budget - len(unavailable)
    for name in batch:
        if stopped_by:
            deferred[name] = "rollout stopped: %s failed earlier in this run and stays as it was left" % ", ".join(sorted(stopped_by))
        elif name not in by_name:
            deferred[name] = "no Node %s in the cluster" % name
        elif name not in in_service:
            allowed.append(name)  # not serving workloads yet: disrupting it takes nothing away
        elif slots > 0:
            allowed.append(name)
            slots -= 1
        else:
            busy = ", ".join("%s (%s)" % (entry["node"], ", ".join(entry["reasons"])) for entry in unavailable) or "none"
            deferred[name] = ("disruption budget exhausted: max_unavailable %s = %d node(s) of %d; unavailable now: %s"
                              % (max_unavailable, budget, len(in_service), busy))
    return {"budget": budget, "fleet_size": len(in_service), "fleet": sorted(fleet_names), "unavailable": unavailable,
            "allowed": allowed, "deferred": deferred}
