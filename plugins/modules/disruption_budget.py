#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: disruption_budget
short_description: Decide which GPU nodes may start a disruptive step now, within a fleet-wide budget
version_added: 0.1.0
description:
  - Read-only. Lists the cluster's Nodes once and decides which nodes of O(batch) may start a disruptive step
    (cordon and drain, a kubelet CPU or Memory Manager policy change, a MIG layout change) without more than
    O(max_unavailable) GPU nodes being unavailable at once.
  - The fleet is O(fleet) plus every Node that advertises a resource under O(resource_prefixes) or carries the label
    C(nvidia.com/gpu.present=true). Fleet nodes outside the batch that are cordoned, not Ready or not registered count
    against the budget, as in the NVIDIA GPU Operator's upgrade controller (C(maxUnavailable)).
  - A percentage is taken of the fleet and rounded down, but never below one node while it is above 0%.
  - Nodes with a taint in O(out_of_service_taints) (a node still being bootstrapped) serve no workloads, so they neither
    count nor need a slot.
  - With O(stopped_by) set (nodes that failed earlier in the rollout) every node of the batch is deferred.
  - A node in O(settle_nodes) (one whose containerd or kubelet this run has just restarted) that is not Ready, and not
    cordoned, is read again every O(poll_interval) seconds for up to O(settle_seconds) before it counts. After a
    containerd restart the kubelet reports its runtime down and posts Ready=False, and posts Ready=True again at a
    later status sync (kubernetes v1.36.3 pkg/kubelet/kubelet.go, updateRuntimeUp every 5 s;
    pkg/kubelet/kubelet_node_status.go, the status sync every C(nodeStatusUpdateFrequency), 10 s by default). A run
    would otherwise count its own restart against its own budget. A node still not Ready then counts, and is named
    in RV(settle).
  - With O(settle_required), a node of O(settle_nodes) still not Ready at the end of the wait stops the rollout, as a
    failed node does (RV(stopped)), as for the canary of a restart rollout, or a wave of it, that did not come back.
  - With O(restarts) (the nodes whose containerd this run restarts), RV(restart_waves) orders those restarts. A canary
    alone first (an available node), then waves of at most the budget less the fleet's nodes unavailable outside
    them, but at least one node (a containerd restart keeps the containers running and takes the node out for
    seconds at most, so a node down for another reason slows the restarts to one at a time instead of blocking the
    runtime's repair); the nodes already unavailable go with the first wave after the canary. A budget of 0 starts
    none (RV(restart_deferred)).
  - RV(left_cordoned) names the fleet's nodes a gpuharden run left cordoned (the record of
    M(gpuharden.k8s.node_maintenance)), whatever the other options; C(harden_gpu_nodes.yml) releases or resumes them.
  - Runs on the controller (C(delegate_to=localhost), C(run_once=true)); needs C(list) on C(nodes).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.info_module
  - gpuharden.k8s._k8s_auth
options:
  max_unavailable:
    description:
      - The most GPU nodes unavailable at once, as a count (V(1)) or a percentage of the fleet (V(25%)).
    type: raw
    default: 1
  fleet:
    description: The run's target nodes (Node names); every GPU node of the cluster is added to them.
    type: list
    elements: str
    default: []
  batch:
    description: The nodes that want to start a disruptive step now, in the order they should get slots.
    type: list
    elements: str
    default: []
  resource_prefixes:
    description: A Node whose capacity or allocatable has a resource starting with one of these is a GPU node.
    type: list
    elements: str
    default: [nvidia.com/]
  out_of_service_taints:
    description: Taint keys of nodes that do not serve workloads yet (they neither count nor need a slot).
    type: list
    elements: str
    default: []
  stopped_by:
    description: Nodes that failed earlier in this rollout; when not empty, nothing more starts.
    type: list
    elements: str
    default: []
  settle_nodes:
    description: Nodes this run has just restarted containerd or the kubelet on (see the description).
    type: list
    elements: str
    default: []
  settle_seconds:
    description: The longest wait for O(settle_nodes) to be Ready again; V(0) counts them as they are.
    type: float
    default: 60
  poll_interval:
    description: Seconds between reads of a node of O(settle_nodes) that is not Ready.
    type: float
    default: 2
  settle_required:
    description: A node of O(settle_nodes) still not Ready after O(settle_seconds) stops the rollout (RV(stopped)).
    type: bool
    default: false
  restarts:
    description: The nodes whose service (containerd) this run restarts, in the run's order, for RV(restart_waves).
    type: list
    elements: str
    default: []
