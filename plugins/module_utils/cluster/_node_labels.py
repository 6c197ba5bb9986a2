# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""GPU node labels and the dedicated-GPU taint: validation, the per-node plan, and ``reconcile``, which sends it.

``plan`` (pure) takes the Node objects of one paginated LIST and returns, for the nodes that need it, one merge
patch each (labels, and the whole taint list with the node's resourceVersion as precondition, because
``spec.taints`` is an atomic list).  ``reconcile`` plans over a LIST its caller made and, when told to apply, sends
the patches: module gpu_node_labels, and module device_plugin's ``node_labels`` option, which labels the nodes over
the same LIST of Nodes it picks the plugin's nodes from.  Label and taint syntax checks are shared with the other
cluster-side planners.
"""

from __future__ import annotations

import copy
import json
import re

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TAINT_STATES = ("present", "absent", "ignore")


def check_dns_subdomain(value, where):
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise GpuhardenError("%s=%r is not a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253)" % (where, value))
    return value


def check_dns_label(value, where):
    if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL.match(value):
        raise GpuhardenError("%s=%r is not a DNS label (lower-case letters, digits and '-', at most 63)" % (where, value))
    return value


def check_label_key(key, where):
    """A qualified name: optional DNS-subdomain prefix and '/', then a name of at most 63 characters."""
    if not isinstance(key, str) or not key:
        raise GpuhardenError("%s: label key %r is empty or not a string" % (where, key))
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise GpuhardenError("%s: label key %r: prefix %r is not a DNS subdomain" % (where, key, prefix))
    if len(name) > 63 or not _NAME.match(name):
        raise GpuhardenError("%s: label key %r: name %r must be 1-63 letters, digits, '-', '_' or '.', "
                             "beginning and ending with a letter or digit" % (where, key, name))
    return key


def passes(check, value):
    """Whether ``value`` passes ``check`` (check_dns_label, check_dns_subdomain, check_label_key), for a caller that
    words its own refusal (a role's preflight, the bootstrap's settings)."""
    try:
        check(value, "")
    except GpuhardenError:
        return False
    return True


def check_label_value(key, value, where):
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise GpuhardenError("%s: label %s: value %r must be a string (quote true/false in YAML)" % (where, key, value))
    text = str(value)
    if text and (len(text) > 63 or not _NAME.match(text)):
        raise GpuhardenError("%s: label %s: value %r must be empty or 1-63 letters, digits, '-', '_' or '.', "
                             "beginning and ending with a letter or digit" % (where, key, text))
    return text


def check_labels(labels, where):
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise GpuhardenError("%s must be a mapping of label keys to values, not %s" % (where, type(labels).__name__))
    return {check_label_key(key, where): check_label_value(key, value, where) for key, value in labels.items()}


def check_taint(key, value, effect, where):
    check_label_key(key, where + " taint_key")
    value = check_label_value(key, value or "", where + " taint_value")
    if effect not in TAINT_EFFECTS:
        raise GpuhardenError("%s: taint_effect=%r is not one of %s" % (where, effect, ", ".join(TAINT_EFFECTS)))
    return {"key": key, "value": value, "effect": effect}


def check_tolerations(tolerations, where):
    if tolerations is None:
        return []
    if not isinstance(tolerations, list):
        raise GpuhardenError("%s must be a list of tolerations, not %s" % (where, type(tolerations).__name__))
    out = []
    for index, toleration in enumerate(tolerations):
        here = "%s[%d]" % (where, index)
        if not isinstance(toleration, dict):
            raise GpuhardenError("%s=%r is not a toleration mapping" % (here, toleration))
        unknown = set(toleration) - {"key", "operator", "value", "effect", "tolerationSeconds"}
        if unknown:
            raise GpuhardenError("%s: unknown toleration field(s) %s (fields: key, operator, value, effect, tolerationSeconds)"
                                 % (here, ", ".join(sorted(unknown))))
        operator = toleration.get("operator", "Equal")
        if operator not in ("Equal", "Exists"):
            raise GpuhardenError("%s: operator=%r is not Equal or Exists" % (here, operator))
        if operator == "Exists" and toleration.get("value"):
            raise GpuhardenError("%s: operator Exists takes no value (value=%r)" % (here, toleration["value"]))
        if toleration.get("key"):
            check_label_key(toleration["key"], here)
        elif operator != "Exists":
            raise GpuhardenError("%s: a toleration without key must use operator Exists" % here)
        if toleration.get("effect") not in (None, "") + TAINT_EFFECTS:
            raise GpuhardenError("%s: effect=%r is not one of %s" % (here, toleration.get("effect"), ", ".join(TAINT_EFFECTS)))
        out.append({key: value for key, value in toleration.items() if value not in (None, "")} if operator == "Exists"
                   else {key: value for key, value in toleration.items() if value is not None})
    return out


# The options of module gpu_node_labels, which are also the sub-options of module device_plugin's node_labels: one spec.
LABEL_OPTIONS = {
    "nodes": {"type": "list", "elements": "str", "default": []},
    "unlabel_nodes": {"type": "list", "elements": "str", "default": []},
    "labels": {"type": "dict", "default": {"nvidia.com/gpu.present": "true"}},
    "taint": {"type": "str", "default": "ignore", "choices": list(TAINT_STATES)},
    "taint_key": {"type": "str", "default": "nvidia.com/gpu", "no_log": False},  # a taint key, not a secret
    "taint_value": {"type": "str", "default": ""},
    "taint_effect": {"type": "str", "default": "NoSchedule", "choices": list(TAINT_EFFECTS)},
}


def check_params(params, module="gpu_node_labels", option=""):
    """Validated options: (nodes, unlabel_nodes, labels, taint spec or None, taint state).  ``option`` names the
    mapping that holds them (device_plugin's ``node_labels``), so that an error names the option as written."""
    within = "%s." % option if option else ""
    nodes = [check_dns_subdomain(name, "option %snodes" % within) for name in params.get("nodes") or []]
    unlabel = [check_dns_subdomain(name, "option %sunlabel_nodes" % within) for name in params.get("unlabel_nodes") or []]
    both = sorted(set(nodes) & set(unlabel))
    if both:
        raise GpuhardenError("%s: node(s) %s are both in %snodes and in %sunlabel_nodes" % (module, ", ".join(both), within, within))
    labels = check_labels(params.get("labels"), "option %slabels" % within)
    if not labels and params.get("taint", "ignore") == "ignore":
        raise GpuhardenError("%s: option %slabels is empty and %staint=ignore: nothing to manage" % (module, within, within))
    state = params.get("taint", "ignore")
    if state not in TAINT_STATES:
        raise GpuhardenError("%s: option %staint=%r is not one of %s" % (module, within, state, ", ".join(TAINT_STATES)))
    taint = check_taint(params.get("taint_key") or "", params.get("taint_value"), params.get("taint_effect"),
                        "option %s" % option if option else "option") if state != "ignore" else None
    return nodes, unlabel, labels, taint, state


ORIGINALS_ANNOTATION = "gpuharden.io/originals"


def _taint_id(taint):
    return "%s:%s" % (taint.get("key"), taint.get("effect"))


def read_originals(meta):
    """The labels and taints gpuharden set on a Node, with what was there before: {labels: {key: {original, set}},
    taints: {key:effect: {original, set}}} from its annotation; an unreadable annotation reads as none recorded."""
    text = ((meta or {}).get("annotations") or {}).get(ORIGINALS_ANNOTATION)
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    return {"labels": dict(data.get("labels") or {}), "taints": dict(data.get("taints") or {})}


def record_originals(meta, patch_labels, taints, new_taints):
    """The annotation value that keeps, for the uninstall, what each label and taint gpuharden *sets* was before its
    first change (None when nothing new is set).  Labels and taints gpuharden removes (the bootstrap taint, the GPU
    label of CPU-only nodes) are not recorded: the uninstall never takes a node out of service again."""
    live_labels = (meta or {}).get("labels") or {}
    recorded = read_originals(meta)
    changed = False
    for key, value in sorted(patch_labels.items()):
        if value is None:
            continue
        entry = recorded["labels"].get(key)
        if entry is None:
            entry = recorded["labels"][key] = {"original": live_labels.get(key)}
        entry["set"] = value
        changed = True
    before = {_taint_id(t): t for t in taints}
    for taint in new_taints or []:
        ident = _taint_id(taint)
        if before.get(ident) == taint:
            continue
        entry = recorded["taints"].get(ident)
        if entry is None:
            entry = recorded["taints"][ident] = {"original": before.get(ident)}
        entry["set"] = taint
        changed = True
    if not changed:
        return None
    return json.dumps(recorded, sort_keys=True, separators=(",", ":"))


def _same_taint(a, b):
    return a.get("key") == b.get("key") and a.get("effect") == b.get("effect")


def node_plan(node, labels, taint, state, unlabel=False):
    """The merge patch one Node needs (None when none) and a before/after view of the managed fields."""
    meta = node.get("metadata") or {}
    live_labels = meta.get("labels") or {}
    taints = list((node.get("spec") or {}).get("taints") or [])
    patch_labels = {}
    for key, value in labels.items():
        if unlabel:
            if key in live_labels:
                patch_labels[key] = None
        elif live_labels.get(key) != value:
            patch_labels[key] = value
    new_taints = taints
    wanted_state = "ignore" if unlabel else state  # taints on non-GPU nodes are left alone
    if taint is not None and wanted_state != "ignore":
        others = [t for t in taints if not _same_taint(t, taint)]
        if wanted_state == "present":
            mine = [t for t in taints if _same_taint(t, taint)]
            if not (len(mine) == 1 and (mine[0].get("value") or "") == taint["value"]):
                new_taints = others + [{key: value for key, value in taint.items() if value != "" or key != "value"}]
        else:
            new_taints = others
    patch = {}
    if patch_labels:
        patch.setdefault("metadata", {})["labels"] = patch_labels
    if new_taints != taints:
        patch.setdefault("metadata", {})["resourceVersion"] = meta.get("resourceVersion")  # atomic list: precondition
        patch["spec"] = {"taints": new_taints or None}
    originals = record_originals(meta, patch_labels, taints, new_taints)
    if originals is not None:
        patch.setdefault("metadata", {})["annotations"] = {ORIGINALS_ANNOTATION: originals}
    managed = sorted(labels)
    before = {"labels": {key: live_labels[key] for key in managed if key in live_labels}}
    after_labels = dict(before["labels"])
    for key, value in patch_labels.items():
        if value is None:
            after_labels.pop(key, None)
        else:
            after_labels[key] = value
    after = {"labels": after_labels}
    if taint is not None:
        before["taints"] = [t for t in taints if t.get("key") == taint["key"]]
        after["taints"] = [t for t in new_taints if t.get("key") == taint["key"]]
    return (patch or None), before, after


def plan(live_nodes, nodes, unlabel_nodes, labels, taint, state):
    """Per-node patches for the named nodes, from one LIST of Node objects; fails on names that are not Nodes."""
    by_name = {(n.get("metadata") or {}).get("name"): n for n in live_nodes}
    missing = sorted(name for name in list(nodes) + list(unlabel_nodes) if name not in by_name)
    if missing:
        raise GpuhardenError("gpu_node_labels: no Node object named %s (set gpuharden_k8s_node_name for hosts whose "
                             "inventory name differs from the node name); nothing was changed"
                             % ", ".join(missing), missing_nodes=missing)
    patches, before, after = {}, {}, {}
    for names, unlabel in ((nodes, False), (unlabel_nodes, True)):
        for name in sorted(set(names)):
            patch, node_before, node_after = node_plan(by_name[name], labels, taint, state, unlabel=unlabel)
            if patch:
                patches[name] = patch
                before[name], after[name] = node_before, node_after
    return patches, before, after


MAX_CONFLICT_RETRIES = 3


def merge_patched(obj, patch):
    """``obj`` as a JSON merge patch leaves it: a mapping merges key by key, null removes the key, anything else (such
    as the atomic ``spec.taints``) replaces.  RFC 7396, which the API server applies to an application/merge-patch+json
    body through evanphx/json-patch's MergePatch (kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/handlers/
    patch.go, jsonPatcher); the lab's device plugin test compares this prediction with the real API server's answer."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(obj) if isinstance(obj, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patched(merged.get(key), value)
    return merged


def patch_node(client, name, patch, labels, taint, state, unlabel):
    """Send one node's patch and return the Node the server stored; on a resourceVersion conflict (taints only: the
    patch carries it as a precondition) re-read the node and recompute."""
    for _attempt in range(MAX_CONFLICT_RETRIES):
        try:
            return client.merge_patch("Node", name, patch, dry_run=False)
        except GpuhardenError as error:
            if error.result.get("status") != 409:
                raise
        node = client.read("Node", name)
        if node is None:
            raise GpuhardenError("gpu_node_labels: Node %s disappeared while it was being labelled" % name)
        patch, _before, _after = node_plan(node, labels, taint, state, unlabel=unlabel)
        if patch is None:
            return node
    raise GpuhardenError("gpu_node_labels: Node %s kept changing; its taints were not updated after %d attempts" % (name, MAX_CONFLICT_RETRIES))


def reconcile(client, live_nodes, checked, apply):
    """The labels and taints ``checked`` (check_params' answer) over ``live_nodes`` (one LIST of Nodes), sent when
    ``apply``: (result, nodes).  ``result`` is what module gpu_node_labels returns (changed, changed_nodes, and each
    changed node's managed labels and taints before and after); ``nodes`` is the LIST as it stands afterwards, with
    the server's answer for each patched Node (in check mode the Node the patch would leave), so that a caller that
    selects nodes by these labels needs no second LIST."""
    nodes, unlabel, labels, taint, state = checked
    patches, before, after = plan(live_nodes, nodes, unlabel, labels, taint, state)
    unlabel_set = set(unlabel)
    by_name = {(node.get("metadata") or {}).get("name"): node for node in live_nodes}
    updated = {}
    for name in sorted(patches):
        try:
            updated[name] = (patch_node(client, name, patches[name], labels, taint, state, name in unlabel_set) if apply
                             else merge_patched(by_name[name], patches[name]))
        except GpuhardenError as error:
            # the nodes patched before this one stay patched: the failed task says which
            error.result.setdefault("changed", bool(updated))
            error.result.setdefault("changed_nodes", sorted(updated))
            raise
    result = {"changed": bool(patches), "changed_nodes": sorted(patches),
              "nodes": {name: {"before": before[name], "after": after[name]} for name in sorted(patches)}}
    return result, [updated.get((node.get("metadata") or {}).get("name"), node) for node in live_nodes]


def diff(result, dump):
    """The diff entry of a reconcile result (``dump`` renders a mapping: YAML where the controller has it)."""
    return {"before": dump({name: entry["before"] for name, entry in result["nodes"].items()}),
            "after": dump({name: entry["after"] for name, entry in result["nodes"].items()}),
            "before_header": "Nodes (live)", "after_header": "Nodes (desired)"}
