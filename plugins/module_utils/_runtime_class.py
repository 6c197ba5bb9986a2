# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The NVIDIA RuntimeClass: validation, the desired object and the audit of existing ones (pure functions).

The handler must be the containerd runtime name the node side configured (role container_runtime sets the fact
``container_runtime_handler``) and is immutable.  ``overhead.podFixed`` must never hold ``nvidia.com/*`` or any
other extended resource: the RuntimeClass admission plugin copies it into ``pod.spec.overhead``, and
``PodRequests()`` adds overhead to every resource name for the scheduler, kubelet admission and ResourceQuota,
while the device manager binds devices only to containers - a 1-GPU pod costs 2 GPUs, one a phantom.
"""

from __future__ import annotations

import json

from ansible_collections.gpuharden.k8s.plugins.module_utils import _device_plugin, _gpu_pods, _node_labels
from ansible_collections.gpuharden.k8s.plugins.module_utils._errors import GpuhardenError

GPU_DOMAIN = "nvidia.com/"
NATIVE_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def extended_overhead(pod_fixed):
    """The resource names in a podFixed mapping that are not cpu/memory/ephemeral-storage/hugepages-*."""
    return sorted(name for name in (pod_fixed or {}) if name not in NATIVE_RESOURCES and not str(name).startswith("hugepages-"))


def check_params(params):
    """Validated options: the desired RuntimeClass object."""
    name = _node_labels.check_dns_subdomain(params.get("name"), "runtime_class: option name")
    handler = _node_labels.check_dns_label(params.get("handler"), "runtime_class: option handler (the containerd runtime name)")
    pod_fixed = params.get("overhead_pod_fixed") or {}
    if not isinstance(pod_fixed, dict):
        raise GpuhardenError("runtime_class: option overhead_pod_fixed must be a mapping of resource names to quantities")
    gpu = sorted(key for key in pod_fixed if str(key).startswith(GPU_DOMAIN))
    if gpu:
        raise GpuhardenError(
            "runtime_class: option overhead_pod_fixed names %s: the RuntimeClass admission plugin copies podFixed into every "
            "pod's overhead, and the scheduler, kubelet admission and ResourceQuota add overhead to each resource, while "
            "devices go only to containers: every pod would be charged phantom GPUs (a 1-GPU pod counts as 2). Keep "
            "podFixed to cpu and memory" % ", ".join(gpu))
    other = extended_overhead(pod_fixed)
    if other:
        raise GpuhardenError("runtime_class: option overhead_pod_fixed names extended resource(s) %s; only cpu, memory, "
                             "ephemeral-storage and hugepages-* belong in a pod's fixed overhead" % ", ".join(other))
    quantities = {}
    for key, value in pod_fixed.items():
        _gpu_pods.parse_quantity(value, "runtime_class: option overhead_pod_fixed.%s" % key)
        quantities[key] = str(value)
    node_selector = _node_labels.check_labels(params.get("node_selector"), "runtime_class: option node_selector")
    tolerations = _node_labels.check_tolerations(params.get("tolerations"), "runtime_class: option tolerations")
    obj = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
           "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpuharden"}}, "handler": handler}
    if quantities:
        obj["overhead"] = {"podFixed": quantities}
    if node_selector or tolerations:
        obj["scheduling"] = {}
        if node_selector:
            obj["scheduling"]["nodeSelector"] = node_selector
        if tolerations:
            obj["scheduling"]["tolerations"] = tolerations
    return obj


def handler_immutable(live, desired):
    """A message when the live handler differs: the field is immutable, so delete + create (force) is needed."""
    if live.get("handler") != desired["handler"]:
        return ("runtime_class: RuntimeClass %s has handler %r but containerd's runtime is %r; handler is immutable, so the "
                "RuntimeClass must be deleted and created again: run with force=true to do that (pods already admitted keep "
                "running; new pods with runtimeClassName %s are refused while it is missing)"
                % (desired["metadata"]["name"], live.get("handler"), desired["handler"], desired["metadata"]["name"]))
    return None


def audit(runtime_classes, desired):
    """Findings about every RuntimeClass: GPUs in podFixed, and the managed one's handler."""
    findings = []
    for rc in sorted(runtime_classes, key=lambda r: (r.get("metadata") or {}).get("name") or ""):
        name = (rc.get("metadata") or {}).get("name")
        pod_fixed = (rc.get("overhead") or {}).get("podFixed") or {}
        gpu = sorted(key for key in pod_fixed if str(key).startswith(GPU_DOMAIN))
        if gpu:
            findings.append({
                "id": "runtime_class_overhead_gpu", "severity": "error", "object": "RuntimeClass %s" % name,
                "message": "RuntimeClass %s has %s in overhead.podFixed: every pod using it is charged %s more for scheduling "
                           "and quota than it gets (phantom GPUs)" % (name, ", ".join(gpu), json.dumps({k: pod_fixed[k] for k in gpu}, sort_keys=True)),
                "expected": "no nvidia.com/* in overhead.podFixed", "actual": {k: pod_fixed[k] for k in gpu},
                "repair": "replace" if name == desired["metadata"]["name"] else "manual"})
        other = [key for key in extended_overhead(pod_fixed) if key not in gpu]
        if other:
            findings.append({
                "id": "runtime_class_overhead_extended", "severity": "warning", "object": "RuntimeClass %s" % name,
                "message": "RuntimeClass %s has extended resource(s) %s in overhead.podFixed" % (name, ", ".join(other)),
                "expected": "cpu/memory only", "actual": {k: pod_fixed[k] for k in other},
                "repair": "replace" if name == desired["metadata"]["name"] else "manual"})
        if name == desired["metadata"]["name"] and rc.get("handler") != desired["handler"]:
            findings.append({
                "id": "runtime_class_handler_mismatch", "severity": "error", "object": "RuntimeClass %s" % name,
                "message": "RuntimeClass %s has handler %r, containerd's runtime is %r: pods using it fail with 'no runtime for "
                           "%s is configured'" % (name, rc.get("handler"), desired["handler"], rc.get("handler")),
                "expected": desired["handler"], "actual": rc.get("handler"), "repair": "recreate (force)"})
    return findings


def owned_elsewhere(decision):
    """A finding when the write would change a RuntimeClass another installer manages, else None.

    The GPU Operator creates RuntimeClass ``nvidia`` with a controller reference to its ClusterPolicy and puts back
    whatever is changed or deleted (NVIDIA/gpu-operator controllers/object_controls.go); Helm and GitOps tools do the
    same at their next sync.  Such an object is reported with where to fix it, never rewritten or recreated.
    """
    live = decision.get("live")
    if not live or not decision.get("changed"):
        return None
    owner = _device_plugin.installer_of(live)
    if owner is None:
        return None
    name = (live.get("metadata") or {}).get("name")
    return {"id": "runtime_class_managed_by_other_installer", "severity": "warning", "object": "RuntimeClass %s" % name,
            "message": "RuntimeClass %s is managed by %s (%s): left as it is; the run would have %s it. Fix it there "
                       "(for the GPU Operator: ClusterPolicy spec.operator.runtimeClass and the toolkit settings)"
                       % (name, owner["installer"], owner["name"], decision.get("action")),
            "expected": "a RuntimeClass gpuharden may change", "actual": owner, "repair": "manual"}
