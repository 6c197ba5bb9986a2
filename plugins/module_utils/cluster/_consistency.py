# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Three-state GPU consistency per node - declared, allocated, used - as pure functions.

- declared: the Node's ``status.allocatable`` ``nvidia.com/gpu`` and ``nvidia.com/mig-*`` (what the device plugin
  advertised);
- allocated: the GPU requests of the non-terminated pods bound to the node, and where the kubelet's pod-resources
  API was read on the node, the exact device IDs per container;
- used: what NVML sees on the node (GPUs, MIG devices, processes with PID and memory), passed in as node reports,
  with each process's cgroup (``/proc/<pid>/cgroup``) that ties it to a pod and a container.

``check`` takes the Node and Pod objects of one LIST each (plain dicts) and the node reports, builds indexes in
O(nodes + pods) and returns findings in the shape nvml_check uses (id, severity, node, gpu, pod, expected, found, hint).
"""

from __future__ import annotations

import calendar
import difflib
import re
import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _drain, _gpu_pods
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding, severity_rank
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig
from ansible_collections.gpuharden.k8s.plugins.module_utils.node._cgroup_paths import parse_container_path, process_cgroup_path

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"
PREFIX = "nvidia.com/"
VISIBLE_DEVICES_OFF = ("", "void", "none")
# The pods check() weighs: not terminated, bound or not (pending pods that request a resource no node advertises are
# findings too); the field selector of gpu_consistency's LIST, and of gpu_pods_info's when it hands its pods over.
POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


# ---------------------------------------------------------------------------------------------
# Input: node reports and pod-resources


def _int(value, where, minimum=0):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise GpuhardenError("gpu_consistency: %s=%r must be an integer >= %d" % (where, value, minimum))
    return value


def _list(value, where):
    if value is None:
        return []
    if not isinstance(value, list):
        raise GpuhardenError("gpu_consistency: %s=%r must be a list" % (where, value))
    return value


def _dict(value, where):
    if not isinstance(value, dict):
        raise GpuhardenError("gpu_consistency: %s=%r must be a dictionary" % (where, value))
    return value


def _process(raw, where, uuid_by_index, index_by_uuid, cgroups):
    _dict(raw, where)
    pid = _int(raw.get("pid"), where + ".pid", 1)
    gpu = raw.get("gpu", raw.get("index"))
    uuid = raw.get("gpu_uuid") or (uuid_by_index.get(gpu) if gpu is not None else None)
    if gpu is None and uuid is not None:
        gpu = index_by_uuid.get(uuid)
    if gpu is None and uuid is None:
        raise GpuhardenError("gpu_consistency: %s names no GPU (gpu index or gpu_uuid)" % where)
    if gpu is not None:
        _int(gpu, where + ".gpu")
    memory = raw.get("used_memory_mib")
    if memory is not None:
        _int(memory, where + ".used_memory_mib")
    cgroup = raw.get("cgroup")
    if cgroup is None:
        cgroup = cgroups.get(str(pid))
    if cgroup is not None and not isinstance(cgroup, str):
        raise GpuhardenError("gpu_consistency: %s.cgroup=%r must be a string (a path or /proc/<pid>/cgroup)" % (where, cgroup))
    return {"pid": pid, "gpu": gpu, "gpu_uuid": uuid, "mig_device_uuid": raw.get("mig_device_uuid"),
            "used_memory_mib": memory, "cgroup": process_cgroup_path(cgroup)}


def mig_device_profile(name):
    """The profile in a MIG device's NVML name ("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb" -> "1c.3g.40gb"), or None."""
    if not isinstance(name, str) or "MIG " not in name:
        return None
    return name.rsplit("MIG ", 1)[1].strip() or None


