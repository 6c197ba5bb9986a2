#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_workloads_info
short_description: List the GPU workloads of a cluster and its nodes' labels and taints
version_added: 0.1.0
description:
  - Lists, with one paginated LIST per kind for the whole cluster, the workloads that ask for GPUs (O(resources)),
    namely bare pods that have not finished, and the pod templates of Deployments, StatefulSets, DaemonSets, Jobs (those not
    owned by a CronJob) and CronJobs. Pods owned by a controller are covered by their controller's template.
  - For each it returns what placement and topology depend on (C(nodeName), C(nodeSelector), required node affinity,
    tolerations) and the GPUs each container asks for; plus every Node's labels, taints and GPU allocatable.
  - Runs on the controller (C(delegate_to=localhost), C(run_once=true)); the identity needs C(list) on pods, nodes,
    deployments, statefulsets, daemonsets, jobs and cronjobs. Input of M(gpuharden.k8s.topology_check).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.info_module
  - gpuharden.k8s._k8s_auth
options:
  resources:
    description: Extended resources that count as GPUs.
    type: list
    elements: str
    default: [nvidia.com/gpu]
  page_limit:
    description: Objects per page of each LIST (C(limit)); the module follows C(continue) until the end.
    type: int
    default: 500
  topology:
    description:
      - Also weigh the listed workloads against these nodes, in the same run, as M(gpuharden.k8s.topology_check)
        does for one node (the same check, with each node's labels and taints from the LIST). The post-check does this
        once for the play instead of one module run per node.
      - A dictionary by node name; each value has C(gpus) (required), C(topology_manager_policy),
        C(topology_manager_scope) (default V(container)) and C(cpu_manager_policy), as the options of
        M(gpuharden.k8s.topology_check).
    type: dict
    default: {}
requirements:
  - kubernetes (Python client) on the controller
seealso:
  - module: gpuharden.k8s.topology_check
  - module: gpuharden.k8s.gpu_pods_info
"""

EXAMPLES = r"""
- name: GPU workloads of the whole cluster
  gpuharden.k8s.gpu_workloads_info:
    kubeconfig: /etc/gpuharden/kubeconfig
  delegate_to: localhost
  run_once: true
  register: gpu_workloads
"""

RETURN = r"""
workloads:
  description:
    - One entry per GPU workload, sorted by kind, namespace and name, with C(kind), C(namespace), C(name),
      C(node_name), C(phase) (pods), C(node_selector), C(tolerations), C(node_affinity) (required node selector
      terms), C(containers) and C(init_containers) (C(name), C(gpus); init containers also C(sidecar)) and
      C(max_container_gpus).
  returned: always
  type: list
  elements: dict
  sample: [{"kind": "Deployment", "namespace": "ml", "name": "train-8g", "node_name": null, "phase": null,
            "node_selector": {"nvidia.com/gpu.present": "true"}, "tolerations": [], "node_affinity": [],
            "containers": [{"name": "trainer", "gpus": 8}], "init_containers": [], "max_container_gpus": 8}]
nodes:
  description: Every Node by name, with C(labels), C(taints) (C(key), C(value), C(effect)) and C(gpu_allocatable).
  returned: always
  type: dict
topology:
  description:
    - By node name, for each node of the C(topology) option, what M(gpuharden.k8s.topology_check) returns for it
      (C(findings), C(max_severity), C(numa_nodes), C(gpus_without_numa), C(max_gpus_per_numa_node),
      C(workloads_landing), C(workloads_blocked)).
  returned: always
  type: dict
api_requests:
  description: LIST requests (pages) made, all kinds together.
  returned: always
  type: int
api_retries:
  description:
    - Requests to the API server that were sent again after a throttled (429), failed (5xx) or broken attempt, with backoff
      and jitter, honouring C(Retry-After). Counted on failure too; a growing count tells of an overloaded API server.
  returned: always
  type: int
  sample: 0
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _gpu_workloads
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._k8s_access import list_kind

MODULE = "gpu_workloads_info"
KINDS = ("Node", "Pod") + _gpu_workloads.CONTROLLER_KINDS


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(
        resources={"type": "list", "elements": "str", "default": ["nvidia.com/gpu"]},
        page_limit={"type": "int", "default": 500},
        topology={"type": "dict", "default": {}},
    )
    return spec


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def gather(params):
    if not params["page_limit"] or params["page_limit"] < 1:
        raise GpuhardenError("%s: option page_limit=%r must be a positive number of objects" % (MODULE, params["page_limit"]))
    resources = [resource for resource in params["resources"] if resource]
    if not resources:
        raise GpuhardenError("%s: option resources is empty: name at least one resource such as nvidia.com/gpu" % MODULE)
    topology = _gpu_workloads.topology_entries(MODULE, params["topology"] or {})
    api = _k8s.api_client(params)
    objects, total = {}, 0
    try:
        for kind in KINDS:
            objects[kind], requests = list_kind(MODULE, api, kind, params["page_limit"])
            total += requests
    finally:
        api.close()
    nodes = {node["metadata"]["name"]: _gpu_workloads.node_summary(node, resources) for node in objects.pop("Node")}
    workloads = _gpu_workloads.collect(objects, resources)
    weighed = {name: _gpu_workloads.weigh(MODULE, name, entry, workloads, nodes.get(name)) for name, entry in topology.items()}
    return {"workloads": workloads, "nodes": nodes, "topology": weighed, "api_requests": total}


def main():
    _module_shell.run_module(build_module(), lambda module: gather(module.params), requires=[_k8s.REQUIREMENT], never_changed=True,
                             counters=_k8s.RESULT_COUNTERS)


if __name__ == "__main__":
    main()
