# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The one table of the Kubernetes resources this collection reads or writes: every API path, apiVersion and RBAC
resource name of the collection and of the CLI comes from ``RESOURCES`` (tests/unit/test_k8s_resources.py fails when one
is spelled anywhere else).

A path is built as the API server routes it (k8s.io/apiserver v0.36.3 pkg/endpoints/installer.go): the legacy core group
under ``/api/<version>``, every other group under ``/apis/<group>/<version>``; a namespaced resource under
``/namespaces/<namespace>`` (without it: the LIST across all namespaces), then the plural, the object's name and a
subresource.  Pure: no import beyond the standard library, so that any layer may use it.
"""

from __future__ import annotations

from collections import namedtuple
from urllib.parse import quote

Resource = namedtuple("Resource", ("group", "version", "plural", "namespaced"))

# kind: where it is served.  The built-in kinds as k8s.io/api v0.36.3 registers them; ClusterPolicy is the NVIDIA GPU
# Operator's CRD (NVIDIA/gpu-operator api/nvidia/v1 clusterpolicy_types.go: cluster-scoped).  A subresource (its plural
# ``parent/sub``) is served, and named in RBAC, under its parent's group (pods/eviction in the core group), while the
# object POSTed to it has an apiVersion of its own (SUBRESOURCE_API_VERSIONS).
RESOURCES = {
    "ConfigMap": Resource("", "v1", "configmaps", True),
    "Event": Resource("", "v1", "events", True),
    "Node": Resource("", "v1", "nodes", False),
    "Pod": Resource("", "v1", "pods", True),
    "Eviction": Resource("", "v1", "pods/eviction", True),
    "ServiceAccount": Resource("", "v1", "serviceaccounts", True),
    "TokenRequest": Resource("", "v1", "serviceaccounts/token", True),
    "DaemonSet": Resource("apps", "v1", "daemonsets", True),
    "Deployment": Resource("apps", "v1", "deployments", True),
    "StatefulSet": Resource("apps", "v1", "statefulsets", True),
    "Job": Resource("batch", "v1", "jobs", True),
    "CronJob": Resource("batch", "v1", "cronjobs", True),
    "PodDisruptionBudget": Resource("policy", "v1", "poddisruptionbudgets", True),
    "RuntimeClass": Resource("node.k8s.io", "v1", "runtimeclasses", False),
    "ClusterPolicy": Resource("nvidia.com", "v1", "clusterpolicies", False),
    "PriorityLevelConfiguration": Resource("flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations", False),
    "FlowSchema": Resource("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", False),
}
# k8s.io/api v0.36.3 policy/v1 Eviction and authentication/v1 TokenRequest
SUBRESOURCE_API_VERSIONS = {"Eviction": "policy/v1", "TokenRequest": "authentication.k8s.io/v1"}


def api_version(kind):
    """The ``apiVersion`` of an object of ``kind``: ``v1`` for the core group, ``group/version`` otherwise."""
    if kind in SUBRESOURCE_API_VERSIONS:
        return SUBRESOURCE_API_VERSIONS[kind]
    entry = RESOURCES[kind]
    return "%s/%s" % (entry.group, entry.version) if entry.group else entry.version


def rbac(kind):
    """(resource, API group) of ``kind`` as an RBAC rule names them (``pods/eviction``, ``""``)."""
    entry = RESOURCES[kind]
    return entry.plural, entry.group


def template(kind, named=False, all_namespaces=False):
    """(path template, path key...) of requests on ``kind``: ``_k8s.endpoint``'s arguments after the HTTP method.  The
    collection (``named`` False) or one object (``{name}``), of a namespaced kind in ``{namespace}`` or across all
    namespaces (``all_namespaces``: a LIST).  The keys are in the order the callers pass the values: ``name`` first, then ``namespace``.  A subresource
    is always named: its parent object's path, then the subresource."""
    entry = RESOURCES[kind]
    plural, _slash, subresource = entry.plural.partition("/")
    path = "/apis/%s/%s" % (entry.group, entry.version) if entry.group else "/api/%s" % entry.version
    keys = []
    if entry.namespaced and not all_namespaces:
        path += "/namespaces/{namespace}"
        keys.append("namespace")
    path += "/" + plural
    if named or subresource:
        path += "/{name}"
        keys.insert(0, "name")
    if subresource:
        path += "/" + subresource
    return (path,) + tuple(keys)


def path(kind, name=None, namespace=None):
    """The concrete path of ``kind``'s collection (``name`` None) or of one object, its name and namespace quoted as on
    the wire; a namespaced kind without ``namespace`` is the LIST across all namespaces."""
    text, *keys = template(kind, named=name is not None, all_namespaces=namespace is None)
    values = {"name": name, "namespace": namespace}
    return text.format(**{key: quote(str(values[key]), safe="") for key in keys})