def normalize_report(node, raw):
    """A node report in either shape (the generic one or nvml_check's) as
    {gpu_count, gpus: {index: uuid}, mig_gpus, mig_devices, mig_profiles, processes}."""
    where = "node_reports[%s]" % node
    _dict(raw, where)
    gpus = _list(raw.get("gpus"), where + ".gpus")
    uuid_by_index, index_by_uuid, minor_by_index = {}, {}, {}
    mig_gpus, mig_devices, profiles = 0, [], {}
    nested = []
    for position, gpu in enumerate(gpus):
        gwhere = "%s.gpus[%d]" % (where, position)
        _dict(gpu, gwhere)
        index = _int(gpu.get("index", position), gwhere + ".index")
        uuid = gpu.get("uuid")
        if uuid is not None and not isinstance(uuid, str):
            raise GpuhardenError("gpu_consistency: %s.uuid=%r must be a string" % (gwhere, uuid))
        uuid_by_index[index] = uuid
        minor_by_index[index] = gpu.get("minor")
        if uuid:
            index_by_uuid[uuid] = index
        mig = gpu.get("mig") or {}
        if not isinstance(mig, dict):
            raise GpuhardenError("gpu_consistency: %s.mig=%r must be a dictionary" % (gwhere, mig))
        if mig.get("mode_current") in ("enabled", 1, True):
            mig_gpus += 1
            devices = [_dict(device, gwhere + ".mig.devices[]") for device in _list(mig.get("devices"), gwhere + ".mig.devices")]
            named = [mig_device_profile(device.get("name")) for device in devices]
            if devices and all(named):
                # The device plugin advertises one resource per MIG device (compute instance), named after the
                # profile by its own patterns (see expected_mig_resources): the NVML profiles are kept here.
                for name in named:
                    profiles[name] = profiles.get(name, 0) + 1
            else:
                for name, count in (mig.get("layout") or {}).items():
                    profiles[name] = profiles.get(name, 0) + _int(count, "%s.mig.layout[%s]" % (gwhere, name))
            for device in devices:
                mig_devices.append(dict(device, gpu=index))
        for process in _list(gpu.get("processes"), gwhere + ".processes"):
            nested.append(dict(_dict(process, gwhere + ".processes[]"), gpu=index))
    for position, device in enumerate(_list(raw.get("mig_devices"), where + ".mig_devices")):
        dwhere = "%s.mig_devices[%d]" % (where, position)
        _dict(device, dwhere)
        mig_devices.append(device)
        if device.get("profile"):
            profiles[device["profile"]] = profiles.get(device["profile"], 0) + 1
    if raw.get("mig_devices") and not mig_gpus:
        mig_gpus = len({device.get("gpu", device.get("parent_uuid")) for device in raw["mig_devices"]})
    gpu_count = raw.get("gpu_count")
    gpu_count = len(gpus) if gpu_count is None else _int(gpu_count, where + ".gpu_count")
    cgroups = raw.get("process_cgroups") or {}
    _dict(cgroups, where + ".process_cgroups")
    cgroups = {str(pid): value for pid, value in cgroups.items()}
    missing = set()
    for position, pid in enumerate(_list(raw.get("missing_pids"), where + ".missing_pids")):
        missing.add(_int(pid, "%s.missing_pids[%d]" % (where, position), 1))
    processes, exited = [], 0
    for position, process in enumerate(nested + _list(raw.get("processes"), where + ".processes")):
        process = _process(process, "%s.processes[%d]" % (where, position), uuid_by_index, index_by_uuid, cgroups)
        if process["pid"] in missing and process["cgroup"] is None:
            exited += 1  # gone between NVML's list and the cgroup read
            continue
        processes.append(process)
    for process in processes:
        process["minor"] = minor_by_index.get(process["gpu"])
    return {"gpu_count": gpu_count, "gpus": uuid_by_index, "mig_gpus": mig_gpus, "mig_devices": len(mig_devices),
            "mig_profiles": profiles, "processes": processes, "exited": exited}


def normalize_pod_resources(node, raw):
    """pod-resources List output for a node as {(namespace, pod, container): set(device ids)} (GPU resources only)."""
    where = "pod_resources[%s]" % node
    allocation = {}
    for position, pod in enumerate(_list(raw, where)):
        pwhere = "%s[%d]" % (where, position)
        _dict(pod, pwhere)
        for cposition, container in enumerate(_list(pod.get("containers"), pwhere + ".containers")):
            cwhere = "%s.containers[%d]" % (pwhere, cposition)
            _dict(container, cwhere)
            ids = set()
            for device in _list(container.get("devices"), cwhere + ".devices"):
                _dict(device, cwhere + ".devices[]")
                if str(device.get("resource_name") or "").startswith(PREFIX):
                    # Time-slicing replicas carry a ::N suffix on the device's UUID.
                    ids.update(str(ident).split("::", maxsplit=1)[0] for ident in _list(device.get("device_ids"), cwhere + ".device_ids"))
            allocation[(pod.get("namespace"), pod.get("name"), container.get("name"))] = ids
    return allocation


# ---------------------------------------------------------------------------------------------
# Cluster objects


def declared(node):
    return {name: int(_gpu_pods.parse_quantity(value, "node %s allocatable %s" % ((node.get("metadata") or {}).get("name"), name)))
            for name, value in ((node.get("status") or {}).get("allocatable") or {}).items() if name.startswith(PREFIX)}


