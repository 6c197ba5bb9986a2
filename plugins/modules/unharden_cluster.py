#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: unharden_cluster
short_description: Take gpuharden's labels, taints and objects off the cluster, leaving everybody else's
version_added: 0.2.0
description:
  - "Nodes: M(gpuharden.k8s.gpu_node_labels) records in the Node annotation C(gpuharden.io/originals) each label
    and taint it sets, with what was there before. For the Nodes O(nodes) this module puts the original back where
    the Node still carries what gpuharden set (a label or taint that was not there is removed), leaves one changed
    since as it is (RV(conflicts), and its entry stays in the annotation; O(force=true) restores it anyway), and
    removes the annotation once nothing is left in it. Labels and taints gpuharden removed (the bootstrap taint,
    the GPU label of CPU-only nodes) are not put back."
  - "Objects: removes the DaemonSets, ConfigMaps and RuntimeClasses labelled C(app.kubernetes.io/managed-by:
    gpuharden) that gpuharden applied (its server-side apply entry in managedFields): the device plugin, its
    ConfigMap, gpu-feature-discovery, the RuntimeClass. Objects of other installers (GPU Operator, Helm, GitOps)
    carry neither and are never touched. While Nodes outside O(nodes) still carry gpuharden's labels the objects
    are kept (those nodes still use them) and reported in RV(objects_kept)."
  - Reads all Nodes and each object kind with one paginated LIST each. Check mode predicts the Node patches from
    the LIST and sends the deletions with C(dryRun=All). Runs on the controller.
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
    description: Names of the Nodes whose labels and taints are put back (C(metadata.name)).
    type: list
    elements: str
    default: []
  force:
    description: Also put back labels and taints changed since gpuharden set them.
    type: bool
    default: false
  remove_objects:
    description: Remove gpuharden's DaemonSets, ConfigMaps and RuntimeClasses.
    type: bool
    default: true
  namespace:
    description:
      - The device plugin's namespace, where gpuharden's ConfigMaps are looked for (besides the namespaces of its
        DaemonSets).
    type: str
    default: kube-system
  page_limit:
    description: Objects per LIST page.
    type: int
    default: 500
seealso:
  - module: gpuharden.k8s.unharden_files
  - module: gpuharden.k8s.gpu_node_labels
"""

EXAMPLES = r"""
- name: Take gpuharden off the cluster (once for the play)
  gpuharden.k8s.unharden_cluster:
    nodes: [gpu-0, gpu-1]
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
nodes:
  description: Per changed Node, C(before) and C(after) of the recorded labels and taints (V(null) is absent).
  returned: always
  type: dict
  sample: {"gpu-0": {"before": {"labels": {"nvidia.com/gpu.present": "true"}, "taints": {}},
                     "after": {"labels": {"nvidia.com/gpu.present": null}, "taints": {}}}}
conflicts:
  description: Labels and taints left as they are, with C(node), C(label) or C(taint), C(value) and C(reason).
  returned: always
  type: list
  elements: dict
objects_removed:
  description: The objects removed (in check mode, that would be), as C(Kind namespace/name).
  returned: always
  type: list
  elements: str
objects_kept:
  description: gpuharden's objects kept, with C(object) and C(reason).
  returned: always
  type: list
  elements: dict
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

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _unharden_cluster
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._node_labels import check_dns_subdomain
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_objects


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(
        nodes={"type": "list", "elements": "str", "default": []},
        force={"type": "bool", "default": False},
        remove_objects={"type": "bool", "default": True},
        namespace={"type": "str", "default": "kube-system"},
        page_limit={"type": "int", "default": 500},
    )
    return spec


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def _read(client, page_limit, namespace):
    """All Nodes; gpuharden's DaemonSets and RuntimeClasses everywhere, its ConfigMaps in ``namespace`` and in the
    namespaces of its DaemonSets (the shipped RBAC grants ConfigMaps only in the device plugin's namespace)."""
    live_nodes = client.list("Node", page_limit)
    selector = "%s=%s" % (_unharden_cluster.MANAGED_BY, _unharden_cluster.MANAGER)
    objects = []
    for kind in ("DaemonSet", "RuntimeClass"):
        for obj in client.list(kind, page_limit, label_selector=selector):
            objects.append(dict(obj, kind=kind))
    namespaces = {namespace} | {obj["metadata"].get("namespace") for obj in objects
                                if obj["kind"] == "DaemonSet" and _unharden_cluster.ours(obj)}
    for name in sorted(n for n in namespaces if n):
        for obj in client.list("ConfigMap", page_limit, namespace=name, label_selector=selector):
            objects.append(dict(obj, kind="ConfigMap"))
    return live_nodes, objects


def run(module):
    params = module.params
    if params["page_limit"] is None or params["page_limit"] < 1:
        raise GpuhardenError("unharden_cluster: option page_limit=%r must be a positive number" % params["page_limit"])
    names = [check_dns_subdomain(name, "unharden_cluster: option nodes") for name in params["nodes"]]
    client = _k8s_objects.Client(_k8s.api_client(params), "unharden_cluster")
    try:
        live_nodes, objects = _read(client, params["page_limit"], params["namespace"])
        plan = _unharden_cluster.plan(live_nodes, names, objects, force=params["force"], remove_objects=params["remove_objects"])
        if plan["missing"]:
            module.warn("unharden_cluster: no Node named %s: nothing to put back there" % ", ".join(plan["missing"]))
        for name in sorted(plan["patches"]):
            if not module.check_mode:
                client.merge_patch("Node", name, plan["patches"][name], dry_run=False)
        for obj in plan["remove"]:
            meta = obj["metadata"]
            client.delete(obj["kind"], meta["name"], meta.get("namespace"), dry_run=module.check_mode)
    except GpuhardenError as error:
        error.result.setdefault("api_requests", client.requests)
        raise
    finally:
        client.api.close()
    for conflict in plan["conflicts"]:
        module.warn("Node %s: %s" % (conflict["node"], conflict["reason"]))
    removed = [_k8s_objects.describe(obj) for obj in plan["remove"]]
    result = {"changed": bool(plan["patches"] or removed), "nodes": plan["nodes"], "conflicts": plan["conflicts"],
              "objects_removed": removed, "objects_kept": plan["kept"], "api_requests": client.requests}
    if module._diff and result["changed"]:
        result["diff"] = [{"before": _k8s_objects.for_diff(obj), "after": "", "before_header": _k8s_objects.describe(obj),
                           "after_header": "%s (removed)" % _k8s_objects.describe(obj)} for obj in plan["remove"]]
        if plan["nodes"]:
            before = {name: view["before"] for name, view in plan["nodes"].items()}
            after = {name: view["after"] for name, view in plan["nodes"].items()}
            result["diff"].append({"before": _dump(before), "after": _dump(after),
                                   "before_header": "Nodes (live)", "after_header": "Nodes (restored)"})
    return result


def _dump(data):
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main():
    _module_shell.run_module(build_module(), run, requires=[_k8s.REQUIREMENT], counters=_k8s.RESULT_COUNTERS)


if __name__ == "__main__":
    main()
