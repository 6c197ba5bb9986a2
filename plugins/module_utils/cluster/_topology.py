# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Topology feasibility: which GPU workloads a node's Topology Manager policy can never admit.  Pure.

Under ``single-numa-node`` the kubelet admits a container only if its GPUs (and, with the static CPU
policy, its exclusive CPUs) come from one NUMA node; a container asking for more GPUs than any NUMA
node holds is rejected with TopologyAffinityError, and the scheduler, which knows nothing of NUMA,
never places it elsewhere.  With ``topologyManagerScope: pod`` the unit is the whole pod.

The inputs are plain data: the node's GPUs (``index`` and sysfs ``numa_node``, as gpu_facts and
nvml_check return them), its labels and taints, the kubelet policies, and the workloads
(gpu_workloads_info's ``workloads``).
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding, max_severity

TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_SCOPES = ("container", "pod")
CPU_POLICIES = ("none", "static")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
TOLERATION_OPERATORS = ("Equal", "Exists")


def _bad(option, where, why):
    raise GpuhardenError("topology_check: option %s%s: %s" % (option, where, why))


def _int(option, where, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        else:
            _bad(option, where, "%r is not an integer" % (value,))
    if value < minimum:
        _bad(option, where, "%r is below %d" % (value, minimum))
    return value


def _dict(option, where, value):
    if not isinstance(value, dict):
        _bad(option, where, "expected a dictionary, got %s %r" % (type(value).__name__, value))
    return value


def _list(option, where, value):
    if not isinstance(value, list):
        _bad(option, where, "expected a list, got %s %r" % (type(value).__name__, value))
    return value


def check_gpus(gpus):
    """[{index, numa_node}] validated; entries with an ``error`` (unreadable GPU) are kept out."""
    checked = []
    for position, gpu in enumerate(_list("gpus", "", gpus)):
        where = "[%d]" % position
        _dict("gpus", where, gpu)
        if gpu.get("error"):
            continue
        if "index" not in gpu:
            _bad("gpus", where, "field index is missing")
        if "numa_node" not in gpu:
            _bad("gpus", where, "field numa_node is missing (gpu_facts and nvml_check return it from sysfs)")
        index = _int("gpus", where + ".index", gpu["index"], 0)
        numa = gpu["numa_node"]
        numa = None if numa is None else _int("gpus", where + ".numa_node", numa, -1)
        checked.append({"index": index, "numa_node": numa, "uuid": gpu.get("uuid"), "pci_bus_id": gpu.get("pci_bus_id")})
    indexes = [gpu["index"] for gpu in checked]
    if len(set(indexes)) != len(indexes):
        _bad("gpus", "", "GPU indexes repeat: %s" % indexes)
    return checked


def _check_string_map(option, where, value):
    _dict(option, where, value)
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            _bad(option, where, "%r: %r must map strings to strings" % (key, item))
    return value


def check_taints(taints):
    for position, taint in enumerate(_list("node_taints", "", taints)):
        where = "[%d]" % position
        _dict("node_taints", where, taint)
        if not isinstance(taint.get("key"), str) or not taint["key"]:
            _bad("node_taints", where + ".key", "missing or not a string: %r" % (taint.get("key"),))
        if taint.get("effect") not in TAINT_EFFECTS:
            _bad("node_taints", where + ".effect", "%r is not one of %s" % (taint.get("effect"), ", ".join(TAINT_EFFECTS)))
    return taints


def _check_requirements(where, requirements, fields=False):
    for position, requirement in enumerate(_list("workloads", where, requirements)):
        here = "%s[%d]" % (where, position)
        _dict("workloads", here, requirement)
        if requirement.get("operator") not in (("In", "NotIn") if fields else SELECTOR_OPERATORS):
            _bad("workloads", here + ".operator", "%r is not a node selector operator" % (requirement.get("operator"),))
        if not isinstance(requirement.get("key"), str):
            _bad("workloads", here + ".key", "missing or not a string: %r" % (requirement.get("key"),))
        values = requirement.get("values") or []
        _list("workloads", here + ".values", values)
        if requirement["operator"] in ("Gt", "Lt"):
            if len(values) != 1:
                _bad("workloads", here + ".values", "%s needs exactly one integer value, got %r" % (requirement["operator"], values))
            _int("workloads", here + ".values[0]", values[0], -(2 ** 63))


def _containers(where, containers):
    checked = []
    for position, container in enumerate(_list("workloads", where, containers or [])):
        here = "%s[%d]" % (where, position)
        _dict("workloads", here, container)
        checked.append({
            "name": container.get("name") or "#%d" % position,
            "gpus": _int("workloads", here + ".gpus", container.get("gpus", 0), 0),
            "sidecar": bool(container.get("sidecar")),
        })
    return checked


def check_workloads(workloads):
    """Workloads validated; each gets ``containers``/``init_containers`` lists and its identity."""
    checked = []
    for position, workload in enumerate(_list("workloads", "", workloads)):
        where = "[%d]" % position
        _dict("workloads", where, workload)
        for field in ("kind", "name"):
            if not isinstance(workload.get(field), str) or not workload[field]:
                _bad("workloads", where + "." + field, "missing or not a string: %r" % (workload.get(field),))
        entry = {
            "kind": workload["kind"],
            "namespace": workload.get("namespace"),
            "name": workload["name"],
            "node_name": workload.get("node_name"),
            "node_selector": _check_string_map("workloads", where + ".node_selector", workload.get("node_selector") or {}),
            "tolerations": _list("workloads", where + ".tolerations", workload.get("tolerations") or []),
            "node_affinity": _list("workloads", where + ".node_affinity", workload.get("node_affinity") or []),
            "containers": _containers(where + ".containers", workload.get("containers")),
            "init_containers": _containers(where + ".init_containers", workload.get("init_containers")),
        }
        for index, toleration in enumerate(entry["tolerations"]):
            here = "%s.tolerations[%d]" % (where, index)
            _dict("workloads", here, toleration)
            if toleration.get("operator", "Equal") not in TOLERATION_OPERATORS:
                _bad("workloads", here + ".operator", "%r is not Equal or Exists" % (toleration.get("operator"),))
        for index, term in enumerate(entry["node_affinity"]):
            here = "%s.node_affinity[%d]" % (where, index)
            _dict("workloads", here, term)
            _check_requirements(here + ".matchExpressions", term.get("matchExpressions") or [])
            _check_requirements(here + ".matchFields", term.get("matchFields") or [], fields=True)
        checked.append(entry)
    return checked


def pod_gpus(workload):
    """The pod's effective GPU request: max(app containers + sidecars, each init container + earlier sidecars)."""
    sidecars = 0
    peak = 0
    for container in workload["init_containers"]:
        if container["sidecar"]:
            sidecars += container["gpus"]
        else:
            peak = max(peak, container["gpus"] + sidecars)
    return max(peak, sidecars + sum(container["gpus"] for container in workload["containers"]))


def aligned_units(workload, scope):
    """What the Topology Manager aligns as one unit: (name, GPUs) per container, or the pod as a whole."""
    if scope == "pod":
        return [("pod", pod_gpus(workload))]
    return [(container["name"], container["gpus"]) for container in workload["init_containers"] + workload["containers"]]


def _requirement_matches(requirement, labels):
    key, operator, values = requirement["key"], requirement["operator"], [str(value) for value in requirement.get("values") or []]
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if key not in labels:
        return False
    try:
        number = int(labels[key])
    except ValueError:
        return False
    return number > int(values[0]) if operator == "Gt" else number < int(values[0])


def _tolerates(toleration, taint):
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return toleration.get("key") == taint["key"] and (toleration.get("value") or "") == (taint.get("value") or "")


def can_land(workload, node_name, labels, taints):
    """Whether the scheduler may place the workload's pods on the node (nodeName, selector, affinity, taints)."""
    if workload["node_name"]:
        return workload["node_name"] == node_name
    if any(labels.get(key) != value for key, value in workload["node_selector"].items()):
        return False
    terms = workload["node_affinity"]
    if terms:
        fields = {"metadata.name": node_name}
        if not any(
            all(_requirement_matches(requirement, labels) for requirement in term.get("matchExpressions") or [])
            and all(_requirement_matches(requirement, fields) for requirement in term.get("matchFields") or [])
            for term in terms
        ):
            return False
    for taint in taints:
        if taint["effect"] in BLOCKING_EFFECTS and not any(_tolerates(toleration, taint) for toleration in workload["tolerations"]):
            return False
    return True


def numa_layout(gpus):
    """{numa node: [GPU indexes]} over the GPUs with a NUMA hint, and the GPUs without one."""
    layout, unknown = {}, []
    for gpu in gpus:
        if gpu["numa_node"] is None or gpu["numa_node"] < 0:
            unknown.append(gpu["index"])
        else:
            layout.setdefault(gpu["numa_node"], []).append(gpu["index"])
    return layout, unknown


def _workload_ref(workload):
    return "%s %s/%s" % (workload["kind"], workload["namespace"] or "-", workload["name"])


def fitting_policy(numa_nodes, scope, units_fit_per_container):
    """The kubelet settings under which the workload would be admitted."""
    policy = {"topologyManagerPolicy": "restricted"}
    if numa_nodes > 2:
        policy["topologyManagerPolicyOptions"] = {"prefer-closest-numa-nodes": "true"}
    if scope == "pod" and units_fit_per_container:
        return {"topologyManagerScope": "container", "or": policy}
    return policy


def evaluate(node_name, gpus, policy, scope="container", cpu_policy=None, workloads=(), labels=None, taints=()):
    """Findings and the NUMA layout for one node.  ``policy`` None means the kubelet policy is unknown."""
    if policy is not None and policy not in TOPOLOGY_POLICIES:
        _bad("topology_manager_policy", "", "%r is not one of %s" % (policy, ", ".join(TOPOLOGY_POLICIES)))
    if scope not in TOPOLOGY_SCOPES:
        _bad("topology_manager_scope", "", "%r is not one of %s" % (scope, ", ".join(TOPOLOGY_SCOPES)))
    if cpu_policy is not None and cpu_policy not in CPU_POLICIES:
        _bad("cpu_manager_policy", "", "%r is not one of %s" % (cpu_policy, ", ".join(CPU_POLICIES)))
    gpus = check_gpus(gpus)
    labels = _check_string_map("node_labels", "", labels or {})
    taints = check_taints(list(taints))
    workloads = check_workloads(list(workloads))
    layout, unknown = numa_layout(gpus)
    largest = max((len(indexes) for indexes in layout.values()), default=0)
    findings = []
    for index in unknown:
        gpu = next(entry for entry in gpus if entry["index"] == index)
        findings.append(finding(
            "gpu_numa_unknown", "warning", {"numa_node": ">= 0"}, {"numa_node": gpu["numa_node"]},
            "sysfs gives no NUMA node for this GPU: the device plugin reports no topology for it, so the Topology "
            "Manager cannot align it (BIOS/ACPI SRAT setting, or a VM without a virtual NUMA topology)",
            gpu={"index": index, "uuid": gpu["uuid"], "pci_bus_id": gpu["pci_bus_id"]}, node=node_name, pod=None))
    if policy is None:
        findings.append(finding(
            "topology_policy_unknown", "info", "the kubelet's topologyManagerPolicy", None,
            "the kubelet's policy could not be read; the feasibility of GPU workloads was not checked", node=node_name, gpu=None, pod=None))
    elif policy in ("none", "best-effort") and len(layout) > 1:
        findings.append(finding(
            "topology_policy_no_alignment", "warning",
            {"topologyManagerPolicy": "single-numa-node or restricted"}, {"topologyManagerPolicy": policy},
            "the GPUs span %d NUMA nodes and the kubelet does not enforce alignment: a GPU pod may get GPUs and CPUs "
            "from different sockets (role gpuharden.k8s.kubelet_topology)" % len(layout), node=node_name, gpu=None, pod=None))
    if policy == "single-numa-node" and gpus and cpu_policy != "static":
        findings.append(finding(
            "cpu_policy_not_static", "warning", {"cpuManagerPolicy": "static"},
            {"cpuManagerPolicy": cpu_policy}, "under single-numa-node without the static CPU Manager policy no CPU is "
            "aligned with the GPUs: only devices are (role gpuharden.k8s.kubelet_topology)", node=node_name, gpu=None, pod=None))
    landing = []
    blocked = []
    for workload in workloads:
        if not can_land(workload, node_name, labels, taints):
            continue
        units = aligned_units(workload, scope)
        if not any(gpus_asked for _name, gpus_asked in units):
            continue
        if max(gpus_asked for _name, gpus_asked in units) > len(gpus):
            continue  # the scheduler never places it here: not enough GPUs at all
        landing.append(_workload_ref(workload))
        if policy != "single-numa-node" or not layout:
            continue
        too_big = [(name, gpus_asked) for name, gpus_asked in units if gpus_asked > largest]
        if not too_big:
            continue
        per_container_fits = all(container["gpus"] <= largest for container in workload["init_containers"] + workload["containers"])
        blocked.append(_workload_ref(workload))
        findings.append(finding(
            "workload_cannot_fit_numa", "error",
            {"max_gpus_per_%s" % ("pod" if scope == "pod" else "container"): largest,
             "numa_nodes": {str(numa): indexes for numa, indexes in sorted(layout.items())}},
            {"workload": {"kind": workload["kind"], "namespace": workload["namespace"], "name": workload["name"]},
             "gpus": dict(too_big), "scope": scope, "topologyManagerPolicy": policy},
            "%s asks for %d GPUs in one %s, but no NUMA node of %s has more than %d: under single-numa-node the kubelet "
            "rejects it at admission (TopologyAffinityError) and the scheduler never places it elsewhere. It would fit "
            "with %s" % (
                _workload_ref(workload), max(count for _name, count in too_big), "pod" if scope == "pod" else "container",
                node_name, largest, _describe_policy(fitting_policy(len(layout), scope, per_container_fits))),
            pod="%s/%s" % (workload["namespace"], workload["name"]) if workload["kind"] == "Pod" else None, node=node_name, gpu=None))
        findings[-1]["fitting_policy"] = fitting_policy(len(layout), scope, per_container_fits)
        findings[-1]["workload"] = findings[-1]["found"]["workload"]
    return {
        "findings": findings,
        "numa_nodes": {str(numa): indexes for numa, indexes in sorted(layout.items())},
        "gpus_without_numa": unknown,
        "max_gpus_per_numa_node": largest,
        "workloads_landing": landing,
        "workloads_blocked": blocked,
    }


def check_node(node_name, gpus, policy=None, scope="container", cpu_policy=None, workloads=(), labels=None, taints=()):
    """What topology_check returns for one node: evaluate() and the highest severity of its findings."""
    result = evaluate(node_name, gpus, policy, scope=scope, cpu_policy=cpu_policy, workloads=workloads, labels=labels,
                      taints=taints)
    result["max_severity"] = max_severity(result["findings"])
    return result


def _describe_policy(policy):
    if "or" in policy:
        return "topologyManagerScope: container, or %s" % _describe_policy(policy["or"])
    text = "topologyManagerPolicy: %s" % policy["topologyManagerPolicy"]
    if "topologyManagerPolicyOptions" in policy:
        text += " with topologyManagerPolicyOptions prefer-closest-numa-nodes: \"true\""
    return text


# ---------------------------------------------------------------------------------------------
# The admission check of a planned policy change, as harden runs it (module_utils/cluster/_kubelet_stage.py, through
# the action kubelet_topology_plan) and as the drift check predicts it: a node the check would keep on its policy is no remediable drift.

# The Topology Manager policies that refuse a pod they cannot align (kubernetes v1.36.3
# pkg/kubelet/cm/topologymanager/policy_restricted.go and policy_single_numa_node.go: canAdmitPodResult false, the pod
# rejected with TopologyAffinityError).
REJECTING_POLICIES = ("restricted", "single-numa-node")
# The kubelet fields harden leaves as they are on a node the admission check keeps (_kubelet_stage.MANAGER_OPTIONS,
# kubelet_config's options for them; tests/unit/test_kubelet_stage.py holds the two together).
KEPT_FIELDS = ("topologyManagerPolicy", "topologyManagerScope", "topologyManagerPolicyOptions", "cpuManagerPolicy",
               "reservedSystemCPUs", "memoryManagerPolicy", "reservedMemory")


def admission_switch(plan):
    """{policy, scope} when a kubelet plan (kubelet_config's, or node_audit's kubelet check details.plan) switches
    the node to a policy that can refuse GPU pods - from another policy or scope, or with a CPU Manager policy change -
    which is where harden runs its admission check first; else None."""
    sources = (plan or {}).get("sources") or {}
    policy, scope = sources.get("topologyManagerPolicy") or {}, sources.get("topologyManagerScope") or {}
    after = policy.get("after") or "none"
    if after not in REJECTING_POLICIES:
        return None
    if policy.get("before") == policy.get("after") and scope.get("before") == scope.get("after") and not plan.get("cpu_manager_policy_changed"):
        return None
    return {"policy": after, "scope": scope.get("after") or "container"}


def kept_by_admission(switch, weighed, workloads_error=None):
    """Why the admission check keeps the node on its policy ({policy, scope, fields, workloads, reason}), or None.
    ``weighed``: check_node's result for the node under the switched policy; ``workloads_error``: why the workloads
    could not be listed, which keeps the node too (harden does not switch a policy it could not check)."""
    blocked = [entry for entry in (weighed or {}).get("findings") or [] if entry["id"] == "workload_cannot_fit_numa"]
    if not blocked and workloads_error is None:
        return None
    if blocked:
        why = "; ".join("it could no longer admit %s %s/%s (a policy that admits it: %s)" % (
            entry["workload"]["kind"], entry["workload"]["namespace"], entry["workload"]["name"], _describe_policy(entry["fitting_policy"]))
            for entry in blocked)
    else:
        why = "the GPU workloads could not be listed, so their admission could not be checked (%s)" % workloads_error
    return {"policy": switch["policy"], "scope": switch["scope"], "fields": list(KEPT_FIELDS),
            "workloads": [entry["workload"] for entry in blocked],
            "reason": "kept by the admission check: harden does not switch the node to topologyManagerPolicy %s: %s. Choose "
                      "a policy that admits them (kubelet_topology_topology_manager_policy) or set "
                      "kubelet_topology_ignore_unadmittable_workloads=true" % (switch["policy"], why)}