def _visible_all(pod):
    """Containers that set NVIDIA_VISIBLE_DEVICES to a device list themselves (all, indexes, UUIDs)."""
    names = []
    for container in ((pod.get("spec") or {}).get("containers") or []) + ((pod.get("spec") or {}).get("initContainers") or []):
        for env in container.get("env") or []:
            if env.get("name") == "NVIDIA_VISIBLE_DEVICES" and str(env.get("value", "")).strip().lower() not in VISIBLE_DEVICES_OFF:
                names.append((container.get("name"), env.get("value")))
    return names


def index_pods(pods):
    """{uid: pod summary} and {node: {resource: allocated}} for the non-terminated, bound pods, in one pass."""
    by_uid, allocated, bad = {}, {}, []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        node = spec.get("nodeName")
        if not node or status.get("phase") in _gpu_pods.TERMINATED_PHASES:
            continue
        try:
            summary = _gpu_pods.summarize(pod, [PREFIX])
        except GpuhardenError as error:
            bad.append((node, "%s/%s" % (meta.get("namespace"), meta.get("name")), error.msg))
            continue
        requests = summary["gpu_requests"] if summary else {}
        containers = {}
        for entry in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
            ident = str(entry.get("containerID") or "").rsplit("://", maxsplit=1)[-1]
            if ident:
                containers[ident] = entry.get("name")
        by_uid[meta.get("uid")] = {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
                                   "node": node, "gpu_requests": requests, "containers": containers, "visible": _visible_all(pod)}
        if requests:
            totals = allocated.setdefault(node, {})
            for name, count in requests.items():
                totals[name] = totals.get(name, 0) + count
    return by_uid, allocated, bad


# What check() reads of a pod, and nothing else: a pod handed over between two modules of one run (gpu_pods_info's
# pods_snapshot) is cut down to it, so the file holds no environment value but NVIDIA_VISIBLE_DEVICES, no annotation
# (kubectl's last-applied-configuration repeats the whole spec), no volume, command or image.
# tests/unit/test_consistency.py runs every check of its own twice, on the pods and on their projections.
_CONTAINER_FIELDS = ("name", "resources", "restartPolicy")
_STATUS_CONTAINER_LISTS = ("containerStatuses", "initContainerStatuses")


def _project_container(container):
    kept = {field: container[field] for field in _CONTAINER_FIELDS if field in (container or {})}
    visible = [{key: env[key] for key in ("name", "value") if key in env}
               for env in (container or {}).get("env") or [] if env.get("name") == "NVIDIA_VISIBLE_DEVICES"]
    if visible:
        kept["env"] = visible
    return kept


