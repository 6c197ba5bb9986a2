#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_pods_info
short_description: List the pods bound to given nodes that request NVIDIA (or other) device resources
version_added: 0.1.0
description:
  - Lists, with one paginated LIST of pods for the whole call, the pods bound to O(nodes) that request a resource
    whose name starts with one of O(resource_prefixes) (V(nvidia.com/) by default), and returns for each its UID,
    namespace, name, node, phase, QoS class, memory limits and requests (pod and containers) and GPU requests.
  - For one node the API server filters on C(spec.nodeName); for several nodes the list is cluster-wide over bound
    pods and filtered here, because a field selector cannot name several nodes. Never one GET per pod.
  - Pods that finished (C(Succeeded), C(Failed)) hold no cgroups and are left out unless O(include_terminated).
  - Runs on the controller (C(delegate_to=localhost)); needs C(list) on C(pods) across all namespaces.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.info_module
  - gpuharden.k8s._k8s_auth
options:
  nodes:
    description:
      - Names of the Kubernetes nodes (C(metadata.name) of the Node objects).
    type: list
    elements: str
    required: true
  resource_prefixes:
    description:
      - A pod is a GPU pod when one of its containers requests a resource whose name starts with one of these.
    type: list
    elements: str
    default: [nvidia.com/]
  include_terminated:
    description:
      - Also return pods in phase C(Succeeded) or C(Failed).
    type: bool
    default: false
  page_limit:
    description:
      - Pods per page of the LIST (C(limit) parameter); the module follows C(continue) until the end.
    type: int
    default: 500
  pods_snapshot:
    description:
      - "Also hand the pods of this LIST to M(gpuharden.k8s.gpu_consistency) later in the same play (its
        O(gpuharden.k8s.gpu_consistency#module:pods_snapshot) option), so that it need not list them again. The LIST is
        then the one that check needs, every pod of the cluster that has not finished, bound or pending; the pods are
        cut down to what it reads (names, UID, node, phase, container names, resources, C(NVIDIA_VISIBLE_DEVICES) and
        container IDs: no other environment value, annotation or volume) and written to a private file (directory 0700,
        file 0600) in the controller's temp directory, whose path is RV(pods_snapshot)."
      - What this module returns is the same with or without it. Not with O(include_terminated).
    type: bool
    default: false
  runtime_class:
    description:
      - Also check the NVIDIA RuntimeClass as M(gpuharden.k8s.runtime_class) does in check mode, with the same code (every
        RuntimeClass audited, the target Nodes' C(status.runtimeHandlers), the write decided by a server-side dry run,
        so nothing is written); the result is RV(runtime_class_check). Harden's plan does it here, in the module run it
        makes anyway, and runs its RuntimeClass stage only where this check would change or report something.
      - A dictionary of M(gpuharden.k8s.runtime_class)'s options C(name), C(handler), C(node_selector), C(tolerations),
        C(overhead_pod_fixed) and C(nodes), with the same defaults. A malformed value fails the module before any
        request. It then also needs what M(gpuharden.k8s.runtime_class) needs in check mode.
      - When that check fails (a handler only a recreate can change, a refused request), the pods are still returned;
        RV(runtime_class_check) then holds C(failed), C(msg) and the findings so far.
    type: dict
  device_plugin:
    description:
      - Also check the NVIDIA device plugin as M(gpuharden.k8s.device_plugin) does in check mode, with the same code
        (the node labels, every plugin DaemonSet audited, each write decided by a server-side dry run, so nothing is
        written); the result is RV(device_plugin_check). Harden's plan does it here, and runs its device plugin stage
        only where this check would change or report something.
      - A dictionary of M(gpuharden.k8s.device_plugin)'s options but the cluster identity's, with the same defaults,
        validated as that module validates them, before any request. It then also needs what
        M(gpuharden.k8s.device_plugin) needs in check mode.
      - When that check fails, the pods are still returned; RV(device_plugin_check) then holds C(failed), C(msg) and the
        findings so far.
    type: dict
  gpu_operator:
    description:
      - Also read which node components the NVIDIA GPU Operator runs on each node of O(nodes) (the container toolkit,
        the driver container, the MIG manager), from the ClusterPolicy's C(spec.toolkit), C(spec.driver) and
        C(spec.migManager) (enabled unless set to false) and the nodes' C(nvidia.com/gpu.deploy.*) labels, in one LIST of
        ClusterPolicies and, where one exists, one LIST per component's label. The result is RV(gpu_operator); harden's
        and the drift check's plans hand each node its entry, so that the node stages the operator owns defer to it.
      - A cluster without the ClusterPolicy CRD has no operator. A failed read (RBAC, the API) is RV(gpu_operator.error),
        and the pods are still returned.
    type: bool
    default: false
requirements:
  - kubernetes (Python client) on the controller
seealso:
  - module: gpuharden.k8s.cgroup_memory
  - module: gpuharden.k8s.runtime_class
  - module: gpuharden.k8s.device_plugin
"""

EXAMPLES = r"""
- name: GPU pods on every host of the play, in one request
  gpuharden.k8s.gpu_pods_info:
    kubeconfig: /etc/gpuharden/kubeconfig
    nodes: "{{ ansible_play_batch | map('extract', hostvars, 'gpuharden_k8s_node_name') }}"
  delegate_to: localhost
  run_once: true
  register: gpu_pods

- name: Pods that run on a GPU without any memory limit
  ansible.builtin.debug:
    msg: "{{ gpu_pods.unlimited_pods | map(attribute='name') }}"

- name: Count MIG slices as GPUs too
  gpuharden.k8s.gpu_pods_info:
    nodes: [gpu-node-1]
    resource_prefixes: [nvidia.com/gpu, nvidia.com/mig-]
  delegate_to: localhost
"""

RETURN = r"""
pods:
  description:
    - The GPU pods, sorted by node, namespace and name.
    - C(memory_limit_bytes) is the pod's limit when every running container has one, else V(null);
      C(memory_unlimited) is true when no running container has a memory limit at all.
    - C(gpu_requests) maps each matching resource to the pod's effective request.
    - C(containers) lists C(name), C(init), C(memory_limit_bytes), C(memory_request_bytes) and C(gpu_requests).
  returned: always
  type: list
  elements: dict
  sample: [{"uid": "0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162", "namespace": "ml", "name": "infer-0", "node": "gpu-1",
            "phase": "Running", "qos_class": "Burstable", "gpu_requests": {"nvidia.com/gpu": 1},
            "memory_limit_bytes": 17179869184, "memory_unlimited": false, "containers": []}]
pod_uids_by_node:
  description: UIDs of the GPU pods per node; every node of O(nodes) is a key, also without pods.
  returned: always
  type: dict
  sample: {"gpu-1": ["0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162"], "gpu-2": []}
unlimited_pods:
  description: The GPU pods without any memory limit, as C(uid), C(namespace), C(name), C(node).
  returned: always
  type: list
  elements: dict
pods_snapshot:
  description: With O(pods_snapshot), the path of the snapshot file, else V(null).
  returned: always
  type: str
runtime_class_check:
  description:
    - With O(runtime_class), the RuntimeClass check's result as M(gpuharden.k8s.gpu_consistency) returns it
      (RV(gpuharden.k8s.gpu_consistency#module:runtime_class_check)), from the same code; else V(null).
  returned: always
  type: dict
device_plugin_check:
  description:
    - With O(device_plugin), what M(gpuharden.k8s.device_plugin) returns in check mode (C(changed), C(findings),
      C(repairs), C(objects), C(node_labels), C(api_requests), ...) and the C(warnings) it would give, or C(failed),
      C(msg), C(findings), C(warnings) and C(api_requests) when that check failed; else V(null).
    - C(clean) is true when the stage would change, report and warn nothing (false when the check failed).
  returned: always
  type: dict
gpu_operator:
  description:
    - With O(gpu_operator), C(nodes) (per node that the operator runs a component on, the M(gpuharden.k8s.node_audit)
      O(gpuharden.k8s.node_audit#module:gpu_operator) entries C(toolkit), C(driver), C(mig_manager), each a line that
      names the ClusterPolicy, its field and the node's label, and C(toolkit_dir) or C(driver_root) where the
      ClusterPolicy moves them), C(policies) (the ClusterPolicies' names) and C(error) (why they could not be read, or
      V(null)); else V(null).
  returned: always
  type: dict
  contains:
    nodes:
      description: Per node the operator runs a component on, its entries.
      type: dict
      sample: {"gpu-1": {"toolkit": "ClusterPolicy cluster-policy runs the GPU Operator's container toolkit on this node
               (spec.toolkit.enabled is unset (the operator's default: enabled); node label
               nvidia.com/gpu.deploy.container-toolkit=true)"}}
    policies:
      description: The ClusterPolicies' names (none without the operator's CRD).
      type: list
      elements: str
    error:
      description: Why the ClusterPolicies or the nodes' labels could not be read, or V(null).
      type: str
api_requests:
  description: Number of LIST requests (pages) the call made for the pods (each check counts its own).
  returned: always
  type: int
  sample: 1
api_retries:
  description:
    - Requests to the API server that were sent again after a throttled (429), failed (5xx) or broken attempt, with backoff
      and jitter, honouring C(Retry-After). Counted on failure too; a growing count tells of an overloaded API server.
  returned: always
  type: int
  sample: 0
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import (
    _consistency,
    _device_plugin_reconcile,
    _gpu_operator_policy,
    _gpu_pods,
    _runtime_class,
)
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_objects, _k8s_snapshot
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._k8s_access import list_kind


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(
        nodes={"type": "list", "elements": "str", "required": True},
        resource_prefixes={"type": "list", "elements": "str", "default": ["nvidia.com/"]},
        include_terminated={"type": "bool", "default": False},
        page_limit={"type": "int", "default": 500},
        pods_snapshot={"type": "bool", "default": False},
        runtime_class={"type": "dict"},
        device_plugin={"type": "dict"},
        gpu_operator={"type": "bool", "default": False},
    )
    return spec


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def list_pods(api, field_selector, page_limit):
    """Every pod the selector matches, following ``continue``; returns (pods, requests made)."""
    return list_kind("gpu_pods_info", api, "Pod", page_limit, field_selector=field_selector)


def gather(params):
    if not params["page_limit"] or params["page_limit"] < 1:
        raise GpuhardenError("gpu_pods_info: option page_limit=%r must be a positive number of pods" % params["page_limit"])
    prefixes = [prefix for prefix in params["resource_prefixes"] if prefix]
    if not prefixes:
        raise GpuhardenError("gpu_pods_info: option resource_prefixes is empty: name at least one resource prefix such as nvidia.com/")
    if params["pods_snapshot"] and params["include_terminated"]:
        raise GpuhardenError("gpu_pods_info: options pods_snapshot and include_terminated exclude each other: the snapshot "
                             "holds the pods gpu_consistency checks, which have not finished")
    runtime_class = None if params["runtime_class"] is None else _runtime_class.check_option(
        params["runtime_class"], "gpu_pods_info: option runtime_class")
    device_plugin = None if params["device_plugin"] is None else _device_plugin_reconcile.check_option(
        params["device_plugin"], "gpu_pods_info: option device_plugin")
    field_selector, names = _gpu_pods.list_plan(params["nodes"], params["include_terminated"])
    if params["pods_snapshot"]:
        # gpu_consistency's own LIST: the whole cluster, pending pods too (collect keeps only those bound to the nodes)
        field_selector = _consistency.POD_SELECTOR
    pods, requests, runtime_class_check, device_plugin_check, operator = [], 0, None, None, None
    if names or params["pods_snapshot"] or runtime_class or device_plugin or params["gpu_operator"]:
        api = _k8s.api_client(params)
        try:
            if names or params["pods_snapshot"]:
                pods, requests = list_pods(api, field_selector, params["page_limit"])
            if runtime_class:
                client = _k8s_objects.Client(api, "gpu_pods_info")
                runtime_class_check = _runtime_class.dry_run(client, runtime_class, page_limit=params["page_limit"])
            if device_plugin:
                device_plugin_check = _device_plugin_reconcile.dry_run(_k8s_objects.Client(api, "device_plugin"), device_plugin)
            if params["gpu_operator"]:
                operator = _gpu_operator_policy.read(_k8s_objects.Client(api, "gpu_pods_info"), params["nodes"], params["page_limit"])
        finally:
            api.close()
    found, by_node, unlimited = _gpu_pods.collect(pods, names, prefixes)
    snapshot = _k8s_snapshot.write("pods", [_consistency.project_pod(pod) for pod in pods]) if params["pods_snapshot"] else None
    return {"pods": found, "pod_uids_by_node": by_node, "unlimited_pods": unlimited, "api_requests": requests,
            "pods_snapshot": snapshot, "runtime_class_check": runtime_class_check, "device_plugin_check": device_plugin_check,
            "gpu_operator": operator}


def main():
    _module_shell.run_module(build_module(), lambda module: gather(module.params), requires=[_k8s.REQUIREMENT], never_changed=True,
                             counters=_k8s.RESULT_COUNTERS)


if __name__ == "__main__":
    main()