requirements:
  - kubernetes (Python client) on the controller
seealso:
  - module: gpuharden.k8s.node_maintenance
"""

EXAMPLES = r"""
- name: Which nodes of this batch may be drained now
  gpuharden.k8s.disruption_budget:
    max_unavailable: 25%
    fleet: "{{ groups['gpu_nodes'] }}"
    batch: "{{ ansible_play_batch }}"
  delegate_to: localhost
  run_once: true
  register: budget
"""

RETURN = r"""
budget:
  description: O(max_unavailable) as a number of nodes.
  returned: always
  type: int
  sample: 2
fleet_size:
  description: GPU nodes in service (the base of a percentage).
  returned: always
  type: int
fleet:
  description: Every node of the fleet, by name.
  returned: always
  type: list
  elements: str
unavailable:
  description: Fleet nodes outside the batch that are unavailable now, each with C(node) and C(reasons).
  returned: always
  type: list
  elements: dict
  sample: [{"node": "gpu-3", "reasons": ["cordoned"]}]
allowed:
  description: The nodes of O(batch) that may start their disruptive step.
  returned: always
  type: list
  elements: str
deferred:
  description: The nodes of O(batch) that may not, each with the reason.
  returned: always
  type: dict
  sample: {"gpu-5": "disruption budget exhausted: max_unavailable 1 = 1 node(s) of 8; unavailable now: gpu-3 (cordoned)"}
settle:
  description:
    - The wait for O(settle_nodes), C(seconds), the nodes that were not Ready at the first read (C(waited_for)) and
      those still not Ready at the end, with their reasons (C(not_ready)).
  returned: always
  type: dict
  sample: {"seconds": 12.1, "waited_for": ["gpu-2"], "not_ready": {}}
stopped:
  description:
    - Why the rollout stops here (O(stopped_by), or with O(settle_required) the nodes of O(settle_nodes) not Ready in
      time), else null. Every node of O(batch) is then deferred.
  returned: always
  type: str
restart_waves:
  description: O(restarts) in the order they may go, a list of waves (lists of nodes), the canary alone first.
  returned: always
  type: list
  elements: list
  sample: [["gpu-0"], ["gpu-3", "gpu-1"], ["gpu-2"]]
restart_steps:
  description:
    - What a playbook loops over for RV(restart_waves), one step per wave and a last one without nodes, each with
      C(index), C(nodes) (the wave), C(settle) (the previous wave's nodes that were available before their restart; a
      call with them as O(settle_nodes) and O(settle_required) says whether the wave may start) and C(before) (the
      nodes of the earlier waves).
  returned: always
  type: list
  elements: dict
restart_deferred:
  description: The nodes of O(restarts) that may not restart at all now (a budget of 0), each with the reason.
  returned: always
  type: dict
left_cordoned:
  description:
    - The fleet's nodes a gpuharden run left cordoned, each with C(node) and C(record) (C(owner), C(at), C(for)).
  returned: always
  type: list
  elements: dict
  sample: [{"node": "gpu-3", "record": {"owner": "harden@20260701T120000-7", "at": "2026-07-01T12:00:03Z", "for": "mig"}}]
