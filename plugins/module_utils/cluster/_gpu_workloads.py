# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""GPU workloads from API objects (plain dicts as the API server sends them): pure functions.

A workload is a pod spec that may run somewhere: a bare pod (no controller) that has not finished,
or the pod template of a Deployment, StatefulSet, DaemonSet, Job (not owned by a CronJob) or CronJob.
``summarize`` keeps what placement and topology decide on: nodeName, nodeSelector, required node
affinity, tolerations, and the GPUs each container asks for.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _topology
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._gpu_pods import TERMINATED_PHASES, parse_quantity
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

# kind -> (path to the pod spec in the object); the API listing each kind is the module's business.
KINDS = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


def _dig(obj, path):
    for key in path:
        obj = (obj or {}).get(key)
    return obj or {}


def _gpus(container, resources, where):
    """GPUs one container asks for: its requests, else its limits (extended resources: requests == limits)."""
    total = 0
    spec = container.get("resources") or {}
    for resource in resources:
        value = (spec.get("requests") or {}).get(resource, (spec.get("limits") or {}).get(resource))
        if value is None:
            continue
        amount = parse_quantity(value, "%s %s" % (where, resource))
        if amount != amount.to_integral_value() or amount < 0:
            raise GpuhardenError("%s: %s=%r is not a whole number of devices" % (where, resource, value))
        total += int(amount)
    return total


def _controlled(obj):
    return any(ref.get("controller") for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def summarize(kind, obj, resources):
    """The workload's placement and GPU requests, or None when it asks for no GPU or does not run anymore."""
    meta = obj.get("metadata") or {}
    if kind == "Pod" and ((obj.get("status") or {}).get("phase") in TERMINATED_PHASES or _controlled(obj)):
        return None
    if kind == "Job" and any(ref.get("kind") == "CronJob" for ref in meta.get("ownerReferences") or []):
        return None
    spec = _dig(obj, KINDS[kind])
    where = "%s %s/%s" % (kind, meta.get("namespace"), meta.get("name"))
    containers = [{"name": container.get("name"), "gpus": _gpus(container, resources, "%s container %s" % (where, container.get("name")))}
                  for container in spec.get("containers") or []]
    init = [{"name": container.get("name"), "sidecar": container.get("restartPolicy") == "Always",
             "gpus": _gpus(container, resources, "%s init container %s" % (where, container.get("name")))}
            for container in spec.get("initContainers") or []]
    if not any(container["gpus"] for container in containers + init):
        return None
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return {
        "kind": kind,
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "node_name": spec.get("nodeName"),
        "phase": (obj.get("status") or {}).get("phase") if kind == "Pod" else None,
        "node_selector": spec.get("nodeSelector") or {},
        "tolerations": spec.get("tolerations") or [],
        "node_affinity": affinity.get("nodeSelectorTerms") or [],
        "containers": containers,
        "init_containers": init,
        "max_container_gpus": max(container["gpus"] for container in containers + init),
    }


def collect(objects_by_kind, resources):
    """Every GPU workload, sorted by kind, namespace and name."""
    found = []
    for kind, objects in objects_by_kind.items():
        for obj in objects:
            workload = summarize(kind, obj, resources)
            if workload is not None:
                found.append(workload)
    return sorted(found, key=lambda entry: (entry["kind"], entry["namespace"] or "", entry["name"] or ""))


def node_summary(node, resources):
    """{labels, taints, gpu_allocatable} of a Node object."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    gpus = 0
    for resource in resources:
        if resource in allocatable:
            gpus += int(parse_quantity(allocatable[resource], "Node %s allocatable %s" % (node["metadata"].get("name"), resource)))
    return {
        "labels": (node.get("metadata") or {}).get("labels") or {},
        "taints": [{key: taint.get(key) for key in ("key", "value", "effect")} for taint in (node.get("spec") or {}).get("taints") or []],
        "gpu_allocatable": gpus,
    }


# The workload controllers: with the bare pods, what a node's topology check weighs.
CONTROLLER_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")
TOPOLOGY_KEYS = ("gpus", "topology_manager_policy", "topology_manager_scope", "cpu_manager_policy")


def weigh(module, name, entry, workloads=(), node=None):
    """topology_check's result for one node of a module's ``topology`` option (an entry ``topology_entries``
    returned), with the node's labels and taints from its ``node_summary``; errors named as that option."""
    node = node or {}
    try:
        return _topology.check_node(name, entry["gpus"], entry["topology_manager_policy"], entry["topology_manager_scope"],
                                    entry["cpu_manager_policy"], workloads, node.get("labels") or {}, node.get("taints") or [])
    except GpuhardenError as error:
        raise GpuhardenError(str(error).replace("topology_check: option ", "%s: option topology.%s." % (module, name), 1)) from None


def topology_entries(module, topology):
    """A module's ``topology`` option (node name -> gpus and policies) with its defaults; a malformed entry is
    refused here, before the module makes any request."""
    checked = {}
    for name, options in topology.items():
        if not isinstance(options, dict):
            raise GpuhardenError("%s: option topology.%s: expected a dictionary with gpus, got %r" % (module, name, options))
        unknown = sorted(set(options) - set(TOPOLOGY_KEYS))
        if unknown or "gpus" not in options:
            raise GpuhardenError("%s: option topology.%s: %s (it takes %s, gpus required)" % (
                module, name, "unknown keys %s" % ", ".join(unknown) if unknown else "no gpus", ", ".join(TOPOLOGY_KEYS)))
        entry = {"gpus": options["gpus"], "topology_manager_policy": options.get("topology_manager_policy") or None,
                 "topology_manager_scope": options.get("topology_manager_scope") or "container",
                 "cpu_manager_policy": options.get("cpu_manager_policy") or None}
        weigh(module, name, entry)  # the node's own data, checked now
        checked[name] = entry
    return checked
