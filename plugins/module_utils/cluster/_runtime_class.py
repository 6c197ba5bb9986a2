# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The NVIDIA RuntimeClass: validation, the desired object and the audit of existing ones (pure functions), and
``reconcile``, which runs them over an API client for modules runtime_class and gpu_consistency.

The handler must be the containerd runtime name the node side configured (role container_runtime sets the fact
``container_runtime_handler``) and is immutable.  ``overhead.podFixed`` must never hold ``nvidia.com/*`` or any
other extended resource: the RuntimeClass admission plugin copies it into ``pod.spec.overhead``, and
``PodRequests()`` adds overhead to every resource name for the scheduler, kubelet admission and ResourceQuota,
while the device manager binds devices only to containers - a 1-GPU pod costs 2 GPUs, one a phantom.

The RuntimeClass only names the handler; whether containerd on a node has it shows in the Node's
``status.runtimeHandlers`` (see ``node_handler_audit``).
"""

from __future__ import annotations

import json

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin, _disruption, _gpu_pods, _node_labels
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._defaults import NVIDIA_RUNTIME_NAME, RUNTIME_CLASS_NAME
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s_objects, _resources

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
    obj = {"apiVersion": _resources.api_version("RuntimeClass"), "kind": "RuntimeClass",
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


# The options that describe the desired RuntimeClass, as modules runtime_class and gpu_consistency (its runtime_class
# option, the drift check's dry run) take them: one spec, so the two cannot drift apart.
OBJECT_OPTIONS = {
    "name": {"type": "str", "default": RUNTIME_CLASS_NAME},
    "handler": {"type": "str", "default": NVIDIA_RUNTIME_NAME},
    "node_selector": {"type": "dict", "default": {}},
    "tolerations": {"type": "list", "elements": "dict", "default": []},
    "overhead_pod_fixed": {"type": "dict", "default": {}},
}


def check_option(value, option):
    """An option holding OBJECT_OPTIONS and ``nodes`` as one mapping (gpu_consistency's runtime_class): (the desired
    RuntimeClass, the node names to check), every key validated as the runtime_class module's own options are."""
    known = sorted(OBJECT_OPTIONS) + ["nodes"]
    if not isinstance(value, dict):
        raise GpuhardenError("%s must be a mapping of %s, not %r" % (option, ", ".join(known), value))
    unknown = sorted(str(key) for key in set(value) - set(known))
    if unknown:
        raise GpuhardenError("%s has unknown key(s) %s; it takes %s" % (option, ", ".join(unknown), ", ".join(known)))
    names = value.get("nodes") or []
    if not isinstance(names, list) or not all(isinstance(name, str) and name.strip() for name in names):
        raise GpuhardenError("%s.nodes=%r must be a list of node names" % (option, names))
    return check_params({key: spec["default"] if value.get(key) is None else value[key] for key, spec in OBJECT_OPTIONS.items()}), names


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
        managed = name == desired["metadata"]["name"]
        pod_fixed = (rc.get("overhead") or {}).get("podFixed") or {}
        gpu = sorted(key for key in pod_fixed if str(key).startswith(GPU_DOMAIN))
        if gpu:
            findings.append(finding(
                "runtime_class_overhead_gpu", "error", "no nvidia.com/* in overhead.podFixed", {k: pod_fixed[k] for k in gpu},
                "RuntimeClass %s has %s in overhead.podFixed: every pod using it is charged %s more for scheduling "
                "and quota than it gets (phantom GPUs)" % (name, ", ".join(gpu), json.dumps({k: pod_fixed[k] for k in gpu}, sort_keys=True)),
                planned=managed, subject="RuntimeClass %s" % name, repair="replace" if managed else "manual"))
        other = [key for key in extended_overhead(pod_fixed) if key not in gpu]
        if other:
            findings.append(finding(
                "runtime_class_overhead_extended", "warning", "cpu/memory only", {k: pod_fixed[k] for k in other},
                "RuntimeClass %s has extended resource(s) %s in overhead.podFixed" % (name, ", ".join(other)),
                planned=managed, subject="RuntimeClass %s" % name, repair="replace" if managed else "manual"))
        if managed and rc.get("handler") != desired["handler"]:
            # the handler is immutable: only a forced recreate changes it, which no default run does
            findings.append(finding(
                "runtime_class_handler_mismatch", "error", desired["handler"], rc.get("handler"),
                "RuntimeClass %s has handler %r, containerd's runtime is %r: pods using it fail with 'no runtime for "
                "%s is configured'" % (name, rc.get("handler"), desired["handler"], rc.get("handler")),
                planned=False, subject="RuntimeClass %s" % name, repair="recreate (force)"))
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
    return finding("runtime_class_managed_by_other_installer", "warning", "a RuntimeClass gpuharden may change", owner,
                   "RuntimeClass %s is managed by %s (%s): left as it is; the run would have %s it. Fix it there "
                   "(for the GPU Operator: ClusterPolicy spec.operator.runtimeClass and the toolkit settings)"
                   % (name, owner["installer"], owner["name"], decision.get("action")),
                   planned=False, subject="RuntimeClass %s" % name, repair="manual")


# ---------------------------------------------------------------------------------------------
# The handler on the nodes
#
# Upstream facts this relies on (kubernetes v1.36.3, containerd v2.4.2 and v1.7.35):
# - The kubelet copies the handlers of its CRI runtime's Status answer (cri-api pkg/apis/runtime/v1/api.proto
#   StatusResponse.runtime_handlers, read every 5 s by pkg/kubelet/kubelet.go updateRuntimeUp) into Node
#   status.runtimeHandlers: pkg/kubelet/nodestatus/setters.go RuntimeHandlers, installed by
#   pkg/kubelet/kubelet_node_status.go.  The setter runs only with feature gate RecursiveReadOnlyMounts (alpha 1.30,
#   on by default from 1.31, GA 1.33) or UserNamespacesSupport (on by default from 1.33), and the API server drops the
#   field when both are off (pkg/registry/core/node/strategy.go): kubelets before 1.31 do not report it.
# - Each entry is {name, features: {recursiveReadOnlyMounts, userNamespaces}}; name is never omitted and is "" for
#   the runtime's default handler (staging/src/k8s.io/api/core/v1/types.go NodeRuntimeHandler).
# - containerd 2.x reports one entry per configured runtime, and the default runtime twice: under its name and under
#   "" (internal/cri/server/service.go introspectRuntimeHandler).  containerd 1.7 reports none (pkg/cri/server/
#   status.go), the kubelet then sets an empty list, and the API omits it (runtimeHandlers is omitempty): an absent
#   field means "not known" (old kubelet, containerd 1.7, kwok or hollow nodes), never "no handler".
# - A pod whose handler containerd lacks fails at sandbox creation: containerd 2.x internal/cri/config/config.go
#   GetSandboxRuntime and 1.7 pkg/cri/server/sandbox_run.go getSandboxRuntime answer 'no runtime for "<handler>" is
#   configured', which the kubelet reports as event FailedCreatePodSandBox.


def handler_targets(nodes, desired, names=()):
    """The Nodes pods of the RuntimeClass can land on: those matching its scheduling.nodeSelector when it has one,
    else the GPU nodes; with ``names``, only the Nodes so named (taken as GPU nodes: the inventory says so)."""
    selector = (desired.get("scheduling") or {}).get("nodeSelector") or {}
    wanted = set(names or ())
    targets = []
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        if any(labels.get(key) != value for key, value in selector.items()):
            continue
        if wanted:
            if meta.get("name") in wanted:
                targets.append(node)
        # the disruption budget's notion of a GPU node, not _consistency.is_gpu_node: a resource at 0 still counts.
        # The kubelet keeps a device plugin's resource at capacity 0 once the plugin is gone (pkg/kubelet/nodestatus/
        # setters.go MachineInfo), and a plugin that runs with the nvidia runtime goes when containerd loses it.
        elif selector or _disruption._is_gpu_node(node, (GPU_DOMAIN,)):
            targets.append(node)
    return targets


def _handler_names(node):
    """The names in status.runtimeHandlers, or None when the field is absent (the API omits an empty list too)."""
    entries = (node.get("status") or {}).get("runtimeHandlers")
    if not entries:
        return None
    return sorted({str((entry or {}).get("name") or "") for entry in entries})


def _shown(names):
    return ", ".join('"" (the default)' if name == "" else name for name in names) or "none"


def node_handler_audit(nodes, desired, names=()):
    """Findings for the target Nodes whose status.runtimeHandlers lacks the RuntimeClass's handler.

    Returns ``findings`` (``runtime_class_handler_missing_on_node``, one per such Node), ``checked`` (target Nodes
    whose handlers were compared), ``without_runtime_handlers`` (target Nodes that do not report the field: not
    checked, not clean either) and ``not_registered`` (names in ``names`` no Node has).
    """
    handler, rc_name = desired["handler"], desired["metadata"]["name"]
    findings, checked, without = [], [], []
    for node in sorted(handler_targets(nodes, desired, names), key=lambda n: (n.get("metadata") or {}).get("name") or ""):
        name = (node.get("metadata") or {}).get("name")
        have = _handler_names(node)
        if have is None:
            without.append(name)
            continue
        checked.append(name)
        if handler in have:
            continue
        findings.append(finding(
            "runtime_class_handler_missing_on_node", "error", handler, have,
            "Node %s does not report runtime handler %s (its status.runtimeHandlers: %s): containerd there has no "
            "runtime %s, so pods with runtimeClassName %s scheduled there fail at sandbox creation "
            "(FailedCreatePodSandBox: no runtime for \"%s\" is configured). Repair on the node with role "
            "container_runtime (containerd restarted; the kubelet reports the new handler within about 15 s); "
            "rewriting the RuntimeClass does not fix it" % (name, handler, _shown(have), handler, rc_name, handler),
            subject="Node %s" % name, repair="container_runtime"))
    registered = {(node.get("metadata") or {}).get("name") for node in nodes}
    return {"findings": findings, "checked": checked, "without_runtime_handlers": without,
            "not_registered": sorted(set(names or ()) - registered)}


# ---------------------------------------------------------------------------------------------
# The whole check (and, with apply, the write) over an API client: module runtime_class, and gpu_consistency's
# runtime_class option, which runs it in check mode beside its own LISTs (the drift check's dry run, without a module
# run of its own).


def reconcile(client, desired, *, names=(), nodes=None, page_limit=500, force=False, force_conflicts=True, apply=False):
    """Audit every RuntimeClass and the target Nodes' handlers, decide the write (server-side dry run) and, with
    ``apply``, make it.  ``nodes``: the Node objects when the caller has listed them already, else one LIST here.

    Returns (result, decision): the runtime_class module's result (changed, action, findings, runtime_class,
    node_runtime_handlers, message) and ``_k8s_objects.plan``'s decision, for the diff.  A handler that only a
    recreate can change raises GpuhardenError (with the findings) unless ``force``.
    """
    findings = audit(client.list("RuntimeClass", page_limit), desired)
    on_nodes = node_handler_audit(client.list("Node", page_limit) if nodes is None else nodes, desired, names)
    findings.extend(on_nodes.pop("findings"))
    decision = _k8s_objects.plan(client, desired, force_conflicts, handler_immutable)
    foreign = owned_elsewhere(decision)
    if foreign is not None:
        findings.append(foreign)
        decision = dict(decision, action="skip", changed=False, message=foreign["hint"])
    if decision["action"] == "recreate":
        if not force:
            raise GpuhardenError(decision["message"], findings=findings)
        client.delete("RuntimeClass", desired["metadata"]["name"], None, dry_run=True)
    stored = None
    if apply and decision["action"] != "skip":
        stored = _k8s_objects.execute(client, desired, decision, force_conflicts, recreate=force)
    shown = _k8s_objects.comparable(stored if stored is not None else decision["after"] if decision["action"] not in ("none", "skip")
                                    else decision["live"])
    return {"changed": decision["changed"], "action": decision["action"], "findings": findings, "runtime_class": shown,
            "node_runtime_handlers": on_nodes, "message": decision["message"]}, decision


def dry_run(client, option, nodes=None, page_limit=500):
    """The runtime_class module's check mode inside another controller module's run (gpu_consistency for the drift
    check, gpu_pods_info for harden's plan): ``option`` is check_option's (desired, node names), ``nodes`` that module's
    LIST of Nodes or None to list them here.  A refusal (a handler only a recreate can change, a refused request) is
    returned as ``failed``, ``msg`` and the findings so far, not raised: the caller's own result stands."""
    desired, names = option
    try:
        result, _decision = reconcile(client, desired, names=names, nodes=nodes, page_limit=page_limit)
    except GpuhardenError as error:
        return {"failed": True, "msg": str(error), "findings": error.result.get("findings") or [], "api_requests": client.requests,
                "access": error.result.get("access")}
    return dict(result, api_requests=client.requests)
