# SPDX-License-Identifier: GPL-3.0-or-later
"""A scenario's pods, real on both sides: the Pod object in the apiserver (bound to its node, kwok
runs it) and a runc container on the node in the cgroup the kubelet would use, with device rules from
its GPU allocation.  Containers that use their GPUs show up as processes in the node's NVML state.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuharden_lab import NVML_DOUBLE_DIR, layout, pods
from gpuharden_lab.node import Node
from gpuharden_lab.noderoot import load_fixture
from gpuharden_lab.system import NODE_WORKERS, LabError, run

# This host's cgroup2 hierarchy has no memory controller (memory is on cgroup v1), so memory.max and
# memory.high cannot exist in the nodes' real cgroup2 trees.  Nodes with memory-limited pods get a view
# of those files at the same cgroup paths under this directory, and their inventory points
# gpuharden_cgroup_root at it.  Device programs and cgroup.procs stay in the real tree.
MEMORY_VIEW_ROOT = "/var/lib/gpuharden-memcg"
QUANTITY_SUFFIXES = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}

POD_KEYS = {
    "name", "namespace", "node", "gpus", "qos", "cgroup_driver", "privileged", "env", "lost_gpu_access",
    "gpu_memory_mib", "memory_limit", "labels",
}


@dataclass
class PlacedPod:
    name: str
    namespace: str
    node: str
    uid: str
    container_id: str
    pid: int
    gpu_minors: list[int] = field(default_factory=list)
    visible_minors: list[int] = field(default_factory=list)


def quantity_bytes(quantity: str) -> int:
    for suffix, factor in sorted(QUANTITY_SUFFIXES.items(), key=lambda item: -len(item[0])):
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def _memory_view(node: Node, spec: pods.ContainerSpec, limit: str | None) -> None:
    """memory.max = the limit (or max), memory.high = max: what a kubelet without MemoryQoS leaves behind."""
    for cgroup in (spec.pod_cgroup_path, spec.cgroup_path):
        base = MEMORY_VIEW_ROOT + cgroup
        node.write_live(base + "/memory.max", ("%d\n" % quantity_bytes(limit)) if limit else "max\n")
        node.write_live(base + "/memory.high", "max\n")


def _write_memory_views(nodes: dict[str, Node], placed_specs: list[tuple[str, pods.ContainerSpec, str | None]]) -> None:
    """Every node gets a view whose root looks like a cgroup2 root with the memory controller, and every pod a
    view of its memory files (the inventory points gpuharden_cgroup_root there)."""
    for node in nodes.values():
        node.write_live(MEMORY_VIEW_ROOT + "/cgroup.controllers", "cpuset cpu io memory hugetlb pids\n")
    for node_name, spec, limit in placed_specs:
        _memory_view(nodes[node_name], spec, limit)


def _pod_object(entry: dict) -> dict:
    resources: dict = {}
    limits = {}
    if entry.get("gpus"):
        limits["nvidia.com/gpu"] = str(entry["gpus"])
    if entry.get("memory_limit"):
        limits["memory"] = entry["memory_limit"]
    if entry.get("qos") == "guaranteed":
        limits.setdefault("cpu", "1")
        limits.setdefault("memory", entry.get("memory_limit") or "1Gi")
        resources["requests"] = dict(limits)
    if limits:
        resources["limits"] = limits
    container = {
        "name": "main",
        "image": "registry.example/gpu-workload:1",
        "resources": resources,
        "env": [{"name": key, "value": str(value)} for key, value in (entry.get("env") or {}).items()],
    }
    if entry.get("privileged"):
        container["securityContext"] = {"privileged": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": entry["name"], "namespace": entry.get("namespace", "default"), "labels": entry.get("labels") or {}},
        "spec": {"nodeName": entry["node"], "containers": [container], "tolerations": [{"operator": "Exists"}]},
    }


def _ensure_namespace(core: client.CoreV1Api, name: str) -> None:
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:
            raise


def _create_pod(core: client.CoreV1Api, body: dict, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return core.create_namespaced_pod(body["metadata"]["namespace"], body)
        except ApiException as error:
            # Until kube-controller-manager made the namespace's default ServiceAccount, admission refuses pods.
            if error.status != 403 or "serviceaccount" not in (error.body or "") or time.monotonic() > deadline:
                raise LabError("creating pod %s/%s: %s" % (body["metadata"]["namespace"], body["metadata"]["name"], error.body)) from None
            time.sleep(0.2)


# Where containerd keeps a task's bundle (containerd runtime/v2 task manager, namespace k8s.io): on real nodes the lab's
# runc container stands where containerd's would, so the product ties it to its pod exactly as on a real node.
CONTAINERD_TASK_DIR = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"
# The real kubelet's device manager checkpoint (pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go): which device
# IDs it allocated to which pod and container, written at admission, before any sandbox exists.
DEVICE_CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


def _real_allocation(node: Node, pod_uid: str, uuid_minor: dict[str, int], timeout: float = 60.0) -> list[int]:
    """The GPU minors the real kubelet allocated to the pod (its admission already ran the device plugin's Allocate)."""
    deadline = time.monotonic() + timeout
    while True:
        text = run(node.enter_argv() + ["--", "cat", DEVICE_CHECKPOINT], check=False).stdout
        entries = (json.loads(text).get("Data") or {}).get("PodDeviceEntries") or [] if text.strip() else []
        for entry in entries:
            if entry.get("PodUID") == pod_uid and entry.get("ResourceName") == "nvidia.com/gpu":
                ids = [device for per_numa in (entry.get("DeviceIDs") or {}).values() for device in per_numa]
                return sorted(uuid_minor[device] for device in ids)
        if time.monotonic() > deadline:
            raise LabError("node %s: the real kubelet allocated no nvidia.com/gpu to pod %s within %.0fs (%s)"
                           % (node.name, pod_uid, timeout, DEVICE_CHECKPOINT))
        time.sleep(0.5)


def place(api: client.ApiClient, nodes: dict[str, Node], entries: list[dict]) -> list[PlacedPod]:
    core = client.CoreV1Api(api)
    free: dict[str, list[int]] = {}
    gpu_index_of: dict[str, dict[int, int]] = {}
    for name, node in nodes.items():
        fixture = load_fixture(node.spec.fixture)[1]
        free[name] = sorted(gpu["minor"] for gpu in fixture["gpus"])
        gpu_index_of[name] = {gpu["minor"]: index for index, gpu in enumerate(fixture["gpus"])}
    placed = []
    placed_specs: list[tuple[str, pods.ContainerSpec, str | None]] = []
    processes: dict[str, dict[int, list[dict]]] = {}
    for position, entry in enumerate(entries):
        unknown = set(entry) - POD_KEYS
        if unknown or entry.get("node") not in nodes:
            raise LabError("scenario pods[%d] (%s): unknown keys %s or unknown node %r" % (position, entry.get("name"), sorted(unknown), entry.get("node")))
        node = nodes[entry["node"]]
        wanted = int(entry.get("gpus") or 0)
        if wanted > len(free[node.name]):
            raise LabError("scenario pods[%d] (%s): asks for %d GPUs, node %s has %d free" % (position, entry["name"], wanted, node.name, len(free[node.name])))
        minors, free[node.name] = free[node.name][:wanted], free[node.name][wanted:]
        _ensure_namespace(core, entry.get("namespace", "default"))
        pod = _create_pod(core, _pod_object(entry))
        bundle_root = "/run/gpuharden-bundles"
        if node.spec.real_containerd is not None:
            # the real kubelet admits the pod and its device manager picks the GPUs through the real plugin
            fixture = load_fixture(node.spec.fixture)[1]
            minors = _real_allocation(node, pod.metadata.uid, {gpu["uuid"]: gpu["minor"] for gpu in fixture["gpus"]}) if wanted else []
            bundle_root = CONTAINERD_TASK_DIR
        spec = pods.ContainerSpec.new(
            entry["name"], entry.get("namespace", "default"),
            pod_uid=pod.metadata.uid,
            qos=entry.get("qos", "besteffort"),
            # the real kubelet takes containerd's driver: cgroupfs with `containerd config default`
            cgroup_driver=entry.get("cgroup_driver", "systemd" if node.spec.real_containerd is None else "cgroupfs"),
            gpu_minors=minors,
            privileged=bool(entry.get("privileged")),
            env={key: str(value) for key, value in (entry.get("env") or {}).items()},
            lost_gpu_access=bool(entry.get("lost_gpu_access")),
        )
        enter = node.enter_argv()
        pid = pods.start_container(enter, spec, bundle_root, pods.RUNC_ROOT)
        all_minors = sorted(gpu_index_of[node.name])
        visible = sorted(set(minors) | set(spec.visible_minors(all_minors)) | (set(all_minors) if spec.privileged else set()))
        placed_specs.append((node.name, spec, entry.get("memory_limit")))
        placed.append(PlacedPod(entry["name"], entry.get("namespace", "default"), node.name, pod.metadata.uid, spec.container_id, pid, minors, visible))
        if entry.get("gpu_memory_mib"):
            # The workload uses every GPU it can open, which is the point of the cross-sharing seeds.
            for minor in visible:
                processes.setdefault(node.name, {}).setdefault(gpu_index_of[node.name][minor], []).append(
                    {"pid": pid, "used_memory_mib": int(entry["gpu_memory_mib"])}
                )
    _write_memory_views(nodes, placed_specs)
    # Only the scenario's containers run on the lab's GPUs: the fixtures' sample PIDs are not processes here.  One
    # node's GPUs in turn (its double's state file), the nodes side by side.
    def set_node_processes(node_name: str) -> None:
        for index in gpu_index_of[node_name].values():
            set_nvml_processes(nodes[node_name], index, processes.get(node_name, {}).get(index, []))

    with concurrent.futures.ThreadPoolExecutor(max_workers=NODE_WORKERS) as pool:
        list(pool.map(set_node_processes, nodes))
    return placed


def set_nvml_processes(node: Node, gpu_index: int, processes: list[dict]) -> None:
    """Replace a GPU's running processes in the node's NVML state (inside the node, under the double's lock)."""
    run(
        node.enter_argv() + ["--", str(layout.NODE_PYTHON / "bin/python"), str(NVML_DOUBLE_DIR / "nvml_double_ctl.py"),
                             "set-processes", "--state", "/var/lib/nvml-double/state.json",
                             "--fixture", "/etc/nvml-double/fixture.json", "--gpu", str(gpu_index), "--json", json.dumps(processes)]
    )
