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
"""

from __future__ import annotations

import re

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


def plan(nodes, *, fleet, batch, max_unavailable, resource_prefixes=("nvidia.com/",), out_of_service_taints=(), stopped_by=()):
    """Which of ``batch`` may start a disruptive step now.

    ``nodes`` are the cluster's Node objects; the fleet is ``fleet`` (the run's target nodes) plus every Node that
    advertises a resource under ``resource_prefixes`` or is labelled ``nvidia.com/gpu.present=true``.  ``stopped_by``
    names nodes that already failed in this rollout: then nothing more starts.  Returns ``budget``, ``fleet_size``,
    ``unavailable`` (fleet nodes outside the batch that are unavailable, with reasons), ``allowed`` and
    ``deferred`` (node -> reason), in batch order.
    """
    prefixes = tuple(prefix for prefix in resource_prefixes if prefix)
    by_name = {(node.get("metadata") or {}).get("name"): node for node in nodes}
    fleet_names = set(fleet) | {name for name, node in by_name.items() if name and _is_gpu_node(node, prefixes)}
    in_service = {name for name in fleet_names if not (name in by_name and _out_of_service(by_name[name], out_of_service_taints))}
    budget = resolve_budget(max_unavailable, len(in_service))
    batch = list(dict.fromkeys(batch))
    unavailable = []
    for name in sorted(in_service - set(batch)):
        reasons = ["not registered"] if name not in by_name else unavailable_reasons(by_name[name])
        if reasons:
            unavailable.append({"node": name, "reasons": reasons})
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
