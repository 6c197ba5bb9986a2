#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_node_labels
short_description: Label GPU nodes (and optionally taint them) for the device plugin's node selector, many nodes per call
version_added: 0.1.0
description:
  - Sets O(labels) on the Nodes O(nodes) (by default C(nvidia.com/gpu.present=true), what M(gpuharden.k8s.device_plugin)
    selects), removes those labels from O(unlabel_nodes) (CPU-only nodes, so the plugin does not land there), and with
    O(taint) adds or removes the dedicated-GPU taint (C(nvidia.com/gpu:NoSchedule) by default) on O(nodes).
  - Reads all Nodes with one paginated LIST (never one GET per node) and sends one merge patch per node that needs a
    change. C(spec.taints) is an atomic list, so a taint change carries the node's resourceVersion as precondition and
    is recomputed from a fresh read when the node changed meanwhile. Other labels and taints are never touched.
  - Fails, changing nothing, when a name is not a Node; map inventory hosts to Node names with C(gpuharden_k8s_node_name).
  - Check mode predicts the patches from the LIST (labels and taints are plain values; no dry-run request per node).
  - Runs on the controller (C(delegate_to=localhost), C(run_once)).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._k8s_auth
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
options:
  nodes:
    description: Names of the GPU nodes (C(metadata.name) of the Node objects).
    type: list
    elements: str
    default: []
  unlabel_nodes:
    description: Names of nodes that must not carry O(labels) (CPU-only nodes); their taints are left alone.
    type: list
    elements: str
    default: []
  labels:
    description: Labels the GPU nodes must have.
    type: dict
    default: {nvidia.com/gpu.present: "true"}
  taint:
    description: V(present) adds the taint to O(nodes), V(absent) removes it, V(ignore) leaves taints alone.
    type: str
    default: ignore
    choices: [present, absent, ignore]
  taint_key:
    description: Key of the dedicated-GPU taint.
    type: str
    default: nvidia.com/gpu
  taint_value:
    description: Value of the taint (empty for none).
    type: str
    default: ""
  taint_effect:
    description: Effect of the taint.
    type: str
    default: NoSchedule
    choices: [NoSchedule, PreferNoSchedule, NoExecute]
  page_limit:
    description: Nodes per page of the LIST.
    type: int
    default: 500
requirements:
  - kubernetes (Python client) on the controller
seealso:
  - module: gpuharden.k8s.device_plugin
"""

EXAMPLES = r"""
- name: Label every GPU host of the play, in one call
  gpuharden.k8s.gpu_node_labels:
    nodes: "{{ ansible_play_hosts | map('extract', hostvars, 'gpuharden_k8s_node_name') }}"
  delegate_to: localhost
  run_once: true

- name: Dedicated GPU nodes
  gpuharden.k8s.gpu_node_labels:
    nodes: [gpu-1, gpu-2]
    taint: present
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
changed_nodes:
  description: The nodes patched (or, in check mode, that would be).
  returned: always
  type: list
  elements: str
nodes:
  description: Per changed node, C(before) and C(after) of the managed labels and taints.
  returned: always
  type: dict
api_requests:
  description: Requests made to the API server.
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

import copy

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _node_labels
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_objects


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(copy.deepcopy(_node_labels.LABEL_OPTIONS))
    spec.update(page_limit={"type": "int", "default": 500})
    return spec


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def run(module):
    params = module.params
    if params["page_limit"] is None or params["page_limit"] < 1:
        raise GpuhardenError("gpu_node_labels: option page_limit=%r must be a positive number of nodes" % params["page_limit"])
    checked = _node_labels.check_params(params)
    if not checked[0] and not checked[1]:
        return {"changed": False, "changed_nodes": [], "nodes": {}, "api_requests": 0}
    client = _k8s_objects.Client(_k8s.api_client(params), "gpu_node_labels")
    try:
        result, _nodes = _node_labels.reconcile(client, client.list("Node", params["page_limit"]), checked, apply=not module.check_mode)
    except GpuhardenError as error:
        error.result.setdefault("api_requests", client.requests)
        raise
    finally:
        client.api.close()
    result["api_requests"] = client.requests
    if module._diff and result["changed"]:
        result["diff"] = _node_labels.diff(result, _k8s_objects.dump)
    return result


def main():
    _module_shell.run_module(build_module(), run, requires=[_k8s.REQUIREMENT], counters=_k8s.RESULT_COUNTERS)


if __name__ == "__main__":
    main()
