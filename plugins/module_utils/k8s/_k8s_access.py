# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Kubernetes API calls for the controller-side modules: what each call is (verb, resource, scope), one
paginated LIST per kind, and failures that say so.

A 403 becomes a message that names the identity (as the API server names it), the verb, the resource
with its API group and the scope, and where the shipped RBAC is (``deploy/rbac/gpuharden-rbac.yaml``);
every other failure goes through ``_k8s.api_error``.  ``forbidden_message`` is pure.
"""

from __future__ import annotations

import json
import re

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _resources

RBAC_FILE = "deploy/rbac/gpuharden-rbac.yaml"
_USER_RE = re.compile(r'User "([^"]*)"')


class Target:
    """What an API call does, for error messages: ``verb`` on ``resource`` (``pods/eviction``) in ``group``."""

    __slots__ = ("verb", "resource", "group", "namespace", "name")

    def __init__(self, verb, resource, group="", namespace=None, name=None):
        self.verb, self.resource, self.group, self.namespace, self.name = verb, resource, group, namespace, name

    @classmethod
    def of(cls, verb, kind, namespace=None, name=None):
        """The call ``verb`` on ``kind`` (a kind of ``_resources.RESOURCES``: its resource and group from the table)."""
        resource, group = _resources.rbac(kind)
        return cls(verb, resource, group, namespace, name)

    def describe(self):
        what = "%s %s" % (self.verb, self.resource)
        if self.name:
            what += " %r" % self.name
        what += " (API group %s)" % (self.group or '"" (core)')
        return what + (" in namespace %s" % self.namespace if self.namespace else " at cluster scope")

    def as_dict(self):
        return {"verb": self.verb, "resource": self.resource, "group": self.group, "namespace": self.namespace, "name": self.name}


def server_message(body):
    """The ``message`` of an API server Status body (bytes or str), or None."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        return json.loads(body).get("message")
    except (TypeError, ValueError, AttributeError):
        return None


def identity_of(message):
    """The user the API server named in a Forbidden message (``User "system:serviceaccount:ns:sa"``), or None."""
    match = _USER_RE.search(message or "")
    return match.group(1) if match else None


def forbidden_message(module, target, message, identity=None):
    """The user-facing text of a 403 (pure)."""
    identity = identity or identity_of(message) or "the identity in use"
    return ("%s: forbidden: %s may not %s. RBAC grants it no such permission: add verb %r on resource %r (API group %s) "
            "to its (Cluster)Role, see %s. The API server said: %s"
            % (module, identity, target.describe(), target.verb, target.resource, target.group or '""', RBAC_FILE, message))


def failure(module, target, error):
    """A GpuhardenError for a failed call: a 403 names identity, verb and resource; anything else via _k8s.api_error."""
    if isinstance(error, _k8s.ApiException) and getattr(error, "status", None) == 403:
        message = server_message(error.body) or error.reason
        identity = identity_of(message)
        return GpuhardenError(forbidden_message(module, target, message, identity), status=403,
                              forbidden=dict(target.as_dict(), identity=identity), access=_k8s.access("forbidden"))
    return _k8s.api_error(error, "%s: %s" % (module, target.describe()))


def _timeout(api):
    timeout = getattr(api, "gpuharden_request_timeout", None)
    return {"_request_timeout": timeout} if timeout else {}


def call(module, api, method, target, *args, accept=(), **kwargs):
    """``method(*args, **kwargs)`` with the raw response: (HTTP status, parsed JSON body or None).

    Statuses in ``accept`` (for example 404, 429) are returned instead of raised.
    """
    try:
        response = method(*args, _preload_content=False, **_timeout(api), **kwargs)
    except Exception as error:  # ApiException, and urllib3's connection and TLS errors
        status = getattr(error, "status", None)
        if isinstance(error, _k8s.ApiException) and status in accept:
            body = error.body
            try:
                return status, json.loads(body.decode("utf-8", "replace") if isinstance(body, bytes) else body)
            except (TypeError, ValueError, AttributeError):
                return status, {"message": error.reason}
        raise failure(module, target, error) from None
    data = response.data
    try:
        return response.status, (json.loads(data) if data else None)
    except ValueError:
        raise GpuhardenError("%s: %s: the API server's answer is not JSON" % (module, target.describe())) from None
    except RecursionError:  # json.loads recurses per nesting level: a hostile answer nests beyond the stack
        raise GpuhardenError("%s: %s: the API server's answer nests too deep to be a Kubernetes object" % (module, target.describe())) from None


def list_all(module, api, method, target, page_limit=500, **kwargs):
    """Every item of one paginated LIST (``_k8s.list_all``), a 403 named by ``failure``: (items, pages)."""
    return _k8s.list_all(api, method, "%s: %s" % (module, target.describe()), lambda error: failure(module, target, error),
                         page_limit, **kwargs)


def list_kind(module, api, kind, page_limit=500, **selectors):
    """Every object of ``kind`` (a kind of ``_resources.RESOURCES``) in the cluster, one paginated LIST across all
    namespaces: (items, pages)."""
    return list_all(module, api, _k8s.endpoint(api, "GET", *_resources.template(kind, all_namespaces=True)), Target.of("list", kind),
                    page_limit, **selectors)
