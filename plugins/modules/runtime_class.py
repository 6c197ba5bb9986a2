#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: runtime_class
short_description: Ensure the NVIDIA RuntimeClass matches containerd's runtime, and find podFixed GPU traps
version_added: 0.1.0
description:
  - Applies the RuntimeClass O(name) (C(node.k8s.io/v1)) with C(handler) O(handler), which must be the containerd runtime
    name the node side configured (role C(container_runtime) sets the fact C(container_runtime_handler)), and the optional
    C(scheduling.nodeSelector), C(scheduling.tolerations) and C(overhead.podFixed), with server-side apply (field manager
    C(gpuharden)). A RuntimeClass of that name that gpuharden never applied is adopted (replaced, then applied).
  - C(handler) is immutable. A live RuntimeClass with another handler is deleted and created again only with O(force);
    without it the module fails, naming both handlers, and changes nothing.
  - Refuses O(overhead_pod_fixed) with C(nvidia.com/*) (or any other extended resource) - the RuntimeClass admission
    plugin copies podFixed into every pod's overhead, which the scheduler and ResourceQuota add to each resource while
    devices go only to containers, so every pod would be charged phantom GPUs.
  - Lists every RuntimeClass (one paginated LIST) and reports those with GPUs in C(overhead.podFixed).
  - Lists the Nodes (one paginated LIST) and reports each target Node whose C(status.runtimeHandlers) lacks O(handler) -
    containerd there has no such runtime, and pods with this C(runtimeClassName) fail at sandbox creation. The target
    Nodes are those matching O(node_selector) when it is set, else the GPU nodes (label C(nvidia.com/gpu.present=true) or
    any C(nvidia.com/*) resource), narrowed to O(nodes) when given. The kubelet fills C(status.runtimeHandlers) from
    Kubernetes 1.31 with containerd 2.x; a Node without the field (an older kubelet, containerd 1.7, a kwok node) is not
    checked and is returned in RV(node_runtime_handlers.without_runtime_handlers). Role C(container_runtime) fixes such a
    node; this module never does. Read-only, the same in check mode.
  - Check mode sends the writes with C(dryRun=All) (a delete + create is predicted, as the server refuses a dry-run create
    while the old object exists). Runs on the controller.
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
  name:
    description: Name of the RuntimeClass (the pods' C(runtimeClassName)).
    type: str
    default: nvidia
  handler:
    description: The containerd runtime name (a DNS label), for example the C(container_runtime_handler) fact.
    type: str
    default: nvidia
  node_selector:
    description: C(scheduling.nodeSelector), merged into the selector of the pods that use the RuntimeClass.
    type: dict
    default: {}
  tolerations:
    description: C(scheduling.tolerations), appended to those pods' tolerations.
    type: list
    elements: dict
    default: []
  overhead_pod_fixed:
    description: C(overhead.podFixed), cpu/memory quantities only.
    type: dict
    default: {}
  force:
    description: Delete and create the RuntimeClass when its immutable handler differs.
    type: bool
    default: false
  force_conflicts:
    description: Take over fields another field manager set (server-side apply C(force)).
    type: bool
    default: true
  nodes:
    description:
      - Check only the Nodes of these names for the handler (for example the play's GPU hosts as Node names). They are
        taken as GPU nodes even without the label or resources, but must still match O(node_selector) when it is set.
      - Empty checks every target Node.
    type: list
    elements: str
    default: []
  page_limit:
    description: Objects per page of the LISTs.
    type: int
    default: 500
requirements:
  - kubernetes (Python client) on the controller
seealso:
  - module: gpuharden.k8s.containerd_nvidia_runtime
  - module: gpuharden.k8s.device_plugin
"""

EXAMPLES = r"""
- name: RuntimeClass nvidia for containerd's runtime, replacing a wrong handler
  gpuharden.k8s.runtime_class:
    handler: "{{ container_runtime_handler | default('nvidia') }}"
    node_selector: {nvidia.com/gpu.present: "true"}
    force: true
  delegate_to: localhost
  run_once: true

- name: Which GPU nodes of the inventory lack containerd's nvidia runtime (read-only; inventory names are Node names here)
  gpuharden.k8s.runtime_class:
    nodes: "{{ groups['gpu_nodes'] }}"
  check_mode: true
  delegate_to: localhost
  run_once: true
  register: runtime_class_check
"""

RETURN = r"""
findings:
  description:
    - C(runtime_class_overhead_gpu) (GPUs in podFixed), C(runtime_class_overhead_extended), C(runtime_class_handler_mismatch),
      in the findings model of every check (C(id), C(check), C(stage), C(severity), C(expected), C(found), C(hint),
      C(remediable)) with C(subject) (the object) and C(repair).
    - C(runtime_class_handler_missing_on_node) (severity error, C(subject) C(Node <name>)), one per target Node whose
      C(status.runtimeHandlers) lacks the handler; C(expected) is the handler, C(found) the Node's handler names (V("")
      is containerd's default runtime), C(repair) V(container_runtime) (the node-side role; this module does not repair it).
  returned: always
  type: list
  elements: dict
action:
  description:
    - What was (or in check mode would be) done, none, create, update, adopt or recreate.
    - V(skip) when the RuntimeClass is managed by another installer (the GPU Operator, Helm, a GitOps tool or another
      controller); it is then left as it is and reported as finding C(runtime_class_managed_by_other_installer).
  returned: always
  type: str
  sample: recreate
runtime_class:
  description: The RuntimeClass as stored (the prediction in check mode), without managedFields.
  returned: always
  type: dict
node_runtime_handlers:
  description: Which target Nodes had their C(status.runtimeHandlers) compared with the handler.
  returned: always
  type: dict
  contains:
    checked:
      description: Target Nodes that report C(status.runtimeHandlers).
      type: list
      elements: str
    without_runtime_handlers:
      description: Target Nodes that do not report the field (kubelet before 1.31, containerd 1.7, kwok nodes); not checked.
      type: list
      elements: str
    not_registered:
      description: Names in O(nodes) that no Node has.
      type: list
      elements: str
  sample: {"checked": ["gpu-0"], "without_runtime_handlers": ["gpu-1"], "not_registered": []}
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
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _runtime_class
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_objects


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(copy.deepcopy(_runtime_class.OBJECT_OPTIONS))
    spec.update(
        force={"type": "bool", "default": False},
        force_conflicts={"type": "bool", "default": True},
        nodes={"type": "list", "elements": "str", "default": []},
        page_limit={"type": "int", "default": 500},
    )
    return spec


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def run(module):
    params = module.params
    if params["page_limit"] is None or params["page_limit"] < 1:
        raise GpuhardenError("runtime_class: option page_limit=%r must be a positive number of objects" % params["page_limit"])
    desired = _runtime_class.check_params(params)
    client = _k8s_objects.Client(_k8s.api_client(params), "runtime_class")
    try:
        result, decision = _runtime_class.reconcile(client, desired, names=params["nodes"], page_limit=params["page_limit"],
                                                    force=params["force"], force_conflicts=params["force_conflicts"],
                                                    apply=not module.check_mode)
    except GpuhardenError as error:
        error.result.setdefault("api_requests", client.requests)
        raise
    finally:
        client.api.close()
    result["api_requests"] = client.requests
    if module._diff and decision["changed"]:
        result["diff"] = _k8s_objects.diff_entry(decision, desired)
    for finding in result["findings"]:
        if finding["severity"] == "error" and finding["repair"] == "manual":
            module.warn(finding["hint"])
    return result


def main():
    _module_shell.run_module(build_module(), run, requires=[_k8s.REQUIREMENT], counters=_k8s.RESULT_COUNTERS)


if __name__ == "__main__":
    main()
