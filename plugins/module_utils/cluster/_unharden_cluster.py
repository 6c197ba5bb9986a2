# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The uninstall's cluster side (pure): which Node labels and taints go back, which objects go.

Nodes: ``gpu_node_labels`` records, in the annotation ``gpuharden.io/originals``, what each label and taint it sets
was before its first change and what it set.  Per entry: the Node still carries what gpuharden set -> the original
comes back (a label or taint that was not there is removed); it carries the original already -> nothing; anything
else (someone changed it since) -> a conflict, left as it is, its entry kept in the annotation (``force`` restores).
The annotation goes once nothing is left in it.  Labels and taints gpuharden removed are not recorded, so never
put back (the bootstrap taint, the GPU label of a CPU-only node).

Objects: DaemonSets, ConfigMaps and RuntimeClasses labelled ``app.kubernetes.io/managed-by: gpuharden`` *and*
holding gpuharden's server-side apply entry in managedFields are gpuharden's (the device plugin, its ConfigMap,
gpu-feature-discovery, the RuntimeClass); another installer's objects carry neither and are never touched.  They
go only when no Node outside this run still carries gpuharden's labels (those nodes still use them).
"""

from __future__ import annotations

import json

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._node_labels import ORIGINALS_ANNOTATION, read_originals
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s_objects

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpuharden"
OBJECT_KINDS = ("DaemonSet", "ConfigMap", "RuntimeClass")


def _taint_id(taint):
    return "%s:%s" % (taint.get("key"), taint.get("effect"))


def _same_taint(a, b):
    """Equal as the API stores them (an empty value is left out; timeAdded is the server's)."""
    if a is None or b is None:
        return a is None and b is None
    return (a.get("key"), a.get("value") or "", a.get("effect")) == (b.get("key"), b.get("value") or "", b.get("effect"))


def recorded(node):
    """Whether gpuharden recorded anything on this Node."""
    return ORIGINALS_ANNOTATION in (((node or {}).get("metadata") or {}).get("annotations") or {})


def node_plan(node, force=False):
    """(merge patch or None, {before, after, conflicts}) that puts back what gpuharden set on one Node."""
    meta = node.get("metadata") or {}
    if not recorded(node):
        return None, {"before": {}, "after": {}, "conflicts": []}
    originals = read_originals(meta)
    live_labels = meta.get("labels") or {}
    taints = list((node.get("spec") or {}).get("taints") or [])
    keep = {"labels": {}, "taints": {}}
    conflicts = []
    patch_labels = {}
    before = {"labels": {}, "taints": {}}
    after = {"labels": {}, "taints": {}}
    for key, entry in sorted(originals["labels"].items()):
        live = live_labels.get(key)
        before["labels"][key] = after["labels"][key] = live
        if live == entry.get("original"):
            continue
        if live == entry.get("set") or force:
            patch_labels[key] = entry.get("original")
            after["labels"][key] = entry.get("original")
        else:
            keep["labels"][key] = entry
            conflicts.append({"node": meta.get("name"), "label": key, "value": live, "gpuharden_set": entry.get("set"),
                              "reason": "label %s=%s was changed since gpuharden set it to %s: left as it is"
                                        % (key, live, entry.get("set"))})
    new_taints = list(taints)
    for ident, entry in sorted(originals["taints"].items()):
        live = next((t for t in new_taints if _taint_id(t) == ident), None)
        before["taints"][ident] = after["taints"][ident] = live
        if _same_taint(live, entry.get("original")):
            continue
        if _same_taint(live, entry.get("set")) or force:
            new_taints = [t for t in new_taints if _taint_id(t) != ident] + ([entry["original"]] if entry.get("original") else [])
            after["taints"][ident] = entry.get("original")
        else:
            keep["taints"][ident] = entry
            conflicts.append({"node": meta.get("name"), "taint": ident, "value": live, "gpuharden_set": entry.get("set"),
                              "reason": "taint %s was changed since gpuharden set it: left as it is" % ident})
    patch = {"metadata": {"annotations": {ORIGINALS_ANNOTATION: (
        json.dumps(keep, sort_keys=True, separators=(",", ":")) if keep["labels"] or keep["taints"] else None)}}}
    if patch_labels:
        patch["metadata"]["labels"] = patch_labels
    if new_taints != taints:
        patch["metadata"]["resourceVersion"] = meta.get("resourceVersion")  # spec.taints is an atomic list
        patch["spec"] = {"taints": new_taints or None}
    if patch["metadata"]["annotations"][ORIGINALS_ANNOTATION] == (meta.get("annotations") or {}).get(ORIGINALS_ANNOTATION):
        del patch["metadata"]["annotations"]
    if patch == {"metadata": {}}:
        patch = None
    return patch, {"before": before, "after": after, "conflicts": conflicts}


def ours(obj):
    """gpuharden's own object: its managed-by label says so and gpuharden applied it."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(MANAGED_BY) == MANAGER and _k8s_objects.owned_by_us(obj)


def plan(live_nodes, node_names, objects, force=False, remove_objects=True):
    """The whole plan from one LIST of Nodes and of each object kind.

    ``node_names``: the Nodes of this run.  Returns {patches: {name: patch}, nodes: {name: view}, conflicts,
    remove: [objects], kept: [{object, reason}], missing: [names]}.
    """
    by_name = {(n.get("metadata") or {}).get("name"): n for n in live_nodes}
    missing = sorted(name for name in node_names if name not in by_name)
    patches, views, conflicts = {}, {}, []
    for name in sorted(set(node_names) - set(missing)):
        patch, view = node_plan(by_name[name], force=force)
        conflicts.extend(view["conflicts"])
        if patch:
            patches[name] = patch
            views[name] = view
    still = sorted(name for name, node in by_name.items() if name not in set(node_names) and recorded(node))
    remove, kept = [], []
    for obj in objects:
        if not ours(obj):
            continue
        if not remove_objects:
            kept.append({"object": _k8s_objects.describe(obj), "reason": "kept: gpuharden_unharden_cluster_objects=false"})
        elif still:
            kept.append({"object": _k8s_objects.describe(obj),
                         "reason": "kept: Nodes outside this run still carry gpuharden's labels (%s)" % ", ".join(still[:5])})
        else:
            remove.append(obj)
    return {"patches": patches, "nodes": views, "conflicts": conflicts, "remove": remove, "kept": kept, "missing": missing}
