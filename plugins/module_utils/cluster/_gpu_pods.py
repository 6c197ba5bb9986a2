# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""GPU pods from Pod objects (plain dicts as the API server sends them): pure functions.

``list_plan`` decides the one LIST request for a set of nodes; ``summarize`` turns a Pod into what
the node-side fixes need (UID, QoS class, memory limits, GPU requests), or None for a pod without
GPU resources.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

_QUANTITY_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
TERMINATED_PHASES = ("Succeeded", "Failed")


def parse_quantity(value, where):
    """A Kubernetes quantity (``16Gi``, ``1.5G``, ``512Mi``, ``1e9``, ``100m``) as a Decimal."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    match = _QUANTITY_RE.match(text) if text is not None else None
    if not match:
        raise GpuhardenError("%s: %r is not a Kubernetes quantity" % (where, value))
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * (1024 ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    if suffix:
        return number.scaleb(int(suffix[1:]))
    return number


def quantity_bytes(value, where):
    """A memory quantity in whole bytes (rounded up, as the API server canonicalizes it)."""
    try:
        amount = parse_quantity(value, where)
    except InvalidOperation:
        raise GpuhardenError("%s: %r is not a Kubernetes quantity" % (where, value)) from None
    if amount < 0:
        raise GpuhardenError("%s: %r is negative" % (where, value))
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def list_plan(nodes, include_terminated=False):
    """(field_selector, client-side node filter) for ONE paginated LIST of pods across all namespaces.

    One node: the server filters on ``spec.nodeName``.  Several: a field selector cannot OR values, so
    the list is cluster-wide over bound pods and filtered here.
    """
    names = []
    for position, node in enumerate(nodes):
        if not isinstance(node, str) or not node.strip() or "," in node or "=" in node:
            raise GpuhardenError("gpu_pods_info: option nodes[%d]=%r is not a node name" % (position, node))
        if node.strip() not in names:
            names.append(node.strip())
    selectors = [] if include_terminated else ["status.phase!=%s" % phase for phase in TERMINATED_PHASES]
    if len(names) == 1:
        selectors.insert(0, "spec.nodeName=%s" % names[0])
    else:
        selectors.insert(0, "spec.nodeName!=")
    return ",".join(selectors), names


def _resources(container, kind):
    resources = container.get("resources") or {}
    value = resources.get(kind) or {}
    if not isinstance(value, dict):
        raise GpuhardenError("container %s: resources.%s is not a mapping" % (container.get("name"), kind))
    return value


def _gpu_counts(container, prefixes, where):
    counts = {}
    limits, requests = _resources(container, "limits"), _resources(container, "requests")
    for name in sorted(set(limits) | set(requests)):
        if any(name.startswith(prefix) for prefix in prefixes):
            # Extended resources cannot be overcommitted: a request, if given, equals the limit.
            raw = requests.get(name, limits.get(name))
            counts[name] = int(parse_quantity(raw, "%s resources %s" % (where, name)))
    return counts


def qos_class(pod):
    """status.qosClass, or the class the API server would compute (for objects that lack it)."""
    status_class = (pod.get("status") or {}).get("qosClass")
    if status_class:
        return status_class
    containers = list((pod.get("spec") or {}).get("containers") or []) + list((pod.get("spec") or {}).get("initContainers") or [])
    any_set, guaranteed = False, True
    for container in containers:
        limits, requests = _resources(container, "limits"), _resources(container, "requests")
        for resource in ("cpu", "memory"):
            request, limit = requests.get(resource, limits.get(resource)), limits.get(resource)
            any_set = any_set or request is not None or limit is not None
            if limit is None or request is None or str(request) != str(limit):
                guaranteed = False
    if guaranteed and containers:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"


def summarize(pod, prefixes):
    """What the node-side fixes need from a Pod, or None when it requests no resource with these prefixes."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    where = "pod %s/%s" % (meta.get("namespace"), meta.get("name"))
    containers = []
    gpu_totals = {}
    init_peaks = {}
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            cwhere = "%s container %s" % (where, container.get("name"))
            limits, requests = _resources(container, "limits"), _resources(container, "requests")
            gpus = _gpu_counts(container, prefixes, cwhere)
            memory_limit = limits.get("memory")
            memory_request = requests.get("memory", memory_limit)
            sidecar = kind == "initContainers" and container.get("restartPolicy") == "Always"
            entry = {
                "name": container.get("name"),
                "init": kind == "initContainers",
                "memory_limit_bytes": quantity_bytes(memory_limit, cwhere + " resources.limits.memory") if memory_limit is not None else None,
                "memory_request_bytes": quantity_bytes(memory_request, cwhere + " resources.requests.memory") if memory_request is not None else None,
                "gpu_requests": gpus,
            }
            containers.append(entry)
            for name, count in gpus.items():
                if kind == "containers" or sidecar:
                    gpu_totals[name] = gpu_totals.get(name, 0) + count
                else:
                    init_peaks[name] = max(init_peaks.get(name, 0), count)
    for name, peak in init_peaks.items():
        gpu_totals[name] = max(gpu_totals.get(name, 0), peak)
    if not any(gpu_totals.values()):
        return None
    running = [entry for entry in containers if not entry["init"] or entry["name"] in _sidecars(spec)]
    limits = [entry["memory_limit_bytes"] for entry in running]
    return {
        "uid": meta.get("uid"),
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "node": spec.get("nodeName"),
        "phase": (pod.get("status") or {}).get("phase"),
        "qos_class": qos_class(pod),
        "gpu_requests": gpu_totals,
        "memory_limit_bytes": sum(limits) if limits and all(limit is not None for limit in limits) else None,
        "memory_unlimited": all(limit is None for limit in limits),
        "containers": containers,
    }


def _sidecars(spec):
    return {container.get("name") for container in spec.get("initContainers") or [] if container.get("restartPolicy") == "Always"}


def collect(pods, node_names, prefixes):
    """(GPU pods on the wanted nodes, {node: [uid]} with every wanted node present, unlimited pods)."""
    wanted = set(node_names)
    found = []
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") not in wanted:
            continue
        summary = summarize(pod, prefixes)
        if summary is not None:
            found.append(summary)
    found.sort(key=lambda pod: (pod["node"], pod["namespace"], pod["name"]))
    by_node = {name: [] for name in node_names}
    for pod in found:
        by_node[pod["node"]].append(pod["uid"])
    unlimited = [{key: pod[key] for key in ("uid", "namespace", "name", "node")} for pod in found if pod["memory_unlimited"]]
    return found, by_node, unlimited
