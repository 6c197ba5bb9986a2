#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_maintenance
short_description: Cordon, drain (Eviction API, PodDisruptionBudgets honoured) and uncordon Kubernetes nodes
version_added: 0.1.0
description:
  - V(cordoned) marks the nodes unschedulable; V(drained) cordons them and evicts their pods through the Eviction API
    (C(policy/v1)), so every PodDisruptionBudget is honoured; V(uncordoned) makes them schedulable again.
  - V(device_plugin_restarted) evicts only the NVIDIA device plugin's own pods on the nodes, which a drain leaves
    running, and waits until they are gone; their DaemonSet starts them again and C(spec.unschedulable) stays as it is.
    The plugin enumerates the GPUs, and so the MIG devices, only when it starts (k8s-device-plugin
    C(cmd/nvidia-device-plugin/main.go)), so after a MIG layout change the running plugin would go on advertising the
    GPU instances that are gone. Every installer's plugin pod counts; a static plugin pod, or one no DaemonSet starts
    again, is left alone and reported in RV(skipped_pods).
  - An eviction a budget refuses (HTTP 429) is retried every O(retry_interval) seconds until O(timeout); then the pod is
    reported in RV(blocked) and the task fails. It is never deleted instead, not even with O(force).
  - DaemonSet pods (the node's own agents, the NVIDIA device plugin among them) and mirror pods are skipped. Pods
    without a controller are evicted only with O(force), pods with C(emptyDir) volumes only with
    O(delete_emptydir_data); otherwise the task fails before it changes anything and names them.
  - After the evictions it waits, with one LIST of pods per poll, until the evicted pods are gone (by UID).
  - Every cordon it makes carries the annotation C(gpuharden.io/cordon), the record of the run that made it
    (O(owner)), when (UTC) and for what (O(purpose)); its uncordon removes it. A cordon without the record (someone
    else's maintenance) is reported in RV(nodes) as C(preexisting_cordon). Cordoning or draining a node that another
    gpuharden run left cordoned (interrupted, or failed) takes its cordon on (the record names this run from then on).
  - V(released) uncordons the nodes another gpuharden run left cordoned (their record names another O(owner)), once
    they are Ready (O(ready_timeout)), with a JSON patch that applies only while the record is still the one read; any
    other cordon is left as it is (RV(left_alone)). The drift check reports such a cordon as C(node_left_cordoned).
  - Check mode changes nothing and reports the cordon change, the pods it would evict and those the budgets'
    current C(disruptionsAllowed) would refuse (RV(would_block)).
  - Runs on the controller (C(delegate_to=localhost)). Needs C(get) and C(patch) on C(nodes), C(list) on C(pods) and
    C(poddisruptionbudgets) in all namespaces and C(create) on C(pods/eviction); O(disable_eviction) needs C(delete) on
    C(pods), which the shipped RBAC (C(deploy/rbac/gpuharden-rbac.yaml)) does not grant.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._k8s_auth
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details:
      - The diff shows C(spec.unschedulable) per node and the pods to evict.
options:
  nodes:
    description:
      - Names of the Kubernetes nodes (C(metadata.name)).
    type: list
    elements: str
    required: true
    aliases: [name]
  state:
    description:
      - V(cordoned) sets C(spec.unschedulable); V(drained) also evicts the pods; V(uncordoned) clears it.
      - V(device_plugin_restarted) evicts the NVIDIA device plugin's pods of the nodes and leaves C(spec.unschedulable)
        as it is.
      - V(released) clears it only where another gpuharden run left its cordon (see the description).
    type: str
    choices: [cordoned, drained, uncordoned, device_plugin_restarted, released]
    default: drained
  owner:
    description:
      - The run that cordons, recorded with each cordon it makes (for example harden's run name, C(gpuharden_run_owner)).
      - Empty records C(node_maintenance@<controller host name>).
    type: str
    default: ""
  purpose:
    description: What the cordon is for (the stage, for example V(kubelet_topology) or V(mig)), recorded with it.
    type: str
    default: ""
  force:
    description:
      - Also evict pods without a controller (no ReplicaSet, StatefulSet, Job, ... recreates them).
      - Does not override PodDisruptionBudgets.
    type: bool
    default: false
  delete_emptydir_data:
    description:
      - Also evict pods with C(emptyDir) volumes; their data is lost.
    type: bool
    default: false
  disable_eviction:
    description:
      - Delete the pods instead of evicting them, which bypasses every PodDisruptionBudget (C(kubectl drain
        --disable-eviction)). For clusters without the Eviction API only; needs C(delete) on C(pods).
    type: bool
    default: false
  grace_period:
    description:
      - Seconds each pod gets to terminate; default is the pod's own C(terminationGracePeriodSeconds).
    type: int
  timeout:
    description:
      - Seconds for the whole drain, evictions and waiting for the pods to be gone.
    type: float
    default: 300
  retry_interval:
    description:
      - Seconds between retries of an eviction a PodDisruptionBudget refused.
    type: float
    default: 5
  poll_interval:
    description:
      - Seconds between the LISTs that wait for evicted pods to be gone.
    type: float
    default: 1
  page_limit:
    description:
      - Objects per page of each LIST (C(limit)); the module follows C(continue) to the end.
    type: int
    default: 500
  ready_timeout:
    description:
      - With O(state=uncordoned) or O(state=released), seconds to wait, polling every O(poll_interval) seconds, until the Ready condition
        of each node to uncordon is C(True) before C(spec.unschedulable) is cleared. A node not Ready by then stays
        cordoned, is reported in RV(not_ready), and the task fails; the nodes that are Ready are uncordoned.
      - After a kubelet restart, healthz answers before the kubelet has posted its Node status. Until it has, the node
        controller may still show the node C(Unknown), and every fleet-wide disruption budget (the next C(serial)
        batch's included) counts the node as unavailable.
      - V(0) uncordons at once, whatever the condition says.
    type: float
    default: 0
requirements:
  - kubernetes (Python client) on the controller
notes:
  - Not C(kubernetes.core.k8s_drain) - that module deletes or evicts once and does not retry a 429 until a timeout,
    and it would pull in the kubernetes.core collection for one call.
seealso:
  - module: gpuharden.k8s.gpu_consistency
"""

EXAMPLES = r"""
- name: Drain the node before a disruptive change (PodDisruptionBudgets honoured)
  gpuharden.k8s.node_maintenance:
    kubeconfig: /etc/gpuharden/kubeconfig
    nodes: ["{{ gpuharden_k8s_node_name | default(inventory_hostname) }}"]
    state: drained
    timeout: 600
  delegate_to: localhost

- name: Put it back into service
  gpuharden.k8s.node_maintenance:
    nodes: [gpu-node-1]
    state: uncordoned
  delegate_to: localhost

- name: Restart the node's device plugin after a MIG layout change, so that it advertises the new GPU instances
  gpuharden.k8s.node_maintenance:
    nodes: [gpu-node-1]
    state: device_plugin_restarted
  delegate_to: localhost

- name: Release the cordon an interrupted gpuharden run left, once the node is Ready
  gpuharden.k8s.node_maintenance:
    nodes: [gpu-node-3]
    state: released
    owner: "{{ gpuharden_run_owner }}"
    ready_timeout: 120
  delegate_to: localhost

- name: Drain a node that also runs bare pods and pods with scratch space
  gpuharden.k8s.node_maintenance:
    nodes: [gpu-node-2]
    force: true
    delete_emptydir_data: true
  delegate_to: localhost
"""

RETURN = r"""
nodes:
  description:
    - Per node, C(unschedulable_before) and C(unschedulable_after) (predicted in check mode), C(cordon_record_before)
      and C(cordon_record_after) (gpuharden's record of the cordon, C(owner), C(at), C(for), or V(null)) and
      C(preexisting_cordon) (cordoned before this call by someone else, without gpuharden's record).
  returned: always
  type: dict
  sample: {"gpu-1": {"unschedulable_before": false, "unschedulable_after": true, "cordon_record_before": null,
                     "cordon_record_after": {"owner": "harden@20260701T120000-42", "at": "2026-07-01T12:00:03Z",
                                             "for": "kubelet_topology"}, "preexisting_cordon": false}}
released:
  description: With O(state=released), the nodes uncordoned (in check mode, that would be).
  returned: when O(state=released)
  type: list
  elements: str
left_alone:
  description: With O(state=released), the other nodes, each with C(node) and C(reason).
  returned: when O(state=released)
  type: list
  elements: dict
evicted:
  description:
    - Pods evicted (or, in check mode, that would be), as C(namespace), C(name), C(uid), C(node), C(controller); with
      O(state=device_plugin_restarted), the device plugin pods.
  returned: always
  type: list
  elements: dict
blocked:
  description:
    - Pods whose eviction a PodDisruptionBudget still refused at the timeout (or that are under several budgets),
      with the API server's C(message). They were not deleted. The task fails when this is not empty.
  returned: always
  type: list
  elements: dict
would_block:
  description:
    - Check mode only - evictions the budgets would refuse now, with C(pdb) and C(message). Empty outside check mode.
  returned: always
  type: list
  elements: dict
skipped_pods:
  description:
    - DaemonSet and mirror pods left on the nodes, with C(reason); with O(state=device_plugin_restarted), the plugin
      pods that were not restarted.
  returned: always
  type: list
  elements: dict
refused:
  description: Pods without a controller (without O(force)) or with emptyDir (without O(delete_emptydir_data)), with C(reason).
  returned: always
  type: list
  elements: dict
not_gone:
  description: Evicted pods still present at the timeout (the task fails).
  returned: always
  type: list
  elements: dict
not_ready:
  description:
    - With O(ready_timeout), the nodes left cordoned because their Ready condition was not C(True) at the timeout, as
      C(node) and C(reasons) (for example C(NotReady (NodeStatusUnknown))). The task fails when this is not empty.
  returned: always
  type: list
  elements: dict
api_requests:
  description: API requests the call made.
  returned: always
  type: int
api_retries:
  description:
    - Requests to the API server that were sent again after a throttled (429), failed (5xx) or broken attempt, with backoff
      and jitter, honouring C(Retry-After). Counted on failure too; a growing count tells of an overloaded API server.
  returned: always
  type: int
  sample: 0
"""

import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _disruption, _drain
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._k8s_access import Target, call, list_all
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._resources import template

MODULE = "node_maintenance"


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(
        nodes={"type": "list", "elements": "str", "required": True, "aliases": ["name"]},
        state={"type": "str", "choices": list(_drain.STATES), "default": "drained"},
        force={"type": "bool", "default": False},
        delete_emptydir_data={"type": "bool", "default": False},
        disable_eviction={"type": "bool", "default": False},
        grace_period={"type": "int"},
        timeout={"type": "float", "default": 300},
        retry_interval={"type": "float", "default": 5},
        poll_interval={"type": "float", "default": 1},
        page_limit={"type": "int", "default": 500},
        ready_timeout={"type": "float", "default": 0},
        owner={"type": "str", "default": ""},
        purpose={"type": "str", "default": ""},
    )
    return spec


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


class Cluster:
    """The API calls of a drain, counted."""

    def __init__(self, api, page_limit):
        self.api, self.page_limit, self.requests = api, page_limit, 0
        self.read_node = _k8s.endpoint(api, "GET", *template("Node", named=True))
        self.patch_node = _k8s.endpoint(api, "PATCH", *template("Node", named=True))
        self.list_pods = _k8s.endpoint(api, "GET", *template("Pod", all_namespaces=True))
        self.list_pdbs = _k8s.endpoint(api, "GET", *template("PodDisruptionBudget", all_namespaces=True))
        self.evict_pod = _k8s.endpoint(api, "POST", *template("Eviction"))
        self.delete_pod = _k8s.endpoint(api, "DELETE", *template("Pod", named=True))

    def node(self, name):
        self.requests += 1
        _status, body = call(MODULE, self.api, self.read_node, Target.of("get", "Node", name=name), name)
        return body

    def cordon_state(self, node):
        return _drain.cordon_state(self.node(node))

    def not_ready(self, node):
        """Why the Node's Ready condition is not True (the disruption budget's own reading); [] when it is."""
        return [reason for reason in _disruption.unavailable_reasons(self.node(node)) if reason != "cordoned"]

    def set_unschedulable(self, node, value, record=False):
        self.requests += 1
        call(MODULE, self.api, self.patch_node, Target.of("patch", "Node", name=node), node, _drain.cordon_patch(value, record))

    def set_record(self, node, record):
        self.requests += 1
        call(MODULE, self.api, self.patch_node, Target.of("patch", "Node", name=node), node,
             {"metadata": {"annotations": {_drain.CORDON_ANNOTATION: _drain.record_value(record)}}})

    def release(self, node, value):
        """Uncordon a node whose cordon record is still ``value``; False when it changed since it was read."""
        self.requests += 1
        status, _body = call(MODULE, self.api, self.patch_node, Target.of("patch", "Node", name=node), node, _drain.release_patch(value),
                             _content_type="application/json-patch+json", accept=(409, 422))
        return status not in (409, 422)

    def pods(self, nodes):
        selector = "spec.nodeName=%s" % nodes[0] if len(nodes) == 1 else "spec.nodeName!="
        items, pages = list_all(MODULE, self.api, self.list_pods, Target.of("list", "Pod"),
                                self.page_limit, field_selector=selector)
        self.requests += pages
        wanted = set(nodes)
        return [pod for pod in items if (pod.get("spec") or {}).get("nodeName") in wanted]

    def pdbs(self):
        items, pages = list_all(MODULE, self.api, self.list_pdbs,
                                Target.of("list", "PodDisruptionBudget"), self.page_limit)
        self.requests += pages
        return items

    def evict(self, ref, grace_period):
        self.requests += 1
        target = Target.of("create", "Eviction", ref["namespace"], ref["name"])
        status, body = call(MODULE, self.api, self.evict_pod, target, ref["name"], ref["namespace"],
                            _drain.eviction_body(ref, grace_period), accept=(404, 409, 429, 500))
        outcome, message = _drain.eviction_outcome(status, body)
        if outcome is None:
            raise GpuhardenError("%s: evicting pod %s: API server answered %s: %s" % (MODULE, _drain.label(ref), status, message))
        return outcome, message

    def delete(self, ref, grace_period):
        self.requests += 1
        options = {"preconditions": {"uid": ref["uid"]}}
        if grace_period is not None:
            options["gracePeriodSeconds"] = grace_period
        target = Target.of("delete", "Pod", ref["namespace"], ref["name"])
        status, body = call(MODULE, self.api, self.delete_pod, target, ref["name"], ref["namespace"],
                            body=options, accept=(404, 409))
        return ("gone", "") if status in (404, 409) else ("evicted", (body or {}).get("message") or "")


def default_owner():
    """The owner a cordon records when the task names none: this module on this controller."""
    return "%s@%s" % (MODULE, socket.gethostname())


def _node_results(nodes, states, flips, adopted, record):
    results = {}
    for node in nodes:
        before = states[node]
        after = record if node in adopted or flips.get(node) is True else None if node in flips else before["record"]
        results[node] = {"unschedulable_before": before["unschedulable"], "unschedulable_after": flips.get(node, before["unschedulable"]),
                         "cordon_record_before": before["record"], "cordon_record_after": after,
                         # cordoned before, and not by gpuharden: someone else's maintenance, which an uncordon leaves alone
                         "preexisting_cordon": before["unschedulable"] and before["record"] is None}
    return results


def _wait_ready(params, cluster, nodes, result, clock, sleep):
    """The uncordon's Ready wait: the nodes of ``nodes`` still not Ready at ready_timeout go to result["not_ready"] and
    stay cordoned; returns them."""
    if not (params["ready_timeout"] > 0 and nodes):
        return {}
    waited = _drain.wait_ready(sorted(nodes), cluster.not_ready, clock, sleep, clock() + params["ready_timeout"], params["poll_interval"])
    result["not_ready"] = [{"node": node, "reasons": reasons} for node, reasons in sorted(waited.items())]
    for node in waited:
        result["nodes"][node]["unschedulable_after"] = True
        result["nodes"][node]["cordon_record_after"] = result["nodes"][node]["cordon_record_before"]
    return waited


def _not_ready_error(params, result, changed):
    return GpuhardenError("%s: %s not Ready after %gs, left cordoned: %s" % (
        MODULE, ", ".join(entry["node"] for entry in result["not_ready"]), params["ready_timeout"],
        "; ".join("%s: %s" % (entry["node"], ", ".join(entry["reasons"])) for entry in result["not_ready"])),
        **dict(result, changed=changed))


def release(params, check_mode, cluster, nodes, states, owner, clock, sleep):
    """state=released: uncordon the nodes whose cordon another gpuharden run left (an interrupted or failed run), once
    they are Ready; every other node, cordoned or not, is left as it is, with the reason."""
    to_release, kept = _drain.release_plan(nodes, states, owner)
    flips = {node: False for node in to_release}
    result = {"nodes": _node_results(nodes, states, flips, (), None), "released": [],
              "left_alone": [{"node": node, "reason": reason} for node, reason in sorted(kept.items())],
              "evicted": [], "blocked": [], "would_block": [], "skipped_pods": [], "refused": [], "not_gone": [], "not_ready": []}
    if check_mode:
        return dict(result, released=to_release, changed=bool(to_release))
    waited = _wait_ready(params, cluster, to_release, result, clock, sleep)
    for node in to_release:
        if node in waited:
            continue
        if cluster.release(node, states[node]["value"]):
            result["released"].append(node)
        else:
            now = cluster.cordon_state(node)
            result["nodes"][node].update(unschedulable_after=now["unschedulable"], cordon_record_after=now["record"])
            result["left_alone"].append({"node": node, "reason": "its cordon changed since it was read (%s, %s): left as it is" % (
                "cordoned" if now["unschedulable"] else "uncordoned", _drain.describe_record(now["record"]) if now["record"] else "no gpuharden record")})
    if result["not_ready"]:
        raise _not_ready_error(params, result, bool(result["released"]))
    return dict(result, changed=bool(result["released"]))


def run(params, check_mode, cluster, clock=time.monotonic, sleep=time.sleep):
    """The whole call; returns the module result. ``cluster`` does the API calls."""
    _drain.check_options(params)
    nodes = _drain.check_nodes(params["nodes"])
    owner = params.get("owner") or default_owner()
    deadline = clock() + params["timeout"]
    states = {node: cluster.cordon_state(node) for node in nodes}
    if params["state"] == _drain.RELEASED:
        return release(params, check_mode, cluster, nodes, states, owner, clock, sleep)
    current = {node: states[node]["unschedulable"] for node in nodes}
    flips = _drain.cordon_plan(nodes, current, params["state"])
    adopted = _drain.adoptions(nodes, states, params["state"], owner)
    record = _drain.new_record(owner, params.get("purpose"))
    result = {
        "nodes": _node_results(nodes, states, flips, adopted, record),
        "evicted": [], "blocked": [], "would_block": [], "skipped_pods": [], "refused": [], "not_gone": [], "not_ready": [],
    }
    plan = None
    if params["state"] == _drain.RESTART_PLUGIN:
        plan = dict(_drain.plugin_restart_plan(cluster.pods(nodes), nodes), refused=[])
        result["skipped_pods"] = [_drain.public(ref, "reason") for ref in plan["skipped"]]
    if params["state"] == "drained":
        plan = _drain.classify(cluster.pods(nodes), nodes, params["force"], params["delete_emptydir_data"])
        result["skipped_pods"] = [_drain.public(ref, "reason") for ref in plan["skipped"]]
        result["refused"] = [_drain.public(ref, "reason") for ref in plan["refused"]]
        if plan["refused"]:
            raise GpuhardenError(_drain.refusal_message(plan["refused"]), changed=False, **result)
    changed = bool(flips) or bool(adopted) or bool(plan and (plan["evict"] or plan["waiting"]))
    if check_mode:
        if plan and plan["evict"]:
            result["evicted"] = [_drain.public(ref) for ref in plan["evict"]]
            if not params["disable_eviction"]:
                result["would_block"] = [_drain.public(ref, "pdb", "message") for ref in _drain.predict_blocks(plan["evict"], cluster.pdbs())]
        return dict(result, changed=changed)
    # A restarted kubelet posts its Node status at its first sync whatever changed (kubernetes v1.36.3
    # pkg/kubelet/kubelet_node_status.go: lastStatusReportTime is zero after a restart), so a healthy node ends this
    # wait within its first status update; the lab test runs it against the real kubelet.
    if params["state"] == "uncordoned":
        for node in _wait_ready(params, cluster, flips, result, clock, sleep):
            del flips[node]
    for node, value in flips.items():
        # a cordon records this run; an uncordon removes whichever record there is, and a cordon without one keeps none
        cluster.set_unschedulable(node, value, record if value else (None if states[node]["record"] is not None else False))
    for node in adopted:
        cluster.set_record(node, record)
    if result["not_ready"]:
        raise _not_ready_error(params, result, bool(flips))
    if plan is None:
        return dict(result, changed=bool(flips) or bool(adopted))
    # Pods that were scheduled between the first LIST and the cordon: list again, now that nothing new lands.
    if flips:
        plan = _drain.classify(cluster.pods(nodes), nodes, params["force"], params["delete_emptydir_data"])
        result["skipped_pods"] = [_drain.public(ref, "reason") for ref in plan["skipped"]]
        if plan["refused"]:
            result["refused"] = [_drain.public(ref, "reason") for ref in plan["refused"]]
            raise GpuhardenError(_drain.refusal_message(plan["refused"]) + " The nodes stay cordoned.", changed=True, **result)
        changed = changed or bool(plan["evict"] or plan["waiting"])
    remove = cluster.delete if params["disable_eviction"] else cluster.evict
    evicted, gone, blocked = _drain.run_evictions(plan["evict"], lambda ref: remove(ref, params["grace_period"]),
                                                  clock, sleep, deadline, params["retry_interval"])
    result["evicted"] = [_drain.public(ref) for ref in evicted]
    result["blocked"] = [_drain.public(ref, "message") for ref in blocked]
    waiting = evicted + plan["waiting"]
    if waiting:
        remaining = _drain.wait_gone(waiting, lambda: {(pod.get("metadata") or {}).get("uid") for pod in cluster.pods(nodes)},
                                     clock, sleep, deadline, params["poll_interval"])
        result["not_gone"] = [_drain.public(ref) for ref in remaining]
    result["changed"] = changed
    problems = []
    if result["blocked"]:
        problems.append("%d eviction(s) blocked by PodDisruptionBudgets until the %gs timeout, pods left running (not forced): %s"
                        % (len(blocked), params["timeout"], "; ".join("%s: %s" % (_drain.label(ref), ref.get("message")) for ref in blocked)))
    if result["not_gone"]:
        problems.append("%d evicted pod(s) still present after %gs: %s"
                        % (len(result["not_gone"]), params["timeout"], ", ".join(_drain.label(ref) for ref in result["not_gone"])))
    if problems:
        what = ("restart of the device plugin on %s incomplete" if params["state"] == _drain.RESTART_PLUGIN
                else "drain of %s incomplete, the nodes stay cordoned")
        raise GpuhardenError("%s: %s: %s" % (MODULE, what % ", ".join(nodes), " | ".join(problems)), **result)
    return result


def diff(result):
    before = {node: {"unschedulable": state["unschedulable_before"], "cordon_record": state["cordon_record_before"]}
              for node, state in result["nodes"].items()}
    after = {node: {"unschedulable": state["unschedulable_after"], "cordon_record": state["cordon_record_after"]}
             for node, state in result["nodes"].items()}
    for ref in result["evicted"]:
        after.setdefault(ref["node"], {}).setdefault("evicted", []).append("%s/%s" % (ref["namespace"], ref["name"]))
    return {"before": before, "after": after, "before_header": "nodes (live)", "after_header": "nodes (after %s)" % MODULE}


def execute(module):
    """run() against the API server the options name; a failure still reports the requests it made."""
    cluster = None
    try:
        api = _k8s.api_client(module.params)
        cluster = Cluster(api, module.params["page_limit"])
        try:
            result = run(module.params, module.check_mode, cluster)
        finally:
            api.close()
    except GpuhardenError as error:
        error.result.setdefault("changed", False)
        error.result["api_requests"] = cluster.requests if cluster else 0
        raise
    result["api_requests"] = cluster.requests
    if module._diff:
        result["diff"] = diff(result)
    return result


def main():
    _module_shell.run_module(build_module(), execute, requires=[_k8s.REQUIREMENT], counters=_k8s.RESULT_COUNTERS)


if __name__ == "__main__":
    main()
