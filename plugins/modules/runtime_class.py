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
  page_limit:
    description: Objects per page of the LIST.
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
"""

RETURN = r"""
findings:
  description:
    - C(runtime_class_overhead_gpu) (GPUs in podFixed), C(runtime_class_overhead_extended), C(runtime_class_handler_mismatch),
      as C(id), C(severity), C(object), C(message), C(expected), C(actual), C(repair).
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
api_requests:
  description: Requests made to the API server.
  returned: always
  type: int
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuharden.k8s.plugins.module_utils import _k8s, _k8s_objects, _runtime_class
from ansible_collections.gpuharden.k8s.plugins.module_utils._errors import GpuhardenError


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(
        name={"type": "str", "default": "nvidia"},
        handler={"type": "str", "default": "nvidia"},
        node_selector={"type": "dict", "default": {}},
        tolerations={"type": "list", "elements": "dict", "default": []},
        overhead_pod_fixed={"type": "dict", "default": {}},
        force={"type": "bool", "default": False},
        force_conflicts={"type": "bool", "default": True},
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
        findings = _runtime_class.audit(client.list("RuntimeClass", params["page_limit"]), desired)
        decision = _k8s_objects.plan(client, desired, params["force_conflicts"], _runtime_class.handler_immutable)
        foreign = _runtime_class.owned_elsewhere(decision)
        if foreign is not None:
            findings.append(foreign)
            decision = dict(decision, action="skip", changed=False, message=foreign["message"])
        if decision["action"] == "recreate":
            if not params["force"]:
                raise GpuhardenError(decision["message"], findings=findings)
            client.delete("RuntimeClass", desired["metadata"]["name"], None, dry_run=True)
        stored = None
        if not module.check_mode and decision["action"] != "skip":
            stored = _k8s_objects.execute(client, desired, decision, params["force_conflicts"], recreate=params["force"])
    except GpuhardenError as error:
        error.result.setdefault("api_requests", client.requests)
        raise
    finally:
        client.api.close()
    shown = _k8s_objects.comparable(stored if stored is not None else decision["after"] if decision["action"] not in ("none", "skip")
                                    else decision["live"])
    result = {"changed": decision["changed"], "action": decision["action"], "findings": findings, "runtime_class": shown,
              "message": decision["message"], "api_requests": client.requests}
    if module._diff and decision["changed"]:
        result["diff"] = _k8s_objects.diff_entry(decision, desired)
    return result


def main():
    module = build_module()
    if not _k8s.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=_k8s.KUBERNETES_IMPORT_ERROR)
    try:
        result = run(module)
    except GpuhardenError as error:
        module.fail_json(msg=error.msg, exception=traceback.format_exc(), **error.result)
    for finding in result["findings"]:
        if finding["severity"] == "error" and finding["repair"] == "manual":
            module.warn(finding["message"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
