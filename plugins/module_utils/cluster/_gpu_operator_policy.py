# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The GPU Operator's ClusterPolicy, read on the controller: which of its node components run on which node.

The node stages take the result as their ``gpu_operator`` option (``node/_gpu_operator.py``), one line per component
that names the ClusterPolicy, its field and the node's label.  How the operator (NVIDIA/gpu-operator v26.7.0) decides:

* a component runs where its spec enables it: ``spec.toolkit.enabled``, ``spec.driver.enabled`` and
  ``spec.migManager.enabled`` default to true when unset (``api/nvidia/v1/clusterpolicy_types.go``, ToolkitSpec,
  DriverSpec and MIGManagerSpec ``IsEnabled``);
* and where the node carries the component's deploy label, which its DaemonSet selects
  (``assets/state-container-toolkit/0500_daemonset.yaml`` nodeSelector ``nvidia.com/gpu.deploy.container-toolkit:
  "true"``, ``assets/state-driver/0500_daemonset.yaml`` ``nvidia.com/gpu.deploy.driver``,
  ``assets/state-mig-manager/0600_daemonset.yaml`` ``nvidia.com/gpu.deploy.mig-manager``).  The operator sets these
  labels on GPU nodes (``controllers/state_manager.go`` gpuStateLabels; the MIG manager's only on MIG-capable ones) and
  keeps a label that has a value: k8s-driver-manager pauses an operand across a driver reload by rewriting its value,
  so any value but ``false`` (or none) counts, the operand comes back;
* the toolkit installs under ``spec.toolkit.installDir`` (default ``/usr/local/nvidia``) followed by ``/toolkit``
  (NVIDIA/nvidia-container-toolkit v1.20.0 ``cmd/nvidia-ctk-installer/main.go`` toolkitRoot), the driver container
  serves the driver at ``spec.hostPaths.driverInstallDir`` (default ``/run/nvidia/driver``, ``controllers/
  object_controls.go`` DefaultDriverInstallDir).
"""

from __future__ import annotations

import os

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

# (the node option's key, the ClusterPolicy's spec field, the component's deploy label, what it is called)
COMPONENTS = (
    ("toolkit", "toolkit", "nvidia.com/gpu.deploy.container-toolkit", "container toolkit"),
    ("driver", "driver", "nvidia.com/gpu.deploy.driver", "driver container"),
    ("mig_manager", "migManager", "nvidia.com/gpu.deploy.mig-manager", "MIG manager"),
)
NOT_THERE = (None, "", "false")


def _name(obj):
    return ((obj or {}).get("metadata") or {}).get("name") or "?"


def _spec(policy):
    spec = (policy or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def _enabled(spec, field):
    """(whether the component is enabled, how the spec says so)."""
    section = spec.get(field)
    value = section.get("enabled") if isinstance(section, dict) else None
    if value is None:
        return True, "spec.%s.enabled is unset (the operator's default: enabled)" % field
    return value is not False, "spec.%s.enabled is %s" % (field, str(value).lower())


def node_views(policies, nodes):
    """{node name: the gpu_operator option's reading for that node} for every node a ClusterPolicy runs a component on.
    ``nodes``: the Node objects (their labels).  The first ClusterPolicy by name that claims a component wins (the
    operator reconciles one)."""
    views = {}
    for policy in sorted(policies, key=_name):
        spec = _spec(policy)
        for node in nodes:
            labels = (node.get("metadata") or {}).get("labels") or {}
            view = views.setdefault(_name(node), {})
            for key, field, label, component in COMPONENTS:
                enabled, how = _enabled(spec, field)
                if key in view or not enabled or labels.get(label) in NOT_THERE:
                    continue
                view[key] = "ClusterPolicy %s runs the GPU Operator's %s on this node (%s; node label %s=%s)" % (
                    _name(policy), component, how, label, labels[label])
                if key == "toolkit" and (spec.get("toolkit") or {}).get("installDir"):
                    view["toolkit_dir"] = os.path.join(spec["toolkit"]["installDir"], "toolkit")
                if key == "driver" and ((spec.get("hostPaths") or {}).get("driverInstallDir")):
                    view["driver_root"] = spec["hostPaths"]["driverInstallDir"]
    return {name: view for name, view in views.items() if view}


def read(client, names, page_limit):
    """{"nodes": node_views for the nodes ``names``, "policies": the ClusterPolicies' names, "error": None}, from one LIST
    of ClusterPolicies and, where one exists, one LIST per component's deploy label that it enables.  No CRD (404): no
    operator.  Any other failure (RBAC, the API) is the reading's ``error`` (cause and what to grant), never a raise:
    the node stages then still read the node's own layout."""
    try:
        try:
            policies = client.list("ClusterPolicy", page_limit)
        except GpuhardenError as error:
            if error.result.get("status") == 404:
                return {"nodes": {}, "policies": [], "error": None}
            raise
        wanted, nodes = set(names), {}
        for _key, field, label, _component in COMPONENTS:
            if any(_enabled(_spec(policy), field)[0] for policy in policies):
                for node in client.list("Node", page_limit, label_selector=label):
                    if _name(node) in wanted:
                        nodes[_name(node)] = node
    except GpuhardenError as error:
        return {"nodes": {}, "policies": [], "error": "the GPU Operator's ClusterPolicy and the nodes' labels could not be read: %s" % error.msg}
    return {"nodes": node_views(policies, list(nodes.values())), "policies": sorted(_name(policy) for policy in policies), "error": None}
