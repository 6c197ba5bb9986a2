# SPDX-License-Identifier: GPL-3.0-or-later
"""Lab objects in the real apiserver: a Node per lab node (kwok keeps it Ready) and helpers for tests."""

from __future__ import annotations

import json
import time

from kubernetes import client, config, utils

from gpuharden_lab.node import Node
from gpuharden_lab.system import LabError


def api_client(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config(config_file=kubeconfig)


def _cpu_count(fixture: dict) -> int:
    highest = 0
    for gpu in fixture.get("gpus", []):
        for part in str(gpu.get("cpu_affinity", "0")).split(","):
            highest = max(highest, int(part.split("-")[-1]))
    return highest + 1


def node_object(node: Node, fixture: dict) -> dict:
    labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "gpuharden.io/lab": "true"}
    labels.update(node.spec.labels)
    capacity = {"cpu": str(max(_cpu_count(fixture), 8)), "memory": "512Gi", "pods": "110"}
    spec: dict = {}
    if node.spec.unschedulable:  # registered cordoned, as a node joined with --register-schedulable=false
        spec["unschedulable"] = True
    if node.spec.taints:  # as kubelet --register-with-taints
        spec["taints"] = [dict(taint) for taint in node.spec.taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def create_nodes(api: client.ApiClient, nodes: list[Node], fixtures: dict[str, dict]) -> None:
    """The Nodes kwok keeps: every lab node but those whose real kubelet registers its own (realnode.py)."""
    core = client.CoreV1Api(api)
    for node in nodes:
        if node.spec.real_containerd is None:
            core.create_node(node_object(node, fixtures[node.name]))


def label_registered_nodes(api: client.ApiClient, nodes: list[Node]) -> None:
    """The scenario's labels, taints and cordon on Nodes a real kubelet registered, set as an admin would: the
    kubelet may not set most of them itself (NodeRestriction), and kubeadm's node-labels go the same way."""
    core = client.CoreV1Api(api)
    for node in nodes:
        labels = {"gpuharden.io/lab": "true", **node.spec.labels}
        patch: dict = {"metadata": {"labels": labels}}
        if node.spec.unschedulable:
            patch["spec"] = {"unschedulable": True}
        if node.spec.taints:
            patch.setdefault("spec", {})["taints"] = [dict(taint) for taint in node.spec.taints]
        core.patch_node(node.name, patch)


def wait_nodes_ready(api: client.ApiClient, names: list[str], timeout: float = 60.0) -> float:
    core = client.CoreV1Api(api)
    start = time.monotonic()
    pending = set(names)
    while pending:
        for item in core.list_node().items:
            conditions = {c.type: c.status for c in (item.status.conditions or [])}
            if conditions.get("Ready") == "True":
                pending.discard(item.metadata.name)
        if not pending:
            break
        if time.monotonic() - start > timeout:
            raise LabError("lab Nodes not Ready within %.0fs: %s" % (timeout, sorted(pending)))
        time.sleep(0.2)
    return time.monotonic() - start


def node_summary(api: client.ApiClient) -> dict:
    core = client.CoreV1Api(api)
    summary = {}
    for item in core.list_node().items:
        conditions = {c.type: c.status for c in (item.status.conditions or [])}
        gpu = {k: v for k, v in (item.status.allocatable or {}).items() if k.startswith("nvidia.com/")}
        summary[item.metadata.name] = {"ready": conditions.get("Ready") == "True", "allocatable_gpu": gpu}
    return summary


def dump(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)


def apply_objects(api: client.ApiClient, objects: list[dict]) -> None:
    """Create a scenario's existing cluster objects (an old plugin install, RuntimeClasses ...) as admin."""
    for obj in objects:
        namespace = obj.get("metadata", {}).get("namespace")
        if namespace:
            try:
                client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
            except client.exceptions.ApiException as error:
                if error.status != 409:
                    raise
        utils.create_from_dict(api, obj)


def create_kwok_only_nodes(api: client.ApiClient, count: int, gpus_per_node: int = 8, prefix: str = "kwok-gpu-") -> list[str]:
    """Nodes that exist only in the apiserver (kwok keeps them Ready), for cluster-side checks at scale.

    Their GPUs are advertised in capacity/allocatable from the start: no kubelet runs for them.
    """
    core = client.CoreV1Api(api)
    names = []
    for number in range(count):
        name = "%s%d" % (prefix, number)
        capacity = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(gpus_per_node)}
        core.create_node({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "gpuharden.io/lab": "true", "gpuharden.io/kwok-only": "true",
                                    "nvidia.com/gpu.present": "true"}},
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        })
        names.append(name)
    return names


def install_tool_identity(api: client.ApiClient, rbac_manifest, namespace: str = "gpuharden-system",
                          service_account: str = "gpuharden", hours: int = 24) -> str:
    """Apply the product's shipped RBAC as admin and mint a token for its ServiceAccount.

    The tool then runs in the lab exactly as the docs tell users to run it: as that ServiceAccount,
    bound to nothing but the shipped roles.  Returns the token.
    """
    utils.create_from_yaml(api, str(rbac_manifest))
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": hours * 3600}}
    answer = client.CoreV1Api(api).create_namespaced_service_account_token(service_account, namespace, request)
    return answer.status.token
