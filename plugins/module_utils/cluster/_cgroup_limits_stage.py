# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The cgroup_limits stage's immediate fix (roles/cgroup_limits/tasks/immediate.yml), pure: which pod UIDs of the batch's
GPU pods cgroup_memory takes on one node, and the report of its run the play's statistics record (gpuharden_cgroup_limits).

The action gpuharden.k8s.cgroup_limits_immediate runs cgroup_memory with ``pod_uids(...)`` and returns ``report(...)``.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

MODULE = "cgroup_limits_immediate"


def gpu_pods(given, listed):
    """The batch's GPU pods: ``given`` (cgroup_limits_gpu_pods, the plan's listing) when set, else gpu_pods_info's
    ``listed``; a listing that failed or has no ``pod_uids_by_node`` is refused by name."""
    pods = given if given is not None else listed
    if not isinstance(pods, dict) or not isinstance(pods.get("pod_uids_by_node"), dict):
        raise GpuhardenError("%s: the GPU pods of the batch were not listed (%s)" % (
            MODULE, (pods or {}).get("msg") if isinstance(pods, dict) else pods), fix="check the kubeconfig and the RBAC to list pods")
    return pods


def pod_uids(pods, node_name):
    """The UIDs of the GPU pods gpu_pods_info placed on ``node_name``."""
    return list(pods["pod_uids_by_node"].get(node_name) or [])


def report(pods, node_name, result):
    """What the run's statistics record for the node: memory.high writes, GPU pods without a memory limit (those the API
    says have none on this node, and those whose cgroup has none) and pods without a cgroup here, named namespace/name."""
    refs = {pod["uid"]: "%s/%s" % (pod["namespace"], pod["name"]) for pod in pods.get("pods") or []}
    unlimited = [pod["uid"] for pod in pods.get("unlimited_pods") or [] if pod.get("node") == node_name]
    unlimited += [uid for uid in result.get("unlimited_pods") or [] if uid not in unlimited]
    return {"node": node_name, "updated": result.get("updated") or [],
            "unlimited_pods": [refs.get(uid, uid) for uid in unlimited],
            "not_found": [refs.get(uid, uid) for uid in result.get("not_found") or []],
            "findings": result.get("findings") or []}
