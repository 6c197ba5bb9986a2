# SPDX-License-Identifier: GPL-3.0-or-later
"""The cause rules of `gpuharden explain`, as data: one table (POD_RULES, NODE_RULES), read in order, first match wins.

A rule is ``Rule(id, target, needs, needs_node_trip, finding_id, verdict, fix, predicate)``:

- ``needs``: the evidence it reads (EVIDENCE's names); explain gathers each one the first time a rule needs it, so a
  rule early in the table that fires saves every read a later rule would make (a Pending pod with a misspelled
  resource costs the pod and one LIST of Nodes, and no node trip);
- ``needs_node_trip``: the rule reads the node itself (the evidence "node_audit": one drift check of the pod's node,
  or a drift report's audit of it).  POD_RULES and NODE_RULES are cluster-side (False) and are weighed first;
  NODE_SIDE_POD_RULES and NODE_SIDE_NODE_RULES (the device program, another pod's GPU, a pod without a request that
  can open GPUs, GPU health, device permissions, NVML, stale checkpoints) only once they have found nothing;
- ``finding_id``: the findings catalogue's id the cause is (plugins/module_utils/core/_findings.py), or None where
  the cause is not a finding of any check (a full cluster, a workload's own choice);
- ``verdict``: the one-line cause, a %-template over the predicate's values; ``fix``: the fix lines, templates too;
- ``predicate(facts)``: None (does not fire) or ``(values, evidence)``: the template's values and the evidence that
  shows the cause, each ``{what, where, value}`` with where it was read.

The predicates judge with the collection's own code (gpu_consistency's resource names, the device plugin's pod
finder, node_maintenance's cordon record): explain adds causes on top of the checks drift runs, never a second
audit.  Each rule has a unit test that fires it and one that must not (tests/unit/test_explain.py).
"""

from __future__ import annotations

import collections
import difflib

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency, _device_plugin, _drain, _gpu_pods, _topology
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._defaults import NVIDIA_RUNTIME_NAME
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import SEVERITIES

HARDEN = "ansible-playbook -i INVENTORY gpuharden.k8s.harden_gpu_nodes"
# what explain can read, each at most once per run
EVIDENCE = ("pod", "nodes", "plugin_pods", "events", "node", "node_audit")
# Reasons the kubelet sets on a pod it rejects at admission (k8s.io/kubernetes v1.36.3: pkg/kubelet/cm/topologymanager
# scope_container.go/scope_pod.go TopologyAffinityError; pkg/kubelet/lifecycle/predicate.go UnexpectedAdmissionError,
# a device plugin's Allocate that failed among others); the pod ends in phase Failed with that status.reason.
ADMISSION_REASONS = ("TopologyAffinityError", "UnexpectedAdmissionError")
# The scheduler's words for a node without enough of a resource (k8s.io/kubernetes v1.36.3
# pkg/scheduler/framework/plugins/noderesources/fit.go: "Insufficient %v").
INSUFFICIENT = "Insufficient %s"
# Waiting reasons of a container that keeps failing (kubelet: pkg/kubelet/images and kuberuntime)
FAILING_WAITING = ("CrashLoopBackOff", "CreateContainerError", "RunContainerError", "CreateContainerConfigError",
                   "ImagePullBackOff", "ErrImagePull")

Rule = collections.namedtuple("Rule", "id target needs needs_node_trip finding_id verdict fix predicate")


def item(what, where, value):
    return {"what": what, "where": where, "value": value}


def pod_ref(pod):
    meta = pod.get("metadata") or {}
    return "%s/%s" % (meta.get("namespace"), meta.get("name"))


def node_name(node):
    return (node.get("metadata") or {}).get("name")


def requested(pod):
    """{resource: value} of the GPU-like names the pod's containers request or limit (gpu_consistency's notion)."""
    names = _consistency._requested_gpu_names(pod)
    found = {}
    for container in ((pod.get("spec") or {}).get("containers") or []) + ((pod.get("spec") or {}).get("initContainers") or []):
        resources = (container or {}).get("resources") or {}
        for kind in ("limits", "requests"):
            for name, value in (resources.get(kind) or {}).items():
                if name in names:
                    found.setdefault(name, str(value))
    return found


def requested_item(pod):
    return item("GPU resources requested", "pod %s spec.containers[].resources" % pod_ref(pod), requested(pod))


def is_gpu_pod(pod, runtime_classes=("nvidia",)):
    return bool(requested(pod)) or (pod.get("spec") or {}).get("runtimeClassName") in runtime_classes


def advertised(nodes):
    """{resource: allocatable summed over ``nodes``} of the GPU-like resources any of them has in capacity or allocatable."""
    totals = {}
    for node in nodes:
        status = node.get("status") or {}
        for field in ("capacity", "allocatable"):
            for name in status.get(field) or {}:
                if _consistency._gpu_like(str(name)):
                    totals.setdefault(str(name), 0)
        for name, value in (status.get("allocatable") or {}).items():
            if _consistency._gpu_like(str(name)):
                try:
                    totals[str(name)] += int(_gpu_pods.parse_quantity(value, "node %s status.allocatable[%s]" % (node_name(node), name)))
                except GpuhardenError:  # an unreadable quantity counts as none advertised
                    pass
    return totals


def offered(nodes):
    """The GPU-like names ``nodes`` have a non-zero allocatable of (a name at 0 is a plugin that registered no device)."""
    return {name for name, count in advertised(nodes).items() if count > 0}