api_retries:
  description:
    - Requests to the API server that were sent again after a throttled (429), failed (5xx) or broken attempt, with backoff
      and jitter, honouring C(Retry-After). Counted on failure too; a growing count tells of an overloaded API server.
  returned: always
  type: int
  sample: 0
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _disruption, _drain
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._k8s_access import Target, call, list_all
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._resources import template


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(
        max_unavailable={"type": "raw", "default": 1},
        fleet={"type": "list", "elements": "str", "default": []},
        batch={"type": "list", "elements": "str", "default": []},
        resource_prefixes={"type": "list", "elements": "str", "default": ["nvidia.com/"]},
        out_of_service_taints={"type": "list", "elements": "str", "default": []},
        stopped_by={"type": "list", "elements": "str", "default": []},
        settle_nodes={"type": "list", "elements": "str", "default": []},
        settle_seconds={"type": "float", "default": 60},
        poll_interval={"type": "float", "default": 2},
        settle_required={"type": "bool", "default": False},
        restarts={"type": "list", "elements": "str", "default": []},
    )
    return spec


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def settle(nodes, settle_nodes, read_node, clock, sleep, seconds, poll_interval):
    """Wait for the nodes of ``settle_nodes`` that are only NotReady (a cordon is no restart's doing) to be Ready again;
    ``nodes`` gets each node read again.  Returns the ``settle`` result."""
    started = clock()
    by_name = {(node.get("metadata") or {}).get("name"): position for position, node in enumerate(nodes)}
    first = {name: _disruption.unavailable_reasons(nodes[by_name[name]]) for name in dict.fromkeys(settle_nodes) if name in by_name}
    waiting = [name for name, reasons in first.items() if reasons and "cordoned" not in reasons]

    def not_ready(name):
        nodes[by_name[name]] = read_node(name)
        return _disruption.unavailable_reasons(nodes[by_name[name]])

    still = _drain.wait_ready(waiting, not_ready, clock, sleep, started + seconds, poll_interval) if waiting and seconds > 0 else {
        name: first[name] for name in waiting}
    return {"seconds": round(clock() - started, 1), "waited_for": waiting, "not_ready": still}


def decide(params, clock=time.monotonic, sleep=time.sleep):
    _disruption.resolve_budget(params["max_unavailable"], 0)  # bad input fails before any request
    if params["settle_seconds"] < 0 or params["poll_interval"] <= 0:
        raise GpuhardenError("disruption_budget: settle_seconds=%r must be >= 0 and poll_interval=%r > 0"
                             % (params["settle_seconds"], params["poll_interval"]))
    api = _k8s.api_client(params)
    try:
        nodes, _pages = list_all("disruption_budget", api, _k8s.endpoint(api, "GET", *template("Node")), Target.of("list", "Node"))
        read = _k8s.endpoint(api, "GET", *template("Node", named=True))
        settled = settle(nodes, params["settle_nodes"],
                         lambda name: call("disruption_budget", api, read, Target.of("get", "Node", name=name), name)[1],
                         clock, sleep, params["settle_seconds"], params["poll_interval"])
    finally:
        api.close()
    stopped = stop_reason(params, settled)
    common = {"resource_prefixes": params["resource_prefixes"]}
    result = _disruption.plan(nodes, fleet=params["fleet"], batch=params["batch"], max_unavailable=params["max_unavailable"],
                              out_of_service_taints=params["out_of_service_taints"], stopped_by=[stopped] if stopped else (), **common)
    if stopped:  # the plan's own wording names stopped_by as nodes that failed; the reason here says what happened
        result["deferred"] = {name: "rollout stopped: %s" % stopped for name in result["deferred"]}
    waves = _disruption.restart_waves(nodes, fleet=params["fleet"], restarts=params["restarts"], max_unavailable=params["max_unavailable"],
                                      out_of_service_taints=params["out_of_service_taints"], **common)
    result.update(settle=settled, stopped=stopped, restart_waves=waves["waves"], restart_steps=waves["steps"], restart_deferred=waves["deferred"],
                  left_cordoned=_disruption.left_cordoned(nodes, fleet=params["fleet"], **common))
    return result


def stop_reason(params, settled):
    """Why the rollout stops here, or None: nodes that failed earlier (stopped_by), or with settle_required the nodes
    this run restarted that did not come back Ready within settle_seconds."""
    reasons = []
    if params["stopped_by"]:
        reasons.append("%s failed earlier in this run and stays as it was left" % ", ".join(sorted(params["stopped_by"])))
    if params["settle_required"] and settled["not_ready"]:
        reasons.append("%s not Ready %gs after this run restarted it (%s)" % (
            ", ".join(sorted(settled["not_ready"])), params["settle_seconds"],
            "; ".join("%s: %s" % (name, ", ".join(reasons_)) for name, reasons_ in sorted(settled["not_ready"].items()))))
    return "; ".join(reasons) or None


def main():
    _module_shell.run_module(build_module(), lambda module: decide(module.params), requires=[_k8s.REQUIREMENT], never_changed=True,
                             counters=_k8s.RESULT_COUNTERS)


if __name__ == "__main__":
    main()
