#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: topology_check
short_description: Find GPU workloads that a node's Topology Manager policy can never admit
version_added: 0.1.0
description:
  - Pure data check, read-only, runs anywhere (the C(gpuharden.k8s.postcheck) role runs it on the controller); nothing
    on a node is read. The node's GPU layout comes from M(gpuharden.k8s.gpu_facts) or M(gpuharden.k8s.nvml_check)
    (C(index) and the sysfs C(numa_node) of each GPU), the kubelet's policies from the caller, the workloads from
    M(gpuharden.k8s.gpu_workloads_info).
  - Under C(topologyManagerPolicy=single-numa-node) a container asking for more GPUs than any one NUMA node holds is
    rejected by the kubelet at admission (C(TopologyAffinityError)) and never rescheduled, because the scheduler does
    not know NUMA. The module names every workload (bare pods, Deployment, StatefulSet, Job, CronJob and DaemonSet
    templates) that can land on the node (C(nodeName), C(nodeSelector), required node affinity, tolerations of
    C(NoSchedule)/C(NoExecute) taints) and can never run there, with the policy that would admit it
    (V(restricted), plus C(prefer-closest-numa-nodes) on hosts with more than two NUMA nodes, or
    C(topologyManagerScope=container) when only the pod scope makes it too big).
  - Also reports GPUs without a NUMA node (sysfs C(-1)), C(single-numa-node) without the static CPU Manager policy
    (no CPU is then aligned), and a policy that aligns nothing (V(none), V(best-effort)) on a node whose GPUs span
    several NUMA nodes.
  - Workloads asking for more GPUs than the node has at all are not reported, because the scheduler never places them there.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.info_module
options:
  node_name:
    description: The Kubernetes node name (findings name it; C(nodeName) and C(matchFields) compare with it).
    type: str
    required: true
  gpus:
    description:
      - The node's GPUs, each with C(index) and C(numa_node) (V(-1) or V(null) = no NUMA hint), for example
        C(ansible_facts.gpuharden.gpus) or the C(gpus) that M(gpuharden.k8s.nvml_check) returns. Entries with an
        C(error) (unreadable GPU) are left out.
    type: list
    elements: dict
    required: true
  topology_manager_policy:
    description:
      - The kubelet's effective C(topologyManagerPolicy). Not set means unknown, which is reported as such.
      - One of V(none), V(best-effort), V(restricted), V(single-numa-node).
    type: str
  topology_manager_scope:
    description: The kubelet's C(topologyManagerScope), V(container) or V(pod).
    type: str
    default: container
  cpu_manager_policy:
    description: The kubelet's C(cpuManagerPolicy), V(none) or V(static); not set means unknown.
    type: str
  node_labels:
    description: The Node's labels.
    type: dict
    default: {}
  node_taints:
    description: The Node's taints (C(key), C(value), C(effect)).
    type: list
    elements: dict
    default: []
  workloads:
    description:
      - Workloads as M(gpuharden.k8s.gpu_workloads_info) returns them; each needs C(kind) and C(name), and may have
        C(namespace), C(node_name), C(node_selector), C(tolerations), C(node_affinity) (required node selector terms),
        C(containers) and C(init_containers) (each C(name), C(gpus), C(sidecar)).
    type: list
    elements: dict
    default: []
  fail_on:
    description: Fail the task when a finding has this severity or a higher one; V(never) only reports.
    type: str
    choices: [never, info, warning, error, critical]
    default: never
seealso:
  - module: gpuharden.k8s.gpu_workloads_info
  - module: gpuharden.k8s.nvml_check
  - module: gpuharden.k8s.kubelet_config
"""

EXAMPLES = r"""
- name: Which GPU workloads can never be admitted on this node
  gpuharden.k8s.topology_check:
    node_name: "{{ inventory_hostname }}"
    gpus: "{{ ansible_facts.gpuharden.gpus }}"
    topology_manager_policy: single-numa-node
    cpu_manager_policy: static
    workloads: "{{ gpu_workloads.workloads }}"
    node_labels: "{{ gpu_workloads.nodes[inventory_hostname].labels }}"
    node_taints: "{{ gpu_workloads.nodes[inventory_hostname].taints }}"
  delegate_to: localhost
"""

RETURN = r"""
findings:
  description:
    - Like every gpuharden check's findings, each also has C(check), C(stage) (the harden stage it belongs to, or
      V(postcheck)) and C(remediable).
    - One entry per problem with C(id), C(severity), C(node), C(gpu), C(pod), C(expected), C(found), C(hint).
    - Ids are V(workload_cannot_fit_numa) (error; also C(workload) and C(fitting_policy)), V(gpu_numa_unknown)
      (warning), V(cpu_policy_not_static) (warning), V(topology_policy_no_alignment) (warning) and
      V(topology_policy_unknown) (info).
  returned: always
  type: list
  elements: dict
  sample: [{"id": "workload_cannot_fit_numa", "severity": "error", "node": "dgx-1", "gpu": null, "pod": null,
            "expected": {"max_gpus_per_container": 4, "numa_nodes": {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}},
            "found": {"workload": {"kind": "Deployment", "namespace": "ml", "name": "train-8g"}, "gpus": {"trainer": 8},
                      "scope": "container", "topologyManagerPolicy": "single-numa-node"},
            "fitting_policy": {"topologyManagerPolicy": "restricted"},
            "workload": {"kind": "Deployment", "namespace": "ml", "name": "train-8g"}, "hint": "..."}]
max_severity:
  description: The highest severity among the findings, or V(null).
  returned: always
  type: str
numa_nodes:
  description: GPU indexes per NUMA node (GPUs with a NUMA hint only).
  returned: always
  type: dict
  sample: {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
gpus_without_numa:
  description: Indexes of the GPUs whose NUMA node is V(-1) or unknown.
  returned: always
  type: list
  elements: int
max_gpus_per_numa_node:
  description: The most GPUs one NUMA node holds.
  returned: always
  type: int
workloads_landing:
  description: The GPU workloads (C(Kind namespace/name)) that can land on the node.
  returned: always
  type: list
  elements: str
workloads_blocked:
  description: Those of them the node can never admit under its policy.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _topology
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings, _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError


def argument_spec():
    return {
        "node_name": {"type": "str", "required": True},
        "gpus": {"type": "list", "elements": "dict", "required": True},
        "topology_manager_policy": {"type": "str"},
        "topology_manager_scope": {"type": "str", "default": "container"},
        "cpu_manager_policy": {"type": "str"},
        "node_labels": {"type": "dict", "default": {}},
        "node_taints": {"type": "list", "elements": "dict", "default": []},
        "workloads": {"type": "list", "elements": "dict", "default": []},
        "fail_on": {"type": "str", "choices": list(_findings.FAIL_CHOICES), "default": "never"},
    }


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def check(params):
    if not params["node_name"]:
        raise GpuhardenError("topology_check: option node_name is empty")
    return _topology.check_node(
        params["node_name"], params["gpus"], params["topology_manager_policy"] or None,
        scope=params["topology_manager_scope"], cpu_policy=params["cpu_manager_policy"] or None,
        workloads=params["workloads"], labels=params["node_labels"], taints=params["node_taints"])


def main():
    _module_shell.run_module(
        build_module(), lambda module: check(module.params), never_changed=True,
        fail_when=lambda params, result: _findings.fail_on_message("topology_check", result["findings"], params["fail_on"]))


if __name__ == "__main__":
    main()