def _selector_terms(pod):
    """The pod's nodeSelector and required node affinity, as _topology.can_land weighs a workload's (no taints: a node
    that taints the pod away is gpu_nodes_unschedulable's question)."""
    spec = pod.get("spec") or {}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    return {"node_name": None, "node_selector": {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
            "node_affinity": [term for term in required.get("nodeSelectorTerms") or [] if isinstance(term, dict)], "tolerations": []}


def selected(pod):
    return bool(_selector_terms(pod)["node_selector"] or _selector_terms(pod)["node_affinity"])


def scope_nodes(facts):
    """The nodes the pod can use: its own once bound, else those its nodeSelector and required node affinity select
    (every node where it has none): a pod pinned to one node asks that node's plugin, not the fleet's."""
    bound = (facts.pod.get("spec") or {}).get("nodeName")
    if bound:
        return [node for node in facts.nodes if node_name(node) == bound]
    terms = _selector_terms(facts.pod)
    return [node for node in facts.nodes if _topology.can_land(terms, node_name(node), (node.get("metadata") or {}).get("labels") or {}, ())]


def scope_text(facts):
    bound = (facts.pod.get("spec") or {}).get("nodeName")
    if bound:
        return "node %s" % bound
    if selected(facts.pod):
        names = sorted(node_name(node) for node in scope_nodes(facts))
        return "the node(s) its selector picks (%s)" % (", ".join(names[:3]) + (", ..." if len(names) > 3 else "") if names else "none")
    return "any node"


def advertised_item(facts, nodes=None):
    nodes = scope_nodes(facts) if nodes is None else nodes
    where = "node %s status.allocatable" % node_name(nodes[0]) if len(nodes) == 1 else "%d nodes' status.allocatable" % len(nodes)
    return item("GPU resources advertised", where, advertised(nodes))


def pending(pod):
    return (pod.get("status") or {}).get("phase") == "Pending" and not (pod.get("spec") or {}).get("nodeName")


def scheduled_condition(pod):
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return condition
    return None


# ---------------------------------------------------------------------------------------------------------------
# The device plugin's pods


def ready(pod):
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def plugin_status(pod):
    """The plugin container's status in a plugin pod (the container _device_plugin.plugin_container names), or {}."""
    container = _device_plugin.plugin_container(pod.get("spec") or {}) or {}
    for entry in (pod.get("status") or {}).get("containerStatuses") or []:
        if entry.get("name") == container.get("name"):
            return entry
    return {}


def plugin_trouble(pod, advertising=True):
    """Why a plugin pod does not serve (None when it is Ready): {state, restarts, message}.  ``advertising`` False: its
    node advertises none of the plugin's names, so a plugin that last exited with an error and runs again is caught
    between two restarts (the real plugin has no readiness probe: the kubelet reports it Ready for the second it runs
    before it exits again, k8s-device-plugin v0.18.2 cmd/nvidia-device-plugin/main.go)."""
    status = plugin_status(pod)
    waiting = (status.get("state") or {}).get("waiting") or {}
    last = (status.get("lastState") or {}).get("terminated") or {}
    restarts = int(status.get("restartCount") or 0)
    if ready(pod) and not waiting and (advertising or not restarts or not last.get("exitCode")):
        return None
    if not waiting and last.get("exitCode"):
        waiting = {"reason": "restarting after exit code %s" % last["exitCode"]}
    state = waiting.get("reason") or (pod.get("status") or {}).get("phase") or "not ready"
    message = last.get("message") or waiting.get("message") or last.get("reason")
    return {"state": state, "restarts": restarts, "message": (message or "").strip() or None}


def plugin_pods_on(facts, name):
    return [pod for pod in facts.plugin_pods if (pod.get("spec") or {}).get("nodeName") == name
            and not (pod.get("metadata") or {}).get("deletionTimestamp")]


def plugin_nodes(facts):
    """The nodes the pod's plugin question is about: its own once bound, else the GPU nodes (label or capacity)."""
    nodes = scope_nodes(facts)
    if (facts.pod.get("spec") or {}).get("nodeName"):
        return nodes
    return [node for node in nodes if _consistency.is_gpu_node(node, "nvidia.com/gpu.present")]


def missing_plugin_names(facts):
    """The requested names of the device plugin's own forms of which the pod's scope advertises none."""
    have = offered(scope_nodes(facts))
    return sorted(name for name in requested(facts.pod) if name not in have and _consistency._plugin_missing(name, have))


def _plugin_evidence(facts, nodes):
    evidence = [requested_item(facts.pod), advertised_item(facts)]
    for node in nodes:
        for pod in plugin_pods_on(facts, node_name(node)):
            trouble = plugin_trouble(pod)
            evidence.append(item("device plugin pod on %s" % node_name(node), "pod %s status.containerStatuses" % pod_ref(pod),
                                 trouble or {"state": "Running", "ready": True}))
    return evidence


def no_plugin(facts):
    names = missing_plugin_names(facts)
    nodes = plugin_nodes(facts)
    if not names or any(plugin_pods_on(facts, node_name(node)) for node in nodes):
        return None
    where = ", ".join(sorted(node_name(node) for node in nodes)[:5]) or "no node labelled or advertising a GPU"
    evidence = [requested_item(facts.pod), advertised_item(facts),
                item("device plugin pods", "pods of the device plugin DaemonSets (spec.nodeName)", "none on %s" % where)]
    limit = " -l %s" % node_name(nodes[0]) if len(nodes) == 1 else ""
    return {"resource": names[0], "scope": scope_text(facts), "limit": limit}, evidence


# What the real plugin says when it got no NVML (k8s-device-plugin v0.18.2 internal/rm/factory.go: "Incompatible
# strategy detected auto", "did you configure the NVIDIA Container Toolkit?"; NVML's own "failed to initialize NVML").
NO_NVML_WORDS = ("nvml", "incompatible strategy", "nvidia container toolkit")
NVIDIA_HANDLER = NVIDIA_RUNTIME_NAME  # containerd's runtime the collection writes (core/_defaults.py)


def runtime_handlers(node):
    """The runtime handlers the node's containerd reports (containerd 2.x: every configured runtime, the default one
    also as "", internal/cri/server/service.go introspectRuntimeHandler), or None where it reports none (1.7)."""
    handlers = (node.get("status") or {}).get("runtimeHandlers")
    return None if not handlers else sorted(str(entry.get("name") or "") for entry in handlers)


def no_nvml(pod, node, trouble):
    """Why the plugin pod on ``node`` gets no NVML, read from the cluster, or None: its own words, else a pod that
    names no RuntimeClass (the NVIDIA runtime only where it is containerd's default) on a node whose containerd reports
    no nvidia runtime.  The real plugin's termination message is empty (terminationMessagePolicy File): its words
    are in its log, which explain does not read."""
    message = (trouble["message"] or "").lower()
    if any(word in message for word in NO_NVML_WORDS):
        return trouble["message"].splitlines()[-1][:200]
    handlers = runtime_handlers(node)
    container = _device_plugin.plugin_container(pod.get("spec") or {}) or {}
    privileged = (container.get("securityContext") or {}).get("privileged")
    runtime_class = (pod.get("spec") or {}).get("runtimeClassName")
    if handlers is not None and NVIDIA_HANDLER not in handlers and not privileged:
        return "%s's containerd has no nvidia runtime (runtime handlers %s)%s: the plugin gets no NVML" % (
            node_name(node), ", ".join(repr(h) for h in handlers), "" if runtime_class else " and the plugin pod names no RuntimeClass")
    return None


def _plugin_failure(facts, node, pod, trouble):
    """The values a failing plugin's verdict and fix share (pod and node rules)."""
    nvml = no_nvml(pod, node, trouble)
    because = nvml or (trouble["message"].splitlines()[-1][:200] if trouble["message"] else "")
    return {"plugin": pod_ref(pod), "node": node_name(node), "state": trouble["state"], "restarts": trouble["restarts"],
            "because": (" (%s)" % because) if because else "",
            "stages": "container_runtime,runtime_class,device_plugin" if nvml else "device_plugin"}


def plugin_failing(facts):
    names = missing_plugin_names(facts)
    if not names:
        return None
    failing = [(node, pod, plugin_trouble(pod, advertising=False)) for node in plugin_nodes(facts) for pod in plugin_pods_on(facts, node_name(node))]
    failing = [entry for entry in failing if entry[2]]
    if not failing:
        return None
    node, pod, trouble = failing[0]
    evidence = _plugin_evidence(facts, [node])
    evidence.append(item("runtime handlers of %s" % node_name(node), "node %s status.runtimeHandlers" % node_name(node), runtime_handlers(node)))
    evidence.append(item("plugin pod RuntimeClass", "pod %s spec.runtimeClassName" % pod_ref(pod), (pod.get("spec") or {}).get("runtimeClassName")))
    return dict(_plugin_failure(facts, node, pod, trouble), resource=names[0]), evidence


def _mig_names(names):
    return sorted(name for name in names if name.startswith(_consistency.MIG_PREFIX))


def mig_mismatch(facts):
    have = offered(scope_nodes(facts))
    asked = requested(facts.pod)
    for name in sorted(asked):
        base = name[:-len(".shared")] if name.endswith(".shared") else name
        if base in have or name in have:
            continue
        mig_have = _mig_names(have)
        if base.startswith(_consistency.MIG_PREFIX) and (mig_have or _consistency.GPU in have):
            if mig_have:
                close = difflib.get_close_matches(base, mig_have, n=1, cutoff=0.0)
                why = "the profile is not in the MIG layout, which has %s" % ", ".join(mig_have)
                change = "request %s, the closest profile the layout has" % close[0]
            else:
                they = "it advertises" if (facts.pod.get("spec") or {}).get("nodeName") else "they advertise"
                why = "%s %s only: the device plugin runs migStrategy none or single, not mixed" % (they, _consistency.GPU)
                change = "request %s (what migStrategy none and single advertise a GPU, or a MIG device under single, as)" % _consistency.GPU
            return ({"resource": name, "scope": scope_text(facts), "why": why, "change": change},
                    [requested_item(facts.pod), advertised_item(facts)])
        if base == _consistency.GPU and mig_have and not (set(have) & {_consistency.GPU, _consistency.SHARED}):
            return ({"resource": name, "scope": scope_text(facts),
                     "why": "its GPUs are MIG-partitioned under migStrategy mixed, advertised as %s" % ", ".join(mig_have),
                     "change": "request one of %s, or set device_plugin_mig_strategy: single" % ", ".join(mig_have)},
                    [requested_item(facts.pod), advertised_item(facts)])
    return None


def not_advertised(facts):
    bound = (facts.pod.get("spec") or {}).get("nodeName")
    found = _consistency._requested_not_advertised(facts.nodes, [facts.pod], {bound} if bound else set())
    if not found:
        return None
    entry = found[0]["found"]
    close = entry.get("close_match")
    # gpu_consistency weighs the name against nvidia.com/gpu where no node advertises a GPU resource yet
    names = advertised(facts.nodes)
    closest = ""
    if close:
        closest = "; did you mean %s? (%s)" % (close, "the closest name a node advertises" if close in names else
                                               "the NVIDIA device plugin's name; no node advertises a GPU resource yet")
    return ({"resource": entry["resource"], "closest": closest,
             "change": "request %s instead" % close if close else "request a resource the device plugin advertises"},
            [requested_item(facts.pod), item("GPU resources advertised", "every node's status.capacity and status.allocatable",
                                             sorted(advertised(facts.nodes)))])


def container_gpus(pod):
    """_topology's workload of the pod: {containers, init_containers} with each container's GPUs (the GPU-like names it
    limits or requests, summed; an extended resource's request equals its limit) and whether it is a sidecar."""
    spec = pod.get("spec") or {}
    names = _consistency._requested_gpu_names(pod)

    def count(container):
        resources = (container or {}).get("resources") or {}
        asked = dict(resources.get("requests") or {}, **(resources.get("limits") or {}))
        total = 0
        for name in names & set(asked):
            try:
                total += int(_gpu_pods.parse_quantity(asked[name], "pod %s container %s" % (pod_ref(pod), container.get("name"))))
            except GpuhardenError:  # the API server validated it; an unreadable quantity counts as none
                pass
        return total

    return {"containers": [{"name": c.get("name"), "gpus": count(c), "sidecar": False} for c in spec.get("containers") or []],
            "init_containers": [{"name": c.get("name"), "gpus": count(c), "sidecar": c.get("restartPolicy") == "Always"}
                                for c in spec.get("initContainers") or []]}


# The kubelet_topology stage's settings (roles/kubelet_topology/defaults/main.yml)
POLICY_VAR, SCOPE_VAR = "kubelet_topology_topology_manager_policy", "kubelet_topology_topology_manager_scope"


def admitting_settings(pod):
    """What the cluster side can tell of a TopologyAffinityError, from the pod alone (no Node carries its GPUs' NUMA
    layout: neither gpuharden nor the device plugin labels it, and the kubelet's policy is read only on the node):
    (why, [(setting, when it admits the pod, -e assignment)]), the settings that admit the pod, the surest last.

    The kubelet v1.36.3 (pkg/kubelet/cm/topologymanager) rejects with TopologyAffinityError only under restricted and
    single-numa-node (policy_restricted.go, policy_single_numa_node.go: canAdmitPodResult is the merged hint's
    Preferred; policy_best_effort.go and policy_none.go admit every pod).  single-numa-node keeps only hints of one
    NUMA node; restricted also takes the fewest NUMA nodes that hold the request (devicemanager/topology_hints.go marks
    those hints preferred).  The unit it aligns is each container alone under scope container (scope_container.go
    Admit) and the whole pod under scope pod (scope_pod.go)."""
    workload = container_gpus(pod)
    units = _topology.aligned_units(workload, "container")
    largest_name, largest = max(units, key=lambda unit: unit[1]) if units else (None, 0)
    total = _topology.pod_gpus(workload)
    settings = []
    if total > largest:
        why = "its containers ask for %d GPUs together (%s %d at most)" % (total, largest_name, largest)
        settings.append(("topologyManagerScope: container", "where the kubelet runs scope pod: each container's GPUs then need to fit one "
                         "NUMA node alone, not the pod's %d" % total, "%s=container" % SCOPE_VAR))
    else:
        why = "container %s asks for %d GPU%s" % (largest_name, largest, "" if largest == 1 else "s")
    if largest > 1:
        settings.append(("topologyManagerPolicy: restricted", "where the kubelet runs single-numa-node: it admits %d GPUs from the fewest "
                         "NUMA nodes that hold them, single-numa-node only from one" % largest, "%s=restricted" % POLICY_VAR))
    else:
        why += ", which one NUMA node holds: the exclusive CPUs or memory it asks for, or the free GPUs, are on another NUMA node"
    settings.append(("topologyManagerPolicy: best-effort", "it admits every pod and aligns where it can", "%s=best-effort" % POLICY_VAR))
    return why, settings


def admission_rejected(facts):
    status = facts.pod.get("status") or {}
    reason = status.get("reason")
    if reason not in ADMISSION_REASONS:
        return None
    node = (facts.pod.get("spec") or {}).get("nodeName") or "its node"
    message = (status.get("message") or "").strip()
    evidence = [item("pod status", "pod %s status.phase/reason/message" % pod_ref(facts.pod),
                     {"phase": status.get("phase"), "reason": reason, "message": message or None}), requested_item(facts.pod)]
    if reason == "TopologyAffinityError":
        why, settings = admitting_settings(facts.pod)
        why = "; %s, which its Topology Manager (restricted or single-numa-node, the policies that refuse) could not align: %s admits it" % (
            why, " or ".join(setting for setting, _when, _assignment in settings))
        change = "run the kubelet_topology stage with a setting that admits it, or ask for GPUs that fit one NUMA node of %s: %s" % (
            node, "; ".join("%s, %s: %s --tags kubelet_topology -l %s -e %s" % (setting, when, HARDEN, node, assignment)
                            for setting, when, assignment in settings))
        evidence.append(item("GPUs per container", "pod %s spec.containers[].resources, spec.initContainers[].resources" % pod_ref(facts.pod),
                             {unit: count for unit, count in _topology.aligned_units(container_gpus(facts.pod), "container") if count}))
    else:
        why = ""
        change = "read the message: a device plugin Allocate that failed points at the device_plugin stage on %s" % node
    return ({"reason": reason, "node": node, "message": (" (%s)" % message[:200]) if message else "", "why": why, "change": change}, evidence)


def all_allocated(facts):
    if not pending(facts.pod):
        return None
    condition = scheduled_condition(facts.pod) or {}
    words = " ".join([condition.get("message") or ""] + [event.get("message") or "" for event in facts.events
                                                           if event.get("reason") == "FailedScheduling"])
    # the nodes the pod may land on: where every node that offers its GPUs refuses it, the "Insufficient" the
    # scheduler reports is other nodes' (gpu_nodes_unschedulable's case)
    open_nodes = [node for node in facts.nodes if not blocked_by(facts.pod, node)]
    have = advertised(open_nodes)
    for name in sorted(requested(facts.pod)):
        if have.get(name) and INSUFFICIENT % name in words:
            return ({"resource": name, "total": have[name], "count": sum(1 for node in open_nodes if advertised([node]).get(name))},
                    [requested_item(facts.pod), item("scheduler", "pod %s status.conditions[PodScheduled] and FailedScheduling events"
                                                     % pod_ref(facts.pod), (condition.get("message") or "").strip() or None),
                     item("GPU resources advertised", "every node's status.allocatable", {name: have[name]})])
    return None


# gpuharden's own taints: the bootstrap taint a joining GPU node registers with (playbooks/bootstrap_gpu_node.yml,
# gpuharden_bootstrap_taint_key default gpuharden.io/bootstrap), which the bootstrap removes once the node is ready.
OWN_TAINT_PREFIX = "gpuharden.io/"


def blocked_by(pod, node):
    """Why ``pod`` cannot land on ``node``: ("bootstrap", taint) / ("cordon", record) / ("taint", taint) or None.  A
    node that registers with gpuharden's bootstrap taint also registers unschedulable: the taint names the cause."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    blocking = [taint for taint in (node.get("spec") or {}).get("taints") or []
                if taint.get("effect") in ("NoSchedule", "NoExecute") and not _device_plugin._tolerates(tolerations, taint)]
    own = [taint for taint in blocking if str(taint.get("key") or "").startswith(OWN_TAINT_PREFIX)]
    if own:
        return "bootstrap", own[0]
    state = _drain.cordon_state(node)
    if state["unschedulable"]:
        return "cordon", state["record"]
    return ("taint", blocking[0]) if blocking else None


def describe_block(node, block):
    kind, value = block
    if kind == "bootstrap":
        return "tainted %s=%s:%s by gpuharden's bootstrap: the node is not bootstrapped yet" % (value.get("key"), value.get("value") or "", value.get("effect"))
    if kind == "cordon":
        return ("cordoned by gpuharden, run %s" % _drain.describe_record(value)) if value else "cordoned by someone else (no gpuharden.io/cordon record)"
    return "tainted %s=%s:%s by someone else (gpuharden sets no taint)" % (value.get("key"), value.get("value") or "", value.get("effect"))


def _block_values(blocked):
    ours = [node for node, block in blocked if block[0] == "cordon" and block[1]]
    joining = [node for node, block in blocked if block[0] == "bootstrap"]
    text = "; ".join("%s %s" % (node_name(node), describe_block(node, block)) for node, block in blocked[:3])
    fixes = []
    if joining:
        fixes.append("ansible-playbook -i INVENTORY gpuharden.k8s.bootstrap_gpu_node -l %s (the bootstrap removes its taint once the node "
                     "passes its checks)" % ",".join(node_name(n) for n in joining))
    if ours:
        fixes.append("%s -l %s (a harden run resumes or releases the cordon an ended run left)" % (HARDEN, ",".join(node_name(n) for n in ours)))
    fix = "; ".join(fixes) or "ask whoever cordoned or tainted the node (kubectl uncordon, kubectl taint), or add a toleration to the workload"
    # the catalogue's finding only for a cordon gpuharden's own record names; another's cordon or taint is no finding
    return {"blocked": text, "fix": fix, "_finding": "node_left_cordoned" if ours else None}


def _block_evidence(blocked):
    return [item("node %s" % node_name(node), "node %s spec.unschedulable, spec.taints, metadata.annotations[gpuharden.io/cordon]"
                 % node_name(node), {"unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
                                     "taints": (node.get("spec") or {}).get("taints") or [],
                                     "gpuharden.io/cordon": ((node.get("metadata") or {}).get("annotations") or {}).get(_drain.CORDON_ANNOTATION)})
            for node, _block in blocked[:3]]


def gpu_nodes_blocked(facts):
    if not pending(facts.pod):
        return None
    asked = set(requested(facts.pod))
    offering = [node for node in facts.nodes if any(advertised([node]).get(name) for name in asked)] if asked else \
        [node for node in facts.nodes if _consistency.is_gpu_node(node, "nvidia.com/gpu.present")]
    blocked = [(node, blocked_by(facts.pod, node)) for node in offering]
    if not offering or not all(block for _node, block in blocked):
        return None
    values = _block_values(blocked)
    values["count"] = len(blocked)
    return values, [requested_item(facts.pod)] + _block_evidence(blocked)


# ---------------------------------------------------------------------------------------------------------------
# Node rules (explain node NAME)


def node_blocked(facts):
    block = blocked_by({}, facts.node)
    if not block:
        return None
    return _block_values([(facts.node, block)]), _block_evidence([(facts.node, block)])


def _node_plugin_question(facts):
    """(the node's GPU resources, whether it is a GPU node) for the node rules."""
    return advertised([facts.node]), _consistency.is_gpu_node(facts.node, "nvidia.com/gpu.present")


def node_no_plugin(facts):
    have, gpu_node = _node_plugin_question(facts)
    if not gpu_node or plugin_pods_on(facts, node_name(facts.node)):
        return None
    return ({"node": node_name(facts.node)},
            [item("GPU resources advertised", "node %s status.allocatable" % node_name(facts.node), have),
             item("device plugin pods", "pods of the device plugin DaemonSets (spec.nodeName)", "none on %s" % node_name(facts.node))])


def node_plugin_failing(facts):
    have, gpu_node = _node_plugin_question(facts)
    troubled = [(pod, plugin_trouble(pod, advertising=any(have.values()))) for pod in plugin_pods_on(facts, node_name(facts.node))]
    troubled = [entry for entry in troubled if entry[1]]
    if not gpu_node or not troubled:
        return None
    pod, trouble = troubled[0]
    return (_plugin_failure(facts, facts.node, pod, trouble),
            [item("device plugin pod on %s" % node_name(facts.node), "pod %s status.containerStatuses" % pod_ref(pod), trouble),
             item("runtime handlers of %s" % node_name(facts.node), "node %s status.runtimeHandlers" % node_name(facts.node),
                  runtime_handlers(facts.node))])


PLUGIN_FIX = ("%s --tags %%(stages)s -l %%(node)s   (the NVIDIA runtime in containerd, the RuntimeClass, then the plugin)" % HARDEN,
              "then: gpuharden explain node %(node)s")

POD_RULES = (
    Rule("mig_strategy_mismatch", "pod", ("pod", "nodes"), False, "mig_not_advertised",
         "requests %(resource)s, not advertised on %(scope)s: %(why)s",
         ("change the workload: %(change)s",
          "or the node: %s --tags device_plugin -e gpuharden_mig_strategy=mixed (the device_plugin stage applies "
          "device_plugin_mig_strategy), or --tags mig with gpuharden_mig_layout for another MIG layout" % HARDEN),
         mig_mismatch),
    Rule("resource_not_advertised", "pod", ("pod", "nodes"), False, "requested_resource_not_advertised",
         "requests %(resource)s, which no node advertises%(closest)s",
         ("change the workload: %(change)s (the NVIDIA device plugin advertises nvidia.com/gpu and nvidia.com/mig-<profile>)",),
         not_advertised),
    Rule("no_device_plugin", "pod", ("pod", "nodes", "plugin_pods"), False, "gpu_not_advertised",
         "requests %(resource)s, but no device plugin runs on %(scope)s: nothing advertises it",
         ("deploy the device plugin: %s --tags device_plugin%%(limit)s" % HARDEN,),
         no_plugin),
    Rule("device_plugin_failing", "pod", ("pod", "nodes", "plugin_pods"), False, "gpu_not_advertised",
         "requests %(resource)s, but the device plugin on %(node)s is %(state)s (%(restarts)d restarts)%(because)s",
         ("%s --tags %%(stages)s -l %%(node)s   (an NVML error: the NVIDIA runtime in containerd and the RuntimeClass first)" % HARDEN,
          "then: gpuharden explain pod again"),
         plugin_failing),
    Rule("admission_rejected", "pod", ("pod",), False, None,
         "the kubelet on %(node)s rejected the pod at admission: %(reason)s%(message)s%(why)s",
         ("%(change)s", "then recreate the pod (a pod the kubelet rejected stays Failed)"),
         admission_rejected),
    Rule("gpus_all_allocated", "pod", ("pod", "nodes", "events"), False, None,
         "every GPU of %(resource)s is allocated: the scheduler reports Insufficient %(resource)s "
         "(%(count)d node(s) advertise %(total)d in all)",
         ("wait for GPU pods to end, free GPUs, add GPU nodes, or request fewer %(resource)s",
          "kubectl describe nodes shows each node's Allocated resources"),
         all_allocated),
    Rule("gpu_nodes_unschedulable", "pod", ("pod", "nodes"), False, "node_left_cordoned",
         "every node that offers its GPUs (%(count)d) refuses new pods: %(blocked)s",
         ("%(fix)s",),
         gpu_nodes_blocked),
)

NODE_RULES = (
    Rule("node_unschedulable", "node", ("node",), False, "node_left_cordoned", "node %(blocked)s", ("%(fix)s",), node_blocked),
    Rule("node_no_device_plugin", "node", ("node", "plugin_pods"), False, "gpu_not_advertised",
         "no device plugin pod runs on %(node)s: its GPUs are not advertised",
         ("deploy the device plugin: %s --tags device_plugin -l %%(node)s" % HARDEN,), node_no_plugin),
    Rule("node_device_plugin_failing", "node", ("node", "plugin_pods"), False, "gpu_not_advertised",
         "the device plugin on %(node)s is %(state)s (%(restarts)d restarts)%(because)s", PLUGIN_FIX, node_plugin_failing),
)



# ---------------------------------------------------------------------------------------------------------------
# Node-side causes: what one drift check limited to the pod's node found (the evidence "node_audit": the node's
# node_audit checks and the consistency check's findings for that node, as `gpuharden drift` reports a node).  These
# rules weigh the findings drift reports; they add the cause (which finding is this pod's trouble) and never audit
# again.  Their evidence names the check and the node, as the finding was read there.

# A pod's own findings: the device cgroup audit names the pod by its uid (bpf/_device_audit.py), the consistency check
# by {namespace, name, uid} (cluster/_consistency.py _pod_label).
ACCESS_WITHOUT_REQUEST = ("isolation_breach", "gpu_access", "visible_devices_without_request", "gpu_process_without_allocation",
                          "privileged_container")
OTHER_PODS_GPU = ("device_used_by_other_container", "isolation_breach", "gpu_process_on_unallocated_device", "privileged_container")
# an allocated GPU that is not healthy (nvml/_nvml_health.py); XIDs show as the plugin marking the device unhealthy
UNHEALTHY = ("gpu_lost", "ecc_uncorrectable", "remapped_rows_failure", "remapped_rows_pending", "gpu_health_unreadable")
DEVICE_PERMISSIONS = ("device_node_permissions", "device_node_missing", "device_node_wrong_type", "nvml_unprivileged_init_failed",
                      "nvml_unprivileged_gpu_denied")
NVML_DOWN = ("nvml_init_failed", "nvml_root_gpu_denied")


def node_checked(facts):
    """The node audit's part of the facts, or None where it could not be run (its not_checked says why)."""
    audit = facts.node_audit
    return audit if audit.get("state") == "checked" else None


def pod_uid(pod):
    return str((pod.get("metadata") or {}).get("uid") or "").lower()


def finding_of_pod(entry, pod):
    """Whether ``entry`` (a finding of the pod's node) is about ``pod``."""
    about = entry.get("pod")
    meta = pod.get("metadata") or {}
    if isinstance(about, dict):
        if about.get("uid") and pod_uid(pod):
            return str(about["uid"]).lower() == pod_uid(pod)
        return (about.get("namespace"), about.get("name")) == (meta.get("namespace"), meta.get("name"))
    if isinstance(about, str) and about:
        return about.lower() == pod_uid(pod)
    return entry.get("pod_name") == meta.get("name") and bool(meta.get("name"))


def pod_findings(facts, ids):
    audit = node_checked(facts)
    if audit is None:
        return []
    return [entry for entry in audit["findings"] if entry.get("id") in ids and finding_of_pod(entry, facts.pod)]


def node_findings(facts, ids):
    audit = node_checked(facts)
    return [] if audit is None else [entry for entry in audit["findings"] if entry.get("id") in ids]


def finding_item(facts, entry):
    audit = facts.node_audit
    what = "%s (%s, %s)" % (entry["id"], entry.get("check"), entry.get("severity"))
    where = "node %s: the %s check of gpuharden drift -l %s" % (audit.get("node"), entry.get("check"), audit.get("host"))
    value = {key: entry.get(key) for key in ("expected", "found", "hint", "container", "gpu", "device", "path", "subject") if entry.get(key) is not None}
    return item(what, where, value)


def container_name(entry):
    """The container a finding names: its name, else its ID cut as crictl shows it."""
    name = entry.get("container")
    if isinstance(name, str) and len(name) == 64 and all(char in "0123456789abcdef" for char in name):
        return name[:13]
    return name


def _gpu_text(entry):
    gpu = entry.get("gpu")
    if isinstance(gpu, dict):
        return "GPU %s (%s)" % (gpu.get("index"), gpu.get("uuid"))
    if gpu is not None:
        return "GPU %s%s" % (gpu, " (%s)" % entry["gpu_uuid"] if entry.get("gpu_uuid") else "")
    return entry.get("device") or "the node's GPUs"


def _env_sets_visible_devices(pod):
    return any(env.get("name") == "NVIDIA_VISIBLE_DEVICES" for container in (pod.get("spec") or {}).get("containers") or []
               for env in container.get("env") or [])


def _default_runtime_is_nvidia(facts):
    details = ((node_checked(facts) or {}).get("checks") or {}).get("containerd", {}).get("details") or {}
    return bool(details.get("runtime_name")) and details.get("default_runtime_name") == details.get("runtime_name")


def access_without_request(facts):
    if requested(facts.pod):
        return None
    found = pod_findings(facts, ACCESS_WITHOUT_REQUEST)
    if not found:
        return None
    entry = sorted(found, key=lambda e: ACCESS_WITHOUT_REQUEST.index(e["id"]))[0]
    runtime_class = (facts.pod.get("spec") or {}).get("runtimeClassName")
    if entry["id"] == "privileged_container":
        how = "the container is privileged: its device cgroup allows every device"
        change = "drop privileged: true (a GPU pod requests nvidia.com/gpu instead)"
    elif _env_sets_visible_devices(facts.pod):
        how = "the pod sets NVIDIA_VISIBLE_DEVICES itself and runs the NVIDIA runtime (%s)" % (
            "RuntimeClass %s" % runtime_class if runtime_class else "containerd's default runtime")
        change = "remove NVIDIA_VISIBLE_DEVICES from the pod (or set it to void) and request nvidia.com/gpu where it needs a GPU"
    elif _default_runtime_is_nvidia(facts) and not runtime_class:
        how = "the NVIDIA runtime is containerd's default runtime, and the image's NVIDIA_VISIBLE_DEVICES (all in CUDA images) gives it every GPU"
        change = ("make runc containerd's default runtime on %s again (default_runtime_name; gpuharden's container_runtime stage adds "
                  "the nvidia runtime without making it the default), so that only pods of RuntimeClass nvidia get the NVIDIA hook"
                  % facts.node_audit.get("node"))
    else:
        how = "the image's NVIDIA_VISIBLE_DEVICES (all in CUDA images) under the NVIDIA runtime%s" % (
            " (RuntimeClass %s)" % runtime_class if runtime_class else "")
        change = "set NVIDIA_VISIBLE_DEVICES=void in the pod, or run it without the NVIDIA runtime, and request nvidia.com/gpu where it needs one"
    visible = ((entry.get("found") or {}).get("containers") or {}) if isinstance(entry.get("found"), dict) else {}
    return ({"container": container_name(entry) or ", ".join(sorted(visible)) or "a container",
             "what": "GPUs (NVIDIA_VISIBLE_DEVICES=%s)" % ", ".join(sorted(set(map(str, visible.values())))) if visible else _gpu_text(entry),
             "how": how, "change": change, "_finding": entry["id"]},
            [requested_item(facts.pod)] + [finding_item(facts, e) for e in found[:4]])


def other_pods_gpu(facts):
    if not requested(facts.pod):
        return None
    found = pod_findings(facts, OTHER_PODS_GPU)
    if not found:
        return None
    entry = sorted(found, key=lambda e: OTHER_PODS_GPU.index(e["id"]))[0]
    owners = (entry.get("found") or {}).get("allocated_to") if isinstance(entry.get("found"), dict) else None
    others = len({e.get("gpu_uuid") or e.get("gpu") for e in found if e["id"] == entry["id"]})
    whose = " allocated to %s" % ", ".join(owners[:3]) if owners else " it was not allocated"
    if others > 1:
        whose += " (and %d more GPU%s)" % (others - 1, "s" if others > 2 else "")
    if entry["id"] == "privileged_container":
        whose, change = " (every GPU: the container is privileged)", "drop privileged: true; the device plugin's allocation then bounds its GPUs"
    else:
        change = ("remove NVIDIA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES=all and host /dev mounts from the pod: the device plugin's "
                  "allocation must be its only source of GPUs")
    return ({"container": container_name(entry) or "a container", "gpu": _gpu_text(entry), "whose": whose, "change": change,
             "_finding": entry["id"]},
            [requested_item(facts.pod)] + [finding_item(facts, e) for e in found[:4]])


def allocation_revoked(facts):
    found = pod_findings(facts, ("broken_allocation",))
    if not found:
        return None
    # the GPU first: nvidiactl and nvidia-uvm go with it
    found.sort(key=lambda e: e.get("gpu") is None)
    entry = found[0]
    return ({"container": container_name(entry) or "a container", "gpu": _gpu_text(entry), "node": facts.node_audit.get("node")},
            [requested_item(facts.pod)] + [finding_item(facts, e) for e in found[:4]])


def allocated_devices(facts):
    """The device IDs the kubelet allocated to the pod (the pod-resources answer the node's audit read), or None."""
    answer = (node_checked(facts) or {}).get("pod_resources")
    if answer is None:
        return None
    meta = facts.pod.get("metadata") or {}
    ids = set()
    for pod in answer:
        if (pod.get("namespace"), pod.get("name")) == (meta.get("namespace"), meta.get("name")):
            for container in pod.get("containers") or []:
                for device in container.get("devices") or []:
                    ids.update(str(i).split("::", 1)[0] for i in device.get("device_ids") or [])
    return ids


def unhealthy_allocated(facts):
    found = node_findings(facts, UNHEALTHY)
    if not found or not requested(facts.pod):
        return None
    allocated = allocated_devices(facts)
    if allocated is not None:
        found = [e for e in found if isinstance(e.get("gpu"), dict) and e["gpu"].get("uuid") in allocated]
        scope = "allocated to the pod"
    else:
        scope = "one of the node's GPUs (the pod's allocation was not read)"
    if not found:
        return None
    entry = found[0]
    return ({"scope": scope, "gpu": _gpu_text(entry), "health": entry["id"], "node": facts.node_audit.get("node"),
             "hint": entry.get("hint") or "", "_finding": entry["id"]},
            [requested_item(facts.pod), item("GPUs allocated to the pod", "node %s: the kubelet's pod-resources API (device_cgroups check)"
                                             % facts.node_audit.get("node"), sorted(allocated) if allocated is not None else "not read")]
            + [finding_item(facts, e) for e in found[:4]])


def _node_level(facts, ids, running_gpu_pods):
    """(the first finding of ``ids`` on the pod's node, all of them) for a pod that is not Running and Ready, or, with
    ``running_gpu_pods``, one that requests GPUs: a GPU pod Running and Ready can still be the one whose CUDA calls fail
    (the kubelet sees the container, not them); (None, []) otherwise."""
    if healthy_pod(facts.pod) and not (running_gpu_pods and requested(facts.pod)):
        return None, []
    found = node_findings(facts, ids)
    return (found[0] if found else None), found


def device_permissions(facts):
    entry, found = _node_level(facts, DEVICE_PERMISSIONS, running_gpu_pods=True)
    if entry is None:
        return None
    return ({"node": facts.node_audit.get("node"), "what": entry.get("path") or entry.get("device") or _gpu_text(entry),
             "found": entry.get("found"), "_finding": entry["id"]},
            [requested_item(facts.pod)] + [finding_item(facts, e) for e in found[:4]])


def stale_checkpoint(facts):
    entry, found = _node_level(facts, ("kubelet_stale_checkpoint",), running_gpu_pods=False)
    if entry is None:
        return None
    return ({"node": facts.node_audit.get("node"), "path": entry.get("path"), "found": entry.get("found")},
            [item("pod status", "pod %s status.phase/conditions" % pod_ref(facts.pod), (facts.pod.get("status") or {}).get("phase"))]
            + [finding_item(facts, e) for e in found[:2]])


def nvml_down(facts):
    entry, found = _node_level(facts, NVML_DOWN, running_gpu_pods=True)
    if entry is None:
        return None
    return ({"node": facts.node_audit.get("node"), "found": entry.get("found"), "hint": entry.get("hint") or "", "_finding": entry["id"]},
            [finding_item(facts, e) for e in found[:2]])


def allocation_unread(facts):
    """Why the node's device audit could not compare what the pod's containers can open with what the kubelet
    allocated (no pod-resources answer, and no allocation given), or None where it could (or the node was not read)."""
    audit = node_checked(facts)
    if audit is None:
        return None
    details = (audit.get("checks") or {}).get("device_cgroups", {}).get("details")
    if details is None:
        status = (audit.get("checks") or {}).get("device_cgroups", {}).get("status")
        return "the node's device_cgroups check did not run (%s)" % (status or "not asked for")
    if details.get("allocation_source") in (None, "none"):
        return (details.get("pod_resources") or {}).get("reason") or "no allocation to compare with"
    return None


def healthy_pod(pod):
    status = pod.get("status") or {}
    return status.get("phase") == "Succeeded" or (status.get("phase") == "Running" and ready(pod))


NODE_TRIP = ("pod", "node_audit")
NODE_SIDE_POD_RULES = (
    Rule("gpu_access_without_request", "pod", NODE_TRIP, True, "gpu_access",
         "requests no GPU, yet its container %(container)s can open %(what)s: %(how)s",
         ("change the workload: %(change)s",), access_without_request),
    Rule("another_pods_gpu", "pod", NODE_TRIP, True, "isolation_breach",
         "its container %(container)s can open %(gpu)s%(whose)s: GPU memory and compute are shared",
         ("change the workload: %(change)s", "then: gpuharden drift -i INVENTORY -l NODE shows the node's isolation findings cleared"),
         other_pods_gpu),
    Rule("device_program_revoked", "pod", NODE_TRIP, True, "broken_allocation",
         "its container %(container)s can no longer open %(gpu)s, which the kubelet allocated to it: the container's device "
         "program was replaced (a systemd daemon-reload on cgroup v2 without /dev/char links gives \"Failed to initialize NVML: "
         "Unknown Error\")",
         ("recreate the pod (kubectl delete pod; its controller makes a new one whose device program grants the GPU)",
          "prevent it: %s --tags device_permissions -l %%(node)s   (the /dev/char links systemd resolves the GPUs' rules with)" % HARDEN),
         allocation_revoked),
    Rule("allocated_gpu_unhealthy", "pod", NODE_TRIP, True, "gpu_lost",
         "%(gpu)s on %(node)s, %(scope)s, is unhealthy: %(health)s",
         ("%(hint)s", "meanwhile: recreate the pod elsewhere (kubectl cordon %(node)s, then delete the pod)"),
         unhealthy_allocated),
    Rule("device_permissions", "pod", NODE_TRIP, True, "device_node_permissions",
         "the GPU device nodes on %(node)s do not let the container open them (%(what)s: %(found)s)",
         ("%s --tags device_permissions -l %%(node)s" % HARDEN, "then recreate the pod"),
         device_permissions),
    Rule("stale_checkpoint", "pod", NODE_TRIP, True, "kubelet_stale_checkpoint",
         "the kubelet on %(node)s refuses to start: its checkpoint %(path)s is from another policy (%(found)s)",
         ("%s --tags kubelet_topology -l %%(node)s   (removes the checkpoint with the kubelet stopped, then starts it)" % HARDEN,),
         stale_checkpoint),
    Rule("nvml_unusable", "pod", NODE_TRIP, True, "nvml_init_failed",
         "NVML does not work on %(node)s (%(found)s)",
         ("%(hint)s",),
         nvml_down),
)


def node_audit_findings(facts):
    """explain node NAME with the node read: its audit's findings above info, the worst first."""
    audit = node_checked(facts)
    if audit is None:
        return None
    ranked = sorted((entry for entry in audit["findings"] if entry.get("severity") in SEVERITIES[1:]),
                    key=lambda entry: -SEVERITIES.index(entry["severity"]))
    if not ranked:
        return None
    stages = sorted({entry.get("stage") for entry in ranked if entry.get("remediable") and entry.get("stage")})
    fix = ("%s --tags %s -l %s" % (HARDEN, ",".join(stages), audit["host"]) if stages else
           "no harden stage fixes these: %s" % (ranked[0].get("hint") or "read the findings"))
    return ({"node": audit["node"], "count": len(ranked), "ids": ", ".join(sorted({entry["id"] for entry in ranked})[:6]),
             "first": ranked[0].get("hint") or ranked[0]["id"], "fix": fix, "_finding": ranked[0]["id"]},
            [finding_item(facts, entry) for entry in ranked[:6]])


# What stops a node's device plugin pod that only the node shows: the node-side pod rules about the node itself
PLUGIN_NODE_SIDE_CAUSES = ("stale_checkpoint", "nvml_unusable")

NODE_SIDE_NODE_RULES = (
    Rule("node_audit_findings", "node", ("node", "node_audit"), True, None,
         "the audit of node %(node)s has %(count)d finding(s): %(ids)s; the worst: %(first)s",
         ("%(fix)s",), node_audit_findings),
)
