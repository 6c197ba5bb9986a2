# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Server-side apply of whole objects, with honest check mode and diffs, for the controller-side modules.

``ensure`` decides first (every write it plans is made with ``dryRun=All`` to learn the server's answer), then,
outside check mode, makes the same writes for real.  An object is *changed* only when the server's dry-run
result differs from the live object outside ``managedFields``, ``resourceVersion``, ``generation`` and
``status``; that is: when it differs in the fields this collection owns (SSA keeps everybody else's).

An existing object that this collection never applied (no ``gpuharden`` Apply entry in its managedFields) is
*adopted*: replaced (PUT) by the desired object, so that fields left by the previous installer cannot survive
(server-side apply would keep them: they are not ours), then applied, so that gpuharden owns the fields.

Every request goes through ``_k8s.endpoint`` with plain dicts; nothing here knows about a particular kind: its path,
scope and RBAC names come from the one table, ``_resources.RESOURCES``.
"""

from __future__ import annotations

import copy
import json
import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._waiter import wait_until
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_access, _resources

try:
    import yaml

    HAS_YAML = True
except ImportError:
    yaml = None
    HAS_YAML = False

FIELD_MANAGER = "gpuharden"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
MERGE_CONTENT_TYPE = "application/merge-patch+json"

# the HTTP method of each verb Client uses
HTTP_METHODS = {"read": "GET", "list": "GET", "patch": "PATCH", "replace": "PUT", "delete": "DELETE"}

# Never compared: the server writes them on every write, or they are not part of what we declare.
IGNORED_METADATA = ("managedFields", "resourceVersion", "generation")
IGNORED_ANNOTATIONS = ("deprecated.daemonset.template.generation",)


def describe(obj):
    meta = obj.get("metadata") or {}
    if meta.get("namespace"):
        return "%s %s/%s" % (obj.get("kind"), meta["namespace"], meta.get("name"))
    return "%s %s" % (obj.get("kind"), meta.get("name"))


def comparable(obj):
    """The object without what the server rewrites on every write (pure)."""
    if obj is None:
        return None
    out = copy.deepcopy(obj)
    out.pop("status", None)
    meta = out.get("metadata") or {}
    for key in IGNORED_METADATA:
        meta.pop(key, None)
    annotations = meta.get("annotations") or {}
    for key in IGNORED_ANNOTATIONS:
        annotations.pop(key, None)
    if "annotations" in meta and not annotations:
        meta.pop("annotations")
    return out


def for_diff(obj):
    """YAML text of the comparable object, without the server-set identity fields; "" for no object."""
    data = comparable(obj)
    if data is None:
        return ""
    meta = data.get("metadata") or {}
    for key in ("uid", "creationTimestamp"):
        meta.pop(key, None)
    return dump(data)


def dump(data):
    """The text of a diff side: YAML where the controller has PyYAML, else indented JSON."""
    if HAS_YAML:
        return yaml.safe_dump(data, default_flow_style=False, sort_keys=True)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def owned_by_us(obj):
    """True when gpuharden applied this object (it holds an Apply entry in managedFields)."""
    return any(entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply"
               for entry in ((obj or {}).get("metadata") or {}).get("managedFields") or [])


class Client:
    """Thin wrapper over the API paths: JSON in, dicts out, every request through _k8s_access (one error per
    failed request; a 403 names the identity and the RBAC rule it lacks)."""

    def __init__(self, api, who):
        self.api = api
        self.who = who
        self.requests = 0

    @property
    def retries(self):
        """How many of the requests were retried (throttled, failed or broken, then sent again: ``_k8s.RetryPolicy``)."""
        return _k8s.retries_made(self.api)

    def _method(self, kind, verb):
        """The request of ``verb`` (read, list, patch, replace, delete) on one object of ``kind`` (``list``: in one
        namespace, or of a cluster-scoped kind), called with the object's name and namespace (``_resources.template``)."""
        return _k8s.endpoint(self.api, HTTP_METHODS[verb], *_resources.template(kind, named=verb != "list"))

    def _call(self, verb, kind, name, namespace, method, *args, accept=(), **kwargs):
        """(status, body) of one request; ``verb`` is the RBAC verb it needs."""
        target = _k8s_access.Target.of(verb, kind, namespace if _resources.RESOURCES[kind].namespaced else None, name)
        self.requests += 1
        status, body = _k8s_access.call(self.who, self.api, method, target, *args, accept=accept, **kwargs)
        return status, body or {}

    @staticmethod
    def _args(kind, name, namespace):
        return (name, namespace) if _resources.RESOURCES[kind].namespaced else (name,)

    def read(self, kind, name, namespace=None):
        """The live object, or None when it does not exist."""
        status, body = self._call("get", kind, name, namespace, self._method(kind, "read"), *self._args(kind, name, namespace),
                                  accept=(404,))
        return None if status == 404 else body

    def apply(self, obj, dry_run, force):
        kind, meta = obj["kind"], obj["metadata"]
        kwargs = {"field_manager": FIELD_MANAGER, "force": bool(force), "_content_type": APPLY_CONTENT_TYPE}
        if dry_run:
            kwargs["dry_run"] = "All"
        return self._call("patch", kind, meta["name"], meta.get("namespace"), self._method(kind, "patch"),
                          *self._args(kind, meta["name"], meta.get("namespace")), obj, **kwargs)[1]

    def replace(self, obj, dry_run):
        kind, meta = obj["kind"], obj["metadata"]
        kwargs = {"field_manager": FIELD_MANAGER}
        if dry_run:
            kwargs["dry_run"] = "All"
        return self._call("update", kind, meta["name"], meta.get("namespace"), self._method(kind, "replace"),
                          *self._args(kind, meta["name"], meta.get("namespace")), obj, **kwargs)[1]

    def merge_patch(self, kind, name, patch, dry_run, namespace=None):
        kwargs = {"field_manager": FIELD_MANAGER, "_content_type": MERGE_CONTENT_TYPE}
        if dry_run:
            kwargs["dry_run"] = "All"
        return self._call("patch", kind, name, namespace, self._method(kind, "patch"), *self._args(kind, name, namespace),
                          patch, **kwargs)[1]

    def delete(self, kind, name, namespace, dry_run):
        kwargs = {"propagation_policy": "Background"}
        if dry_run:
            kwargs["dry_run"] = "All"
        status, body = self._call("delete", kind, name, namespace, self._method(kind, "delete"), *self._args(kind, name, namespace),
                                  accept=(404,), **kwargs)
        return None if status == 404 else body

    def list(self, kind, page_limit, namespace=None, **selectors):
        """Every object of the kind (one namespace, or all), following ``continue``: one paginated LIST."""
        across = namespace is None
        method = _k8s.endpoint(self.api, "GET", *_resources.template(kind, all_namespaces=across))
        args = () if across or not _resources.RESOURCES[kind].namespaced else (namespace,)
        return self.list_with(method, _k8s_access.Target.of("list", kind, namespace), page_limit, args=args, **selectors)

    def list_with(self, method, target, page_limit, **params):
        """One paginated LIST through any LIST request (``_k8s.endpoint``; custom resources too), its pages counted."""

        def counted(*call_args, **kwargs):
            self.requests += 1
            return method(*call_args, **kwargs)

        return _k8s_access.list_all(self.who, self.api, counted, target, page_limit, **params)[0]


def _immutable_message(check, live, desired):
    return check(live, desired) if check else None


def plan(client, desired, force_conflicts=True, immutable=None):
    """Decide what to do with one object: the live object and the server's dry-run answer (no write persists).

    ``immutable(live, desired)`` returns a message when the object can only be changed by delete + create.
    Returns a dict: ``action`` (none, create, update, adopt, recreate), ``live``, ``after``, ``changed``, ``message``.
    """
    meta = desired["metadata"]
    live = client.read(desired["kind"], meta["name"], meta.get("namespace"))
    if live is None:
        after = client.apply(desired, dry_run=True, force=force_conflicts)
        return {"action": "create", "live": None, "after": after, "changed": True, "message": "created"}
    message = _immutable_message(immutable, live, desired)
    if message:
        after = copy.deepcopy(desired)  # a dry-run create is refused while the old object exists: predict it
        return {"action": "recreate", "live": live, "after": after, "changed": True, "message": message}
    if not owned_by_us(live):
        replacement = copy.deepcopy(desired)
        replacement["metadata"]["resourceVersion"] = (live.get("metadata") or {}).get("resourceVersion")
        after = client.replace(replacement, dry_run=True)
        return {"action": "adopt", "live": live, "after": after, "changed": True,
                "message": "adopted: replaced by the desired object, then applied by %s" % FIELD_MANAGER}
    after = client.apply(desired, dry_run=True, force=force_conflicts)
    changed = comparable(after) != comparable(live)
    return {"action": "update" if changed else "none", "live": live, "after": after, "changed": changed,
            "message": "updated" if changed else "unchanged"}


def execute(client, desired, decision, force_conflicts=True, recreate=False):
    """Make the decided writes for real; returns the object as stored."""
    action = decision["action"]
    if action == "none":
        return decision["live"]
    if action == "recreate":
        if not recreate:
            raise GpuhardenError(decision["message"])
        meta = desired["metadata"]
        client.delete(desired["kind"], meta["name"], meta.get("namespace"), dry_run=False)
        wait_gone(client, desired["kind"], meta["name"], meta.get("namespace"))
    if action == "adopt":
        replacement = copy.deepcopy(desired)
        replacement["metadata"]["resourceVersion"] = (decision["live"].get("metadata") or {}).get("resourceVersion")
        client.replace(replacement, dry_run=False)
        return client.apply(desired, dry_run=False, force=True)  # take the fields over from our own Update entry
    return client.apply(desired, dry_run=False, force=force_conflicts)


GONE_POLL_SECONDS = 0.5


def wait_gone(client, kind, name, namespace, timeout=60.0, clock=time.monotonic, sleep=time.sleep):
    """Until the deleted object is gone; a timeout names it and what still holds it (its finalizers)."""

    def gone():
        live = client.read(kind, name, namespace)
        meta = (live or {}).get("metadata") or {}
        return live is None, {"finalizers": meta.get("finalizers") or [], "deletionTimestamp": meta.get("deletionTimestamp")}

    try:
        wait_until("%s %s gone after its deletion (finalizers?)" % (kind, name), gone, clock() + timeout, GONE_POLL_SECONDS,
                   final_look=True, must=True, clock=clock, sleep=sleep)
    except GpuhardenError as error:
        raise GpuhardenError("%s: %s" % (client.who, error.msg)) from None


def diff_entry(decision, desired):
    header = describe(desired)
    return {"before": for_diff(decision["live"]), "after": for_diff(decision["after"]),
            "before_header": "%s (live)" % header, "after_header": "%s (desired, %s)" % (header, decision["action"])}


def summary(decision, desired, stored=None):
    obj = stored if stored is not None else (decision["after"] if decision["action"] != "none" else decision["live"])
    meta = (obj or {}).get("metadata") or {}
    return {"kind": desired["kind"], "name": desired["metadata"]["name"], "namespace": desired["metadata"].get("namespace"),
            "action": decision["action"], "changed": decision["changed"], "message": decision["message"],
            "resource_version": meta.get("resourceVersion")}
