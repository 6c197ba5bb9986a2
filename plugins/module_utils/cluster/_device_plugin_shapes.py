# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The shape of the API objects the device_plugin module reads, checked before anything reads into them.

The audit walks DaemonSets, Nodes, ConfigMaps, the RuntimeClass and ClusterPolicies field by field.  An answer of
another shape (a list of strings where objects belong, ``spec: "text"``, a ConfigMap whose data is a list: what a
broken proxy, a hostile server or a wrong conversion webhook sends) is refused here, in one line naming the object and
the field, before the first request that changes anything; it never reaches the audit as an AttributeError.

Only the fields this module reads are described; any other field is left alone.  Types follow the Kubernetes API
(k8s.io/api core/v1 and apps/v1 types.go, k8s.io/apimachinery meta/v1 ObjectMeta): maps of strings, lists of objects.
A ``null`` scalar is accepted (the API server writes ``creationTimestamp: null`` in templates); a ``null`` where an
object or a list belongs is not what the API server sends for an omitted field (Go's ``omitempty`` leaves it out).
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

STRINGS = {"*": str}  # a map of strings (labels, annotations, nodeSelector, ConfigMap data)
OWNER_REFERENCE = {"apiVersion": str, "kind": str, "name": str, "uid": str, "controller": bool}
METADATA = {"name": str, "namespace": str, "uid": str, "resourceVersion": str, "labels": STRINGS, "annotations": STRINGS,
            "ownerReferences": [OWNER_REFERENCE], "deletionTimestamp": str}
SELECTOR_REQUIREMENT = {"key": str, "operator": str, "values": [str]}
LABEL_SELECTOR = {"matchLabels": STRINGS, "matchExpressions": [SELECTOR_REQUIREMENT]}
NODE_SELECTOR_TERM = {"matchExpressions": [SELECTOR_REQUIREMENT], "matchFields": [SELECTOR_REQUIREMENT]}
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [NODE_SELECTOR_TERM]}}}
TOLERATION = {"key": str, "operator": str, "value": str, "effect": str}
ENV = {"name": str, "value": str, "valueFrom": {}}
CONTAINER = {"name": str, "image": str, "command": [str], "args": [str], "env": [ENV],
             "volumeMounts": [{"name": str, "mountPath": str, "subPath": str, "readOnly": bool}],
             "securityContext": {"privileged": bool, "capabilities": {"add": [str], "drop": [str]}}, "readinessProbe": {}}
VOLUME = {"name": str, "configMap": {"name": str, "items": [{"key": str, "path": str}]}, "hostPath": {"path": str, "type": str}}
POD_SPEC = {"nodeSelector": STRINGS, "tolerations": [TOLERATION], "affinity": AFFINITY, "containers": [CONTAINER],
            "initContainers": [CONTAINER], "volumes": [VOLUME], "runtimeClassName": str, "nodeName": str}
DAEMON_SET = {"metadata": METADATA,
              "spec": {"selector": LABEL_SELECTOR, "template": {"metadata": {"labels": STRINGS, "annotations": STRINGS}, "spec": POD_SPEC}},
              "status": {}}
NODE = {"metadata": METADATA, "spec": {"taints": [{"key": str, "value": str, "effect": str}], "unschedulable": bool},
        "status": {"capacity": STRINGS, "allocatable": STRINGS, "runtimeHandlers": [{"name": str, "features": {}}],
                   "conditions": [{"type": str, "status": str}]}}
CONFIG_MAP = {"metadata": METADATA, "data": STRINGS}
RUNTIME_CLASS = {"metadata": METADATA, "handler": str}
CLUSTER_POLICY = {"metadata": METADATA, "spec": {}}
SHAPES = {"DaemonSet": DAEMON_SET, "Node": NODE, "ConfigMap": CONFIG_MAP, "RuntimeClass": RUNTIME_CLASS, "ClusterPolicy": CLUSTER_POLICY}
_TYPE_WORDS = {str: "a string", bool: "a boolean", int: "a number", dict: "an object", list: "a list"}


def _words(value):
    if value is None:
        return "null"
    for kind in (bool, str, int, float, dict, list):
        if isinstance(value, kind):
            return _TYPE_WORDS.get(kind, "a number")
    return "something else"


def _problem(value, shape, field):
    """(field, found, expected) of the first place ``value`` is not of ``shape``, or None."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return field, value, "an object"
        for key, item in value.items():
            sub = shape.get(key, shape.get("*"))
            if sub is None:
                continue
            if item is None and not isinstance(sub, (dict, list)):
                continue
            found = _problem(item, sub, "%s.%s" % (field, key) if field else str(key))
            if found:
                return found
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return field, value, "a list"
        for index, item in enumerate(value):
            found = _problem(item, shape[0], "%s[%d]" % (field, index))
            if found:
                return found
        return None
    if shape is bool:
        return None if isinstance(value, bool) else (field, value, "a boolean")
    return None if isinstance(value, shape) and not isinstance(value, bool) else (field, value, _TYPE_WORDS[shape])


def _name(obj, kind, index):
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        return "%s #%d of the list" % (kind, index) if index is not None else kind
    return "%s %s" % (kind, "%s/%s" % (namespace, name) if isinstance(namespace, str) else name)


def check(kind, obj, index=None, name=None, namespace=None):
    """``obj`` as the API server sent it, if it has the shape of a ``kind`` where this module reads it; else a
    one-line GpuhardenError naming the object (``name``/``namespace``: the one asked for), the field and what it holds."""
    found = _problem(obj, SHAPES[kind], "")
    if found:
        field, value, expected = found
        asked = "%s %s" % (kind, "%s/%s" % (namespace, name) if namespace else name) if name else None
        raise GpuhardenError("device_plugin: %s: the API server's answer has %s%s, expected %s: refusing to read it"
                             % (asked or _name(obj, kind, index), "%s at field %s" % (_words(value), field) if field else _words(value),
                                "" if isinstance(value, (dict, list)) or value is None else " (%s)" % repr(value)[:60], expected),
                             fix="check what answers at the kubeconfig's server (a proxy, a conversion webhook): a Kubernetes "
                                 "API server never sends this")
    return obj


def check_all(kind, objects):
    """Every object of a LIST, checked (``check``); the list itself too."""
    if not isinstance(objects, list):
        raise GpuhardenError("device_plugin: the API server's list of %ss is %s, expected a list: refusing to read it"
                             % (kind, _words(objects)), fix="check what answers at the kubeconfig's server")
    return [check(kind, obj, index) for index, obj in enumerate(objects)]