def project_pod(pod):
    """The pod as check() needs it (see above)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    projected = {"metadata": {key: meta[key] for key in ("name", "namespace", "uid") if key in meta},
                 "spec": {key: spec[key] for key in ("nodeName",) if key in spec},
                 "status": {key: status[key] for key in ("phase", "qosClass") if key in status}}
    for kind in ("containers", "initContainers"):
        if kind in spec:
            projected["spec"][kind] = [_project_container(container) for container in spec[kind] or []]
    for kind in _STATUS_CONTAINER_LISTS:
        if kind in status:
            projected["status"][kind] = [{key: entry[key] for key in ("name", "containerID") if key in entry}
                                         for entry in status[kind] or []]
    return projected


def is_gpu_node(node, label):
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    if label and str((meta.get("labels") or {}).get(label, "")).lower() == "true":
        return True
    return any(name.startswith(PREFIX) and str(value) not in ("0", "") for name, value in (status.get("capacity") or {}).items())


# ---------------------------------------------------------------------------------------------
# Findings


def _pod_label(pod):
    return {"namespace": pod["namespace"], "name": pod["name"], "uid": pod["uid"]}


def expected_mig_resources(profiles):
    """What the device plugin advertises (mixed strategy) for MIG devices of ``profiles`` ({NVML profile: count}):
    {"mixed": {name: count} or None, "mixed_legacy": {name: count}}.

    Names as NVIDIA/k8s-device-plugin builds them (internal/rm/rm.go AddDefaultResourcesToConfig, patterns matched
    in internal/rm/device_map.go buildMigDeviceMap; details in _mig.mig_resource_name): v0.19.x and older match
    unanchored, so the real v0.18.2 binary advertised a 3g.40gb GPU instance split into three 1c.3g.40gb compute
    instances as nvidia.com/mig-3g.40gb x3, and 1g.10gb+me as nvidia.com/mig-1g.10gb; v0.20.0 and newer match
    anchored (1g.10gb+me -> nvidia.com/mig-1g.10gb.me) and do not start at all on a 1c.3g.40gb device ("mixed": None).
    """
    result = {"mixed": {}, "mixed_legacy": {}}
    for profile, count in sorted(profiles.items()):
        names = _mig.mig_resource_names(profile)
        parsed = names["mixed_legacy"] is not None
        for key in result:
            if result[key] is None:
                continue
            if names[key] is None and parsed:
                result[key] = None  # a compute-instance profile: no pattern matches, the plugin does not start
                continue
            resource = names[key] or MIG_PREFIX + str(profile).replace("+", ".")
            result[key][resource] = result[key].get(resource, 0) + count
    return result


def _declared_findings(name, have, report, replicas, labelled):
    found = []
    gpus = have.get(GPU, 0) + have.get(SHARED, 0)
    mig = {key: value for key, value in have.items() if key.startswith(MIG_PREFIX)}
    unknown = sorted(key for key in have if key not in (GPU, SHARED) and not key.startswith(MIG_PREFIX) and have[key] > 0)
    if unknown:
        found.append(finding(
            "unknown_gpu_resource", "warning", {"resources": [GPU, SHARED, MIG_PREFIX + "<profile>"]},
            {key: have[key] for key in unknown},
            "the node advertises nvidia.com resources the NVIDIA device plugin does not name: it discards renames in its "
            "config (DisableResourceNamingInConfig, NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin/main.go), so another "
            "device plugin (GPU passthrough, network operator) or a modified plugin advertises them", node=name, gpu=None, pod=None))
    if report is None:
        if labelled and not gpus and not any(mig.values()):
            found.append(finding(
                "gpu_not_advertised", "critical", {"allocatable": {GPU: ">0"}}, {"allocatable": have},
                "the node is labelled as a GPU node but advertises no GPU: the NVIDIA device plugin is missing or failing here", node=name, gpu=None, pod=None))
        return found
    physical = report["gpu_count"]
    if report["mig_devices"]:
        mixed = sum(mig.values())
        whole = physical - report["mig_gpus"]
        single = have.get(GPU, 0) == report["mig_devices"] + whole and not mig
        names = expected_mig_resources(report["mig_profiles"])
        profiles_ok = not report["mig_profiles"] or any(
            expected is not None and all(have.get(resource, 0) == count for resource, count in expected.items())
            for expected in names.values())
        if not single and not (mixed == report["mig_devices"] and profiles_ok):
            hint = ("MIG devices exist but the node does not advertise them (as nvidia.com/mig-<profile> with migStrategy "
                    "mixed, or as nvidia.com/gpu with single): the device plugin runs migStrategy none or is failing")
            if names["mixed"] is None:
                hint += ("; compute instances smaller than their GPU instance (%s) match none of the resource patterns of "
                         "device plugin v0.20.0 and newer, which then does not start: use default compute instances"
                         % ", ".join(sorted(p for p in report["mig_profiles"] if _mig.mig_resource_names(p)["mixed"] is None)))
            found.append(finding(
                "mig_not_advertised", "error",
                {"mig_devices": report["mig_devices"], "profiles": report["mig_profiles"], "resources": names},
                {"allocatable": have}, hint, node=name, gpu=None, pod=None))
        return found
    if physical and not gpus and not any(mig.values()):
        found.append(finding(
            "gpu_not_advertised", "critical", {"allocatable": {GPU: physical * replicas}, "gpus_present": physical},
            {"allocatable": have},
            "GPUs are present but allocatable is 0: the NVIDIA device plugin is missing or failing on this node "
            "(or advertises another resource name)", node=name, gpu=None, pod=None))
    elif physical and gpus < physical * replicas:
        found.append(finding(
            "gpu_partially_advertised", "error", {"allocatable": {GPU: physical * replicas}}, {"allocatable": have},
            "fewer GPUs advertised than present: the device plugin marked some unhealthy (XID) or does not see them", node=name, gpu=None, pod=None))
    elif gpus > physical * replicas:
        found.append(finding(
            "gpu_over_advertised", "warning", {"allocatable": {GPU: physical * replicas}}, {"allocatable": have},
            "more GPUs advertised than present: time-slicing or MPS replicas (set sharing_replicas) or a stale Node status", node=name, gpu=None, pod=None))
    return found


def _allocation_findings(name, have, allocated):
    found = []
    for resource, count in sorted(allocated.items()):
        if count > have.get(resource, 0):
            found.append(finding(
                "allocated_exceeds_declared", "critical", {resource: "<= %d" % have.get(resource, 0)}, {resource: count},
                "pods bound to the node request more %s than it advertises: they were bound by nodeName past the scheduler, or the "
                "plugin's advertisement shrank under running pods; they share GPUs or fail to start" % resource, node=name, gpu=None, pod=None))
    return found


def _usage_findings(name, report, pods, allocation):
    """Process findings for one node; ``allocation`` is the pod-resources map or None."""
    found = []
    allocated_to = {}
    for key, ids in (allocation or {}).items():
        for ident in ids:
            allocated_to.setdefault(ident, []).append(key)
    per_pod = {}
    for process in report["processes"]:
        device = process["mig_device_uuid"] or process["gpu_uuid"] or "index %s" % process["gpu"]
        gpu = {"index": process["gpu"], "minor": process["minor"], "uuid": process["gpu_uuid"], "mig_device_uuid": process["mig_device_uuid"]}
        parsed = parse_container_path(process["cgroup"]) if process["cgroup"] else None
        pod = pods.get(parsed["pod_uid"]) if parsed else None
        where = {"pid": process["pid"], "cgroup": process["cgroup"], "used_memory_mib": process["used_memory_mib"]}
        if process["cgroup"] is None:
            found.append(finding("gpu_process_unattributed", "info", "the process's cgroup", where,
                                 "no cgroup in the node report for this PID: run gpuharden.k8s.process_cgroup_info on the node", gpu=gpu, node=name, pod=None))
            continue
        if parsed is None:
            found.append(finding("gpu_process_outside_pods", "warning", "a pod's container cgroup", where,
                                 "a process outside any pod uses the GPU: the scheduler does not count it", gpu=gpu, node=name, pod=None))
            continue
        if pod is None:
            found.append(finding("gpu_process_unknown_pod", "warning", "a pod bound to the node", dict(where, pod_uid=parsed["pod_uid"]),
                                 "the process's pod is not in the API server (a static pod, or the pod was deleted and its container kept running)",
                                 gpu=gpu, node=name, pod=None))
            continue
        container = pod["containers"].get(parsed["container_id"])
        entry = per_pod.setdefault(pod["uid"], {"pod": pod, "devices": {}, "memory": 0, "pids": set()})
        entry["devices"][device] = gpu
        entry["memory"] += process["used_memory_mib"] or 0
        entry["pids"].add(process["pid"])
        if pod["node"] != name:
            found.append(finding("gpu_process_pod_on_other_node", "error", {"node": name}, {"node": pod["node"], "pid": process["pid"]},
                                 "the process's pod is bound to another node", gpu=gpu, pod=_pod_label(pod), node=name))
        if allocation is not None and container is not None and pod["gpu_requests"]:
            key = (pod["namespace"], pod["name"], container)
            ids = {process["gpu_uuid"], process["mig_device_uuid"]} - {None}
            if key in allocation and not ids & allocation[key]:
                owners = [other for ident in ids for other in allocated_to.get(ident, []) if other != key]
                if owners:
                    found.append(finding(
                        "device_used_by_other_container", "critical", {"container": container, "devices": sorted(allocation[key])},
                        dict(where, device=device, allocated_to=["%s/%s/%s" % owner for owner in owners]),
                        "a container uses a GPU the kubelet allocated to another container: GPU memory is shared between them",
                        gpu=gpu, pod=_pod_label(pod), node=name))
                else:
                    found.append(finding(
                        "gpu_process_on_unallocated_device", "critical", {"container": container, "devices": sorted(allocation[key])},
                        dict(where, device=device), "a container uses a GPU the kubelet did not allocate to it", gpu=gpu, pod=_pod_label(pod), node=name))
                entry["checked_exactly"] = True
    for entry in per_pod.values():
        pod = entry["pod"]
        requested = sum(pod["gpu_requests"].values())
        devices = sorted(entry["devices"].values(), key=lambda item: (item["index"] is None, item["index"], item["mig_device_uuid"] or ""))
        used = {"devices": len(devices), "gpus": devices, "pids": sorted(entry["pids"]), "used_memory_mib": entry["memory"]}
        if not requested:
            found.append(finding(
                "gpu_process_without_allocation", "critical", {"gpu_requests": {GPU: 0}, "devices": 0}, used,
                "the pod requested no GPU yet its processes use GPUs (NVIDIA_VISIBLE_DEVICES=all, a privileged container or a host "
                "device mount): it shares GPU memory with the pods the GPUs were allocated to", pod=_pod_label(pod), node=name, gpu=None))
        elif len(devices) > requested and not entry.get("checked_exactly"):
            found.append(finding(
                "gpu_process_exceeds_allocation", "error", {"gpu_requests": pod["gpu_requests"], "devices": requested}, used,
                "the pod uses more GPUs than it was allocated: it reaches GPUs allocated to other pods", pod=_pod_label(pod), node=name, gpu=None))
    return found


def _cordon_findings(name, node):
    """A cordon gpuharden made and no run of it ended (the record node_maintenance puts on every cordon it makes): an
    interrupted run (Ctrl-C, a killed job) or a failed step left the node out of service.  A check that got this far
    holds, or took over, the node's run lock (node_audit's lock), so no gpuharden run is working on the node now."""
    state = _drain.cordon_state(node)
    record = state["record"]
    if not state["unschedulable"] or record is None:
        return []
    return [finding(
        "node_left_cordoned", "error", "schedulable once the gpuharden run that cordoned it has ended",
        {"cordoned_by": record.get("owner"), "at": record.get("at"), "for": record.get("for")} if record.get("owner") is not None
        else {"record": record.get("unreadable")},
        "cordoned by %s, and that run ended without uncordoning it (interrupted, or a step failed and left it cordoned on "
        "purpose): the next harden resumes the step where the node still needs it, else releases the cordon once the node is "
        "Ready (gpuharden.k8s.node_maintenance state=released)" % _drain.describe_record(record), node=name, gpu=None, pod=None)]


def _pod_spec_findings(pods_on_node, name):
    found = []
    for pod in pods_on_node:
        if pod["visible"] and not pod["gpu_requests"]:
            found.append(finding(
                "visible_devices_without_request", "error", {"NVIDIA_VISIBLE_DEVICES": "unset (set by the device plugin)"},
                {"containers": dict(pod["visible"])},
                "a container sets NVIDIA_VISIBLE_DEVICES itself without requesting a GPU: with the nvidia runtime it gets those GPUs "
                "unscheduled and shares their memory; remove the variable and request nvidia.com/gpu", pod=_pod_label(pod), node=name, gpu=None))
    return found


# Resource names that are not extended resources (k8s.io/api core/v1 ResourceName; hugepages-<size> too).
STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage", "storage", "pods")
GPU_WORDS = ("gpu", "nvidia", "mig-")
_MIG_RESOURCE_RE = re.compile(r"^[0-9]+g\.[0-9]+gb([.-][A-Za-z][A-Za-z0-9.,]*)?$")


def _gpu_like(name):
    lower = name.lower()
    if lower in STANDARD_RESOURCES or lower.startswith("hugepages-"):
        return False
    return lower.startswith(PREFIX) or any(word in lower for word in GPU_WORDS)


def _plugin_missing(name, advertised):
    """A name of the NVIDIA device plugin's own forms while no node advertises any name of that form: the plugin is
    missing, failing or runs another MIG strategy (gpu_not_advertised, mig_not_advertised), not a wrong name."""
    base = name[:-len(".shared")] if name.endswith(".shared") else name
    if base == GPU:
        return not any(other in (GPU, SHARED) or other.startswith(MIG_PREFIX) for other in advertised)
    if base.startswith(MIG_PREFIX) and _MIG_RESOURCE_RE.match(base[len(MIG_PREFIX):]):
        return not any(other.startswith(MIG_PREFIX) for other in advertised)
    return False


def _requested_gpu_names(pod):
    names = set()
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = (container or {}).get("resources") or {}
        for kind in ("limits", "requests"):
            value = resources.get(kind) or {}
            if isinstance(value, dict):
                names.update(str(name) for name in value if _gpu_like(str(name)) and str(value[name]).strip() not in ("0", ""))
    return names


def _requested_not_advertised(nodes, pods, targets):
    """Pods requesting a GPU-like resource (nvidia.com/*, or a name with gpu/nvidia/mig- in it) that no Node advertises
    (capacity or allocatable): they never schedule.  The NVIDIA device plugin advertises nvidia.com/gpu,
    nvidia.com/gpu.shared and nvidia.com/mig-<profile> whatever its config renames (DisableResourceNamingInConfig,
    NVIDIA/k8s-device-plugin api/config/v1/config.go, called from cmd/nvidia-device-plugin/main.go), so the wrong
    name is the workload's.  One finding per (node, resource): the node a pod is bound to, None for pending pods;
    bound pods count only on the checked nodes."""
    advertised = set()
    for node in nodes:
        status = node.get("status") or {}
        for field in ("capacity", "allocatable"):
            advertised.update(str(name) for name in (status.get(field) or {}))
    known = sorted(name for name in advertised if _gpu_like(name)) or [GPU]
    grouped = {}
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if status.get("phase") in _gpu_pods.TERMINATED_PHASES:
            continue
        node = spec.get("nodeName") or None
        if node is not None and node not in targets:
            continue
        for resource in sorted(name for name in _requested_gpu_names(pod) - advertised if not _plugin_missing(name, advertised)):
            grouped.setdefault((node, resource), []).append(
                {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid")})
    found = []
    for (node, resource), requesters in sorted(grouped.items(), key=lambda item: (item[0][0] or "", item[0][1])):
        close = difflib.get_close_matches(resource, known, n=1, cutoff=0.6)
        found.append(finding(
            "requested_resource_not_advertised", "error", {"advertised": known},
            {"resource": resource, "pods": ["%s/%s" % (item["namespace"], item["name"]) for item in requesters],
             "close_match": close[0] if close else None},
            "%d pod(s) request %s, which no node advertises: they stay Pending (or fail admission where bound)%s; fix the "
            "workloads' resource name - the NVIDIA device plugin advertises nvidia.com/gpu and nvidia.com/mig-<profile> "
            "whatever its config renames" % (len(requesters), resource, "; did you mean %s?" % close[0] if close else ""),
            pod=requesters[0] if len(requesters) == 1 else None, node=node, gpu=None))
    return found


def validate(reports, pod_resources=None, replicas=1):
    """The node reports and pod-resources, checked and normalized: ({node: report}, {node: allocation})."""
    _int(replicas, "option sharing_replicas", 1)
    _dict(reports, "option node_reports")
    _dict(pod_resources or {}, "option pod_resources")
    normalized = {str(node): normalize_report(node, raw) for node, raw in reports.items()}
    # A node report may carry the pod-resources answer read on the node (node_audit); the option wins.
    given = {str(node): raw.get("pod_resources") for node, raw in reports.items() if raw.get("pod_resources") is not None}
    given.update({str(node): raw for node, raw in (pod_resources or {}).items()})
    allocations = {node: normalize_pod_resources(node, raw) for node, raw in given.items()}
    return normalized, allocations


def check(nodes, pods, reports, pod_resources=None, wanted=None, label="nvidia.com/gpu.present", replicas=1):
    """Findings and a per-node summary.  ``nodes``/``pods``: the LISTs' items; ``reports``: {node: node report};
    ``pod_resources``: {node: pod-resources List}; ``wanted``: node names, or None for every GPU node (and every
    reported node)."""
    normalized, allocations = validate(reports, pod_resources, replicas)
    by_name = {(node.get("metadata") or {}).get("name"): node for node in nodes}
    every = {name for name, node in by_name.items() if is_gpu_node(node, label)} | set(normalized)
    targets = list(dict.fromkeys(wanted)) if wanted else sorted(every)
    by_uid, allocated, bad = index_pods(pods)
    on_node = {}
    for pod in by_uid.values():
        on_node.setdefault(pod["node"], []).append(pod)
    findings, summary = [], {}
    target_set = set(targets)
    findings.extend(_requested_not_advertised(nodes, pods, target_set))
    for node, pod_name, message in bad:
        if node in target_set:
            findings.append(finding("pod_unreadable", "warning", "a valid pod spec", {"pod": pod_name, "error": message},
                                    "the pod's GPU requests could not be read", node=node, gpu=None, pod=None))
    for name in targets:
        node = by_name.get(name)
        report = normalized.get(name)
        if node is None:
            findings.append(finding("node_not_found", "error", "a Node object", None,
                                    "no Node with this name in the API server: check gpuharden_k8s_node_name", node=name, gpu=None, pod=None))
            continue
        labelled = is_gpu_node(node, label)
        have = declared(node)
        used_here = allocated.get(name, {})
        findings.extend(_declared_findings(name, have, report, replicas, labelled))
        findings.extend(_allocation_findings(name, have, used_here))
        findings.extend(_pod_spec_findings(on_node.get(name, []), name))
        findings.extend(_cordon_findings(name, node))
        if report is not None:
            findings.extend(_usage_findings(name, report, by_uid, allocations.get(name)))
        summary[name] = {
            "declared": have,
            "allocated": used_here,
            "physical": None if report is None else {
                "gpus": report["gpu_count"], "mig_devices": report["mig_devices"], "mig_profiles": report["mig_profiles"]},
            "used": None if report is None else {
                "gpus": len({(p["gpu"], p["mig_device_uuid"]) for p in report["processes"]}),
                "processes": len(report["processes"]),
                "used_memory_mib": sum(p["used_memory_mib"] or 0 for p in report["processes"]),
                "exited_processes": report["exited"],
            },
            "pod_resources": name in allocations,
            # Exact device IDs per container from the kubelet, or only the pods' requests from the API server.
            "allocation_source": "pod-resources" if name in allocations else "api-server",
        }
    findings.sort(key=lambda item: (item["node"] or "", -severity_rank(item["severity"]), item["id"]))
    return findings, summary


# What a node advertises lags behind its device plugin: the plugin registers some seconds after its container starts
# (the upstream DaemonSet has no readiness probe, so a Ready pod says nothing about it), re-registers after every
# kubelet restart, and the kubelet posts the new capacity only with its next node status update
# (nodeStatusUpdateFrequency, 10 s by default: k8s.io/kubelet config/v1beta1 types.go; capacity from the device
# manager in pkg/kubelet/nodestatus/setters.go MachineInfo).  Right after a run changed the plugin, the kubelet or the
# MIG layout, these findings may only be that lag.
ADVERTISEMENT_FINDINGS = ("gpu_not_advertised", "gpu_partially_advertised", "mig_not_advertised")


def awaiting_advertisement(findings):
    """The nodes whose findings say they do not (yet) advertise what they have."""
    return sorted({entry["node"] for entry in findings if entry["id"] in ADVERTISEMENT_FINDINGS})


# A restarted kubelet's device manager starts every resource of its checkpoint with no healthy device, "so that the
# resource capacity will stay zero till the corresponding device plugin re-registers" (kubernetes v1.36.3
# pkg/kubelet/cm/devicemanager/manager.go, readCheckpoint), while the Node keeps the allocatable the old kubelet
# posted until the new one posts its first status (pkg/kubelet/kubelet_node_status.go, tryUpdateNodeStatus: at its
# first sync, lastStatusReportTime being zero).  A read between the restart and that first status sees the old count
# and no finding; one seconds later can land in the zero window.  So a node whose kubelet the run restarted is judged
# only from a status its new kubelet posted: one whose Ready condition's lastHeartbeatTime (the kubelet's own clock,
# set on every status it posts: pkg/kubelet/nodestatus/setters.go ReadyCondition) is after the restart, on the same
# node clock.  The heartbeat has whole seconds: a status posted in the second of the restart counts as the old one
# (the next one, when the plugin registers again, settles it).
STATUS_NOT_POSTED = "kubelet_status_not_posted"


def ready_heartbeat(node):
    """The Ready condition's lastHeartbeatTime, as (text, epoch seconds), or (None, None)."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("lastHeartbeatTime"):
            text = condition["lastHeartbeatTime"]
            try:
                return text, calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))
            except ValueError:
                return text, None
    return None, None


def stale_statuses(nodes, restarted_at):
    """{node: {kubelet_restarted_at, ready_heartbeat}} of the nodes of ``restarted_at`` ({node: the node's clock
    just before this run restarted its kubelet}) whose Node status is not yet one the new kubelet posted."""
    by_name = {(node.get("metadata") or {}).get("name"): node for node in nodes}
    stale = {}
    for name, when in sorted((restarted_at or {}).items()):
        text, seconds = ready_heartbeat(by_name.get(name) or {})
        if seconds is None or seconds <= when:
            stale[name] = {"kubelet_restarted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)), "ready_heartbeat": text}
    return stale


def stale_status_findings(stale):
    return [finding(
        STATUS_NOT_POSTED, "error", {"ready_heartbeat": "after %s" % entry["kubelet_restarted_at"]}, entry,
        "the kubelet this run restarted has posted no Node status since (is it running, and can it reach the API server?): "
        "the node's advertised resources are still the old kubelet's, so its advertisement findings say nothing of the new "
        "one", node=name, gpu=None, pod=None) for name, entry in sorted(stale.items())]


def check_restarted_at(value, where):
    """The restarted_at option ({node: epoch seconds}), checked."""
    _dict(value, where)
    for name, when in value.items():
        if isinstance(when, bool) or not isinstance(when, (int, float)) or when <= 0:
            raise GpuhardenError("gpu_consistency: %s[%s]=%r must be seconds since the epoch" % (where, name, when))
    return value
