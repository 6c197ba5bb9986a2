# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Kubernetes API clients for the controller-side modules, from the shared auth options.

The options are documented in ``plugins/doc_fragments/_k8s_auth.py`` and specified here
(``auth_argument_spec()`` returns a deep copy); validate-modules checks that the two agree.

``auth_settings`` (pure) validates the options and decides where the configuration comes from;
``api_client`` builds a ``kubernetes.client.ApiClient`` from that.  Only the controller needs the
``kubernetes`` package: nodes never import this file.

``list_all`` is the one paginated LIST of every module: raw JSON bodies decoded once by ``json.loads``
(never the client's model classes, which cost several times the decoding at scale) with the cyclic garbage
collector paused (``gc_paused``), ``continue`` followed to the end, one restart when a continue token expired.
``list_concurrently`` runs several such LISTs at once, so that one list's decoding overlaps the API server's
work on the other.

``endpoint`` is the one way a request is made: an API path and its HTTP method, sent through the ApiClient's
urllib3 pool with the configuration's credentials, the body as JSON and the answer left raw.  The client's typed
API classes (``CoreV1Api``...) are never imported: in kubernetes 37 (the first client that requires pydantic) each
builds hundreds of pydantic model classes at import, about 0.9 CPU-s of every module run here, while this collection
only ever wants a URL and the raw JSON.

``request`` (under ``endpoint``, so under every call, LIST and object write of ``_k8s_access`` and ``_k8s_objects``) is
also the one place a request is repeated: ``RetryPolicy`` retries a throttled (429), failed (5xx) or broken request
with backoff and jitter, honouring ``Retry-After``, within the request timeout, and only where repeating it is safe;
urllib3's own retries are off.  ``retries_made(api)`` counts the retries of one ApiClient, ``retries_total()`` those of
the whole process: every module that talks to the API server reports the latter of its run as ``api_retries``
(``RESULT_COUNTERS``, handed to ``_module_shell.run_module``).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import random
import re
import threading
import time
import traceback
from urllib.parse import quote, urlencode

from ansible.module_utils.basic import env_fallback
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

try:
    import urllib3
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.rest import ApiException

    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError:
    urllib3 = k8s_client = k8s_config = None
    ApiException = Exception
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()

REQUIREMENT = ("kubernetes", HAS_KUBERNETES, KUBERNETES_IMPORT_ERROR)

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"

AUTH_ARG_SPEC = {
    "kubeconfig": {"type": "raw", "fallback": (env_fallback, ["K8S_AUTH_KUBECONFIG"])},
    "context": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_CONTEXT"])},
    "host": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_HOST"])},
    "api_key": {"type": "str", "no_log": True, "fallback": (env_fallback, ["K8S_AUTH_API_KEY"])},
    "validate_certs": {"type": "bool", "aliases": ["verify_ssl"], "fallback": (env_fallback, ["K8S_AUTH_VERIFY_SSL"])},
    "ca_cert": {"type": "path", "aliases": ["ssl_ca_cert"], "fallback": (env_fallback, ["K8S_AUTH_SSL_CA_CERT"])},
    "client_cert": {"type": "path", "aliases": ["cert_file"], "fallback": (env_fallback, ["K8S_AUTH_CERT_FILE"])},
    "client_key": {"type": "path", "aliases": ["key_file"], "no_log": False, "fallback": (env_fallback, ["K8S_AUTH_KEY_FILE"])},
    "proxy": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_PROXY"])},
    "no_proxy": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_NO_PROXY"])},
    "proxy_headers": {
        "type": "dict",
        "options": {
            "proxy_basic_auth": {"type": "str", "no_log": True},
            "user_agent": {"type": "str"},
        },
    },
    "impersonate_user": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_IMPERSONATE_USER"])},
    "request_timeout": {"type": "float", "default": 60},
}

AUTH_OPTION_NAMES = tuple(AUTH_ARG_SPEC)


def auth_argument_spec():
    """A fresh copy of the auth options' spec, to merge into a module's own."""
    return copy.deepcopy(AUTH_ARG_SPEC)


# Why a controller-side check could not read the cluster, and what fixes it: a failed request's GpuhardenError carries
# ``access`` = {kind, fix}, so that a drift run reports its cluster side as "could not check" with the cause and the
# fix (never as drift, never as clean).  One kind per cause the user acts on differently.
ACCESS_FIXES = {
    "kubeconfig": "give the controller a readable kubeconfig for the tool's identity (gpuharden_kubeconfig, or the module's "
                  "kubeconfig option; README step 2); `kubectl --kubeconfig FILE auth can-i list pods -A` tests it",
    "credentials": "the API server rejected the credentials (HTTP 401: an expired or revoked token, or a client certificate "
                   "it does not trust): issue a new token for the tool's ServiceAccount (kubectl -n gpuharden-system create "
                   "token gpuharden --duration ...) and put it in the kubeconfig",
    "forbidden": "grant the identity the permission named (apply deploy/rbac/gpuharden-rbac.yaml, or add the rule to its "
                 "(Cluster)Role)",
    "unreachable": "check, from the controller, the kubeconfig's server address, the network path to it and the API "
                   "server's health (kubectl --kubeconfig FILE get --raw /readyz)",
    "api": "the API server failed the request: check its health and logs, then run again",
    "client": "install the kubernetes Python client in the controller's Python (pip install kubernetes)",
}


def access(kind):
    """The ``access`` of a GpuhardenError: why the cluster could not be read (ACCESS_FIXES's kinds) and the fix."""
    return {"kind": kind, "fix": ACCESS_FIXES[kind]}


def _check_url(option, value):
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("http", "https") or not rest.strip("/"):
        raise GpuhardenError("k8s auth: option %s=%r is not an http(s) URL" % (option, value))


def _check_file(option, value):
    if not os.path.isfile(value):
        raise GpuhardenError("k8s auth: option %s=%s: no such file on the controller" % (option, value), access=access("kubeconfig"))


def auth_settings(params, environ=None):
    """Validate the auth options (pure apart from file existence checks) and pick the config source.

    Returns a dict: ``source`` is ``kubeconfig_file``, ``kubeconfig_dict``, ``params`` (host given, no
    kubeconfig), ``in_cluster`` or ``default_kubeconfig``, plus the overrides to apply on top.
    """
    environ = os.environ if environ is None else environ
    kubeconfig = params.get("kubeconfig")
    host = params.get("host")
    if kubeconfig is not None and not isinstance(kubeconfig, (str, dict)):
        raise GpuhardenError("k8s auth: option kubeconfig must be a path or a dictionary, not %s" % type(kubeconfig).__name__)
    if isinstance(kubeconfig, str):
        kubeconfig = os.path.expanduser(kubeconfig)
        _check_file("kubeconfig", kubeconfig)
        source = "kubeconfig_file"
    elif isinstance(kubeconfig, dict):
        source = "kubeconfig_dict"
    elif host:
        source = "params"
    elif params.get("context") is None and environ.get(IN_CLUSTER_ENV):
        source = "in_cluster"
    else:
        source = "default_kubeconfig"
    if host:
        _check_url("host", host)
    if params.get("proxy"):
        _check_url("proxy", params["proxy"])
    if bool(params.get("client_cert")) != bool(params.get("client_key")):
        raise GpuhardenError("k8s auth: options client_cert and client_key go together; only %s is set"
                             % ("client_cert" if params.get("client_cert") else "client_key"))
    for option in ("ca_cert", "client_cert", "client_key"):
        if params.get(option):
            _check_file(option, params[option])
    timeout = params.get("request_timeout")
    if timeout is not None and not timeout > 0:
        raise GpuhardenError("k8s auth: option request_timeout=%r must be a positive number of seconds" % (timeout,))
    if source == "params" and not (params.get("api_key") or params.get("client_cert")):
        raise GpuhardenError("k8s auth: option host=%s without kubeconfig needs api_key or client_cert/client_key" % host)
    return {
        "source": source,
        "kubeconfig": kubeconfig,
        "context": params.get("context"),
        "overrides": {
            name: params.get(name)
            for name in ("host", "api_key", "validate_certs", "ca_cert", "client_cert", "client_key", "proxy", "no_proxy", "proxy_headers", "impersonate_user")
            if params.get(name) is not None
        },
        "request_timeout": timeout,
    }


def _describe(settings):
    if settings["source"] == "kubeconfig_file":
        return "kubeconfig %s" % settings["kubeconfig"]
    if settings["source"] == "kubeconfig_dict":
        return "the kubeconfig given as a dictionary"
    if settings["source"] == "default_kubeconfig":
        return "the default kubeconfig (%s)" % os.environ.get("KUBECONFIG", "~/.kube/config")
    return settings["source"].replace("_", "-")


def _apply_overrides(conf, overrides):
    if "host" in overrides:
        conf.host = overrides["host"].rstrip("/")
    if "api_key" in overrides:
        # "BearerToken" in clients generated since v31, "authorization" before: same header.
        conf.api_key = {"BearerToken": "Bearer " + overrides["api_key"], "authorization": "Bearer " + overrides["api_key"]}
        conf.api_key_prefix = {}
    if "validate_certs" in overrides:
        conf.verify_ssl = overrides["validate_certs"]
    if "ca_cert" in overrides:
        conf.ssl_ca_cert = overrides["ca_cert"]
    if "client_cert" in overrides:
        conf.cert_file = overrides["client_cert"]
        conf.key_file = overrides["client_key"]
    if "proxy" in overrides:
        conf.proxy = overrides["proxy"]
    if "no_proxy" in overrides:
        conf.no_proxy = overrides["no_proxy"]
    headers = {key: value for key, value in (overrides.get("proxy_headers") or {}).items() if value is not None}
    if headers:
        conf.proxy_headers = urllib3.util.make_headers(**headers)


def configuration(settings):
    """A kubernetes.client.Configuration for the decided settings."""
    conf = k8s_client.Configuration()
    source = settings["source"]
    try:
        if source == "kubeconfig_file":
            k8s_config.load_kube_config(config_file=settings["kubeconfig"], context=settings["context"], client_configuration=conf, persist_config=False)
        elif source == "kubeconfig_dict":
            k8s_config.load_kube_config_from_dict(settings["kubeconfig"], context=settings["context"], client_configuration=conf, persist_config=False)
        elif source == "in_cluster":
            k8s_config.load_incluster_config(client_configuration=conf)
        elif source == "default_kubeconfig":
            k8s_config.load_kube_config(context=settings["context"], client_configuration=conf, persist_config=False)
    except Exception as error:  # ConfigException, YAML errors, missing files, bad base64: all the user's input
        raise GpuhardenError("k8s auth: cannot load %s: %s" % (_describe(settings), error), access=access("kubeconfig")) from None
    _apply_overrides(conf, settings["overrides"])
    hook = conf.refresh_api_key_hook
    if hook is not None and settings["overrides"]:
        # The kubeconfig loader's token refresh hook re-applies the kubeconfig's host, CA, certificates
        # and token before each request: the options must win after it too.
        def refresh(client_configuration):
            hook(client_configuration)
            _apply_overrides(client_configuration, settings["overrides"])

        conf.refresh_api_key_hook = refresh
    return conf


def api_client(params):
    """An ApiClient from the module's auth options; GpuhardenError with a clear message on bad input."""
    if not HAS_KUBERNETES:
        raise GpuhardenError("the kubernetes Python client is not installed on the controller (pip install kubernetes)", access=access("client"))
    settings = auth_settings(params)
    api = k8s_client.ApiClient(configuration(settings))
    if settings["overrides"].get("impersonate_user"):
        api.set_default_header("Impersonate-User", settings["overrides"]["impersonate_user"])
    api.gpuharden_request_timeout = settings["request_timeout"]
    api.gpuharden_retry = RetryPolicy()
    return api


_CAMEL = re.compile(r"_([a-z])")


def _query_name(option):
    """A typed client's keyword as the API server's query parameter: ``label_selector`` -> ``labelSelector``,
    ``_continue`` -> ``continue``.  The parameters are the json names of ListOptions, PatchOptions, UpdateOptions and
    DeleteOptions (k8s.io/apimachinery/pkg/apis/meta/v1/types.go: labelSelector, fieldSelector, limit, continue,
    dryRun, fieldManager, force, propagationPolicy)."""
    return "continue" if option == "_continue" else _CAMEL.sub(lambda match: match.group(1).upper(), option)


def _query_value(value):
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def endpoint(api, http_method, template, *path_keys):
    """A callable for one API path, called as the typed clients' methods are called: the path's values in the order
    of ``path_keys`` (``name``, ``namespace``), then the body if the request has one, then query options by their
    keyword (``label_selector``, ``dry_run``, ``field_manager``, ``force``, ``limit``, ``_continue``...) and
    ``_content_type`` and ``_request_timeout``.  It returns urllib3's response (``.status``, ``.data``) and raises
    ``ApiException`` for any status outside 2xx, as the typed clients do (``_preload_content`` is accepted and
    ignored: the answer is always raw).

    ``template`` is the path as the API reference spells it (``/api/v1/namespaces/{namespace}/pods/{name}``)."""

    def send(*args, **options):
        path = template.format(**{key: quote(str(args[index]), safe="") for index, key in enumerate(path_keys)})
        body = args[len(path_keys)] if len(args) > len(path_keys) else options.pop("body", None)
        return request(api, http_method, path, body, **options)

    return send


def request(api, http_method, path, body=None, _content_type=None, _request_timeout=None, _preload_content=False, **query):
    """One request through the ApiClient's urllib3 pool (TLS, client certificate and proxy as the configuration
    decided), with its credentials and default headers (impersonation, user agent); see ``endpoint``.

    A throttled (429), failed (500, 502, 503, 504) or broken (connection refused or reset) attempt is repeated as
    ``RetryPolicy`` decides, within the request timeout; the last failure is raised as it came."""
    conf = api.configuration
    headers = dict(api.default_headers)
    headers["Accept"] = "application/json"
    for setting in (conf.auth_settings() or {}).values():  # calls the kubeconfig's token refresh hook first
        if setting.get("in") == "header" and setting.get("value"):
            headers[setting["key"]] = setting["value"]
    if not any(key.lower() == "authorization" for key in headers):
        # kubernetes 36.0.0's kubeconfig loader stores the token under "authorization" while its auth_settings() reads
        # only "BearerToken" (kubernetes/config/kube_config.py _set_config, kubernetes/client/configuration.py)
        token = conf.api_key.get("authorization") or conf.api_key.get("BearerToken")
        if token:
            headers["authorization"] = token
    payload = None
    if body is not None:
        # a PATCH without a content type is a strategic merge patch: what the typed clients send for a dict body
        # (kubernetes/client/rest.py of client 37 turns json-patch+json with a non-list body into it)
        headers["Content-Type"] = _content_type or ("application/strategic-merge-patch+json" if http_method == "PATCH" else "application/json")
        payload = json.dumps(body).encode("utf-8")  # JSON is YAML too: apply-patch+yaml bodies go the same way
    url = conf.host.rstrip("/") + path
    params = [(_query_name(option), _query_value(value)) for option, value in query.items() if value is not None]
    if params:
        url += "?" + urlencode(params)
    repeatable = repeatable_request(http_method, headers.get("Content-Type"), query.get("dry_run"))
    policy = retry_policy(api)
    started = policy.clock()
    timeout = _request_timeout or getattr(api, "gpuharden_request_timeout", None)
    deadline = started + (timeout or policy.max_seconds)
    attempt = 1
    while True:
        extra = {"timeout": urllib3.Timeout(total=max(deadline - policy.clock(), 0.001))} if timeout else {}
        try:
            return _send(api, http_method, url, payload, headers, extra)
        except Exception as error:  # ApiException, and urllib3's connection, TLS and read errors
            delay = policy.delay(error, repeatable, attempt, deadline)
            if delay is None:
                raise
        policy.wait(delay)
        attempt += 1


def _send(api, http_method, url, payload, headers, extra):
    """One attempt: urllib3's own retries off (``NO_URLLIB3_RETRIES``), so that ``RetryPolicy`` is the only one."""
    response = api.rest_client.pool_manager.request(http_method, url, body=payload, headers=headers, retries=NO_URLLIB3_RETRIES, **extra)
    if not 200 <= response.status < 300:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = response.data.decode("utf-8", "replace") if response.data else None
        error.headers = response.headers
        raise error
    return response


# urllib3's pools retry a failed connection three times at once by default (urllib3 2.x util/retry.py Retry.DEFAULT):
# off here (no attempt repeated, redirects still followed), so that every repetition is RetryPolicy's, with its
# backoff, its deadline and its count.  An exhausted Retry raises MaxRetryError around the cause, as the default one
# did: a final failure reads as it read before.
NO_URLLIB3_RETRIES = urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=3) if urllib3 else None

RETRY_STATUSES = frozenset((429, 500, 502, 503, 504))
APPLY_PATCH = "application/apply-patch+yaml"


def repeatable_request(http_method, content_type, dry_run):
    """True when sending the request twice has the effect of sending it once, so that any failure may be retried:
    a read (GET, HEAD), a dry run (nothing persists), or a server-side apply (the same declared fields applied again
    give the same object).  Everything else (a create, an eviction, a token, a replace with a resourceVersion, a
    merge patch, a delete) may have happened before its answer was lost: it is repeated only when the failure shows
    that it never ran (``never_ran``)."""
    return http_method in ("GET", "HEAD") or bool(dry_run) or (http_method == "PATCH" and content_type == APPLY_PATCH)


def _cause(error):
    """The error under urllib3's MaxRetryError (the connection or read error), or the error itself."""
    return getattr(error, "reason", None) if urllib3 and isinstance(error, urllib3.exceptions.MaxRetryError) else error


def never_ran(error):
    """True when the failure shows that the API server never ran the request:

    - the connection was never made (refused, DNS, connect timeout: urllib3's NewConnectionError, ConnectTimeoutError);
    - a 429 without a Status body: the API server's flow control rejected it before any handler (APF, k8s.io/apiserver
      v0.36.3 pkg/server/filters/priority-and-fairness.go tooManyRequests, and the max-in-flight filter in maxinflight.go,
      answer with net/http's http.Error: text/plain "Too many requests, please try again later.").  A 429 with a JSON
      Status is a handler's answer, such as an eviction a PodDisruptionBudget refuses (k8s.io/kubernetes v1.36.3
      pkg/registry/core/pod/storage/eviction.go): that is the caller's to handle, never repeated here.
    """
    cause = _cause(error)
    if urllib3 and isinstance(cause, urllib3.exceptions.ConnectTimeoutError):  # NewConnectionError is one
        return True
    return _status(error) == 429 and not _is_status_body(getattr(error, "body", None))


def _is_status_body(body):
    try:
        return isinstance(json.loads(body), dict)
    except (TypeError, ValueError, RecursionError):
        return False


def _transient(error):
    """A failure that may pass: a retryable status, or a connection refused, reset or timed out."""
    if _status(error) is not None:
        return _status(error) in RETRY_STATUSES
    cause = _cause(error)
    return bool(urllib3) and isinstance(cause, (urllib3.exceptions.ProtocolError, urllib3.exceptions.TimeoutError))


def retry_after(error):
    """The seconds of an answer's ``Retry-After`` header (the delta-seconds form the API server sends: APF's
    tooManyRequests, responsewriters/writers.go ErrorNegotiated from a Status's retryAfterSeconds), or None."""
    headers = getattr(error, "headers", None) if _status(error) is not None else None
    try:
        seconds = float((headers or {}).get("Retry-After"))
    except (TypeError, ValueError):  # absent, or the HTTP-date form: the backoff alone decides
        return None
    return seconds if 0 <= seconds < float("inf") else None


class RetryPolicy:
    """When a failed request is sent again, and after how long: at most ``attempts`` attempts, never past the
    request's deadline (its timeout, else ``max_seconds``, counted from the first attempt).

    A repeatable request (``repeatable_request``) is retried after a 429, 500, 502, 503, 504 or a connection refused,
    reset or timed out; any other request only when the failure shows it never ran (``never_ran``).  The wait before
    retry n (1, 2, ...) is full jitter, uniform in [0, min(cap, base * 2 ** (n - 1))], added to the answer's
    ``Retry-After`` where it has one: the server's delay is honoured, and clients throttled together do not come back
    together.  A wait that would end past the deadline is not made: the last failure is raised, unchanged.

    ``retries`` counts the retries made through this policy (all threads), for the results to report.  ``clock``,
    ``sleep`` and ``random`` are injectable for tests."""

    def __init__(self, attempts=5, base=0.25, cap=4.0, max_seconds=60.0, clock=time.monotonic, sleep=time.sleep, random=random.random):
        self.attempts, self.base, self.cap, self.max_seconds = attempts, base, cap, max_seconds
        self.clock, self.sleep, self.random = clock, sleep, random
        self.retries = 0
        self._lock = threading.Lock()

    def delay(self, error, repeatable, attempt, deadline):
        """Seconds to wait before attempt ``attempt + 1`` after ``error``, or None: raise it."""
        if attempt >= self.attempts or not (_transient(error) and (repeatable or never_ran(error))):
            return None
        wait = (retry_after(error) or 0.0) + self.random() * min(self.cap, self.base * 2 ** (attempt - 1))
        return wait if self.clock() + wait < deadline else None

    def wait(self, seconds):
        with self._lock:
            self.retries += 1
        with _TOTAL_LOCK:
            _TOTAL["retries"] += 1
        self.sleep(seconds)


_TOTAL_LOCK = threading.Lock()
_TOTAL = {"retries": 0}


def retries_total():
    """How many requests this process retried so far, through any ApiClient (all ``RetryPolicy`` instances)."""
    with _TOTAL_LOCK:
        return _TOTAL["retries"]


# What every module that talks to the API server adds to its result, success or failure (_module_shell.run_module
# reports each counter's growth over the module's run): api_retries, the requests it had to send again.
RESULT_COUNTERS = {"api_retries": retries_total}


def retry_policy(api):
    """The ApiClient's RetryPolicy (``api_client`` gives each its own); one is attached where there is none."""
    policy = getattr(api, "gpuharden_retry", None)
    if policy is None:
        policy = api.gpuharden_retry = RetryPolicy()
    return policy


def retries_made(api):
    """How many requests made through ``api`` were retried so far (``RetryPolicy.retries``)."""
    policy = getattr(api, "gpuharden_retry", None)
    return policy.retries if policy is not None else 0


def api_error(error, action):
    """A GpuhardenError for a failed API call: status, reason and the server's own message."""
    if isinstance(error, ApiException) and getattr(error, "status", None):
        message = error.reason
        try:
            message = json.loads(error.body).get("message") or message
        except (TypeError, ValueError, AttributeError):
            pass
        # a 403 never gets here: _k8s_access.failure names the identity and the RBAC rule it lacks
        hint = ": the credentials were not accepted" if error.status == 401 else ""
        kind = {401: "credentials", 403: "forbidden"}.get(error.status, "api")
        return GpuhardenError("%s: API server answered %d %s%s: %s" % (action, error.status, error.reason, hint, message), status=error.status,
                              access=access(kind))
    return GpuhardenError("%s: cannot reach the API server: %s" % (action, error), access=access("unreachable"))


MAX_LIST_RESTARTS = 1  # a continue token that expired (410 Gone) restarts the list once
_GC_LOCK = threading.Lock()
_GC_STATE = {"depth": 0, "was_enabled": False}


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector off for the block (nested and concurrent blocks allowed), back as it was after.

    Decoding a LIST builds millions of dicts, lists and strings; each allocation burst makes the collector walk
    the whole growing heap again, which costs twice the decoding itself at 20,000 pods (measured: 2.1 s of
    ``json.loads`` against 0.7 s with the collector off).  JSON data holds no reference cycles: reference
    counting frees all of it, the collector has nothing to find there.
    """
    with _GC_LOCK:
        if _GC_STATE["depth"] == 0:
            _GC_STATE["was_enabled"] = gc.isenabled()
            gc.disable()
        _GC_STATE["depth"] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_STATE["depth"] -= 1
            if _GC_STATE["depth"] == 0 and _GC_STATE["was_enabled"]:
                gc.enable()


def _status(error):
    return getattr(error, "status", None) if isinstance(error, ApiException) else None


# A page's continue token is read from the head of its raw answer, so that the next page is asked for while this one
# is decoded: the API server writes a list's metadata before its items (ListMeta is declared before Items in every
# list type, k8s.io/apimachinery/pkg/apis/meta/v1/types.go and k8s.io/api/core/v1/types.go PodList, and Go's
# encoding/json writes a struct's fields in declaration order).  The token the decoded page holds is the one
# followed: a page fetched ahead for another token is dropped.
_ITEMS_KEY = b'"items"'
_HEAD_LIMIT = 65536
_CONTINUE_TOKEN = re.compile(rb'"continue"\s*:\s*"([^"\\]*)"')


def _next_token_ahead(data):
    """The continue token in the head of a LIST page's raw JSON (before its items), or None where there is none."""
    end = data.find(_ITEMS_KEY, 0, _HEAD_LIMIT)
    if end < 0:
        return None
    match = _CONTINUE_TOKEN.search(data, 0, end)
    return match.group(1).decode("ascii", "replace") if match else None


class _InThread:
    """``function(*args)`` started in a thread of its own: ``result()`` waits for it and returns its value, or raises
    what it raised, in the caller's thread."""

    def __init__(self, function, *args):
        self._outcome = None
        self._thread = threading.Thread(target=self._run, args=(function, args), daemon=True)
        self._thread.start()

    def _run(self, function, args):
        try:
            self._outcome = (True, function(*args))
        except BaseException as error:  # re-raised by result(), in the caller's thread
            self._outcome = (False, error)

    def result(self):
        self._thread.join()
        succeeded, value = self._outcome
        if not succeeded:
            raise value
        return value


def list_all(api, method, action, failure, page_limit=500, args=(), **params):
    """Every item of one paginated LIST: (items, pages).

    ``method`` is a LIST request (``endpoint(api, "GET", "/api/v1/nodes")``), called with ``args`` and
    ``params`` (selectors) plus ``limit``, ``_continue``, the request timeout and ``_preload_content=False``:
    each page's body is decoded by ``json.loads`` into plain dicts, while the next page is already being asked
    for (its token read from the page's head, see ``_next_token_ahead``).  ``action`` says what the LIST is, for
    error messages (``"gpu_consistency: listing pods"``); ``failure(error)`` turns a failed request into the
    GpuhardenError to raise (``_k8s_access.list_all`` passes its RBAC-aware one: modules list through that).  A
    continue token that expired (410 Gone) restarts the list from the start, once.
    """
    timeout = getattr(api, "gpuharden_request_timeout", None)

    def fetch(token):
        kwargs = dict(params, limit=page_limit, _preload_content=False)
        if token:
            kwargs["_continue"] = token
        if timeout:
            kwargs["_request_timeout"] = timeout
        return method(*args, **kwargs).data

    # ahead: (token, _InThread) of the page asked for while the one before it is decoded
    items, pages, restarts, token, ahead = [], 0, 0, None, None
    while True:
        if ahead is not None and ahead[0] != token:
            pages, ahead = pages + 1, None  # asked for ahead but not the page to follow: counted, dropped
        pages += 1
        try:
            data = ahead[1].result() if ahead is not None else fetch(token)
        except Exception as error:  # ApiException, and urllib3's connection, TLS and read errors
            if _status(error) == 410 and token and restarts < MAX_LIST_RESTARTS:
                items, token, ahead, restarts = [], None, None, restarts + 1
                continue
            raise failure(error) from None
        following = _next_token_ahead(data) if data else None
        ahead = (following, _InThread(fetch, following)) if following else None
        try:
            with gc_paused():
                page = json.loads(data) if data else {}
        except ValueError:
            raise GpuhardenError("%s: the API server's answer is not JSON" % action) from None
        except RecursionError:  # json.loads recurses per nesting level: a hostile answer nests beyond the stack
            raise GpuhardenError("%s: the API server's answer nests too deep to be a Kubernetes object" % action) from None
        if not isinstance(page, dict):
            raise GpuhardenError("%s: the API server's answer is not a list object" % action)
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items, pages + (ahead is not None)


def list_concurrently(lists):
    """Run several ``list_all`` at once, one thread each: ``lists`` is ``{key: callable() -> result}``; returns
    ``{key: result}``.  The first failure (in the order of ``lists``) is raised once every call has ended.

    The threads only wait on sockets and decode JSON; the gain is that the API server encodes one list while
    this process reads and decodes another.  They may share one ``ApiClient``: its urllib3 pool is thread-safe
    and holds several connections (``connection_pool_maxsize``, 5 per CPU).
    """
    running = {key: _InThread(function) for key, function in lists.items()}
    results, errors = {}, {}
    for key, call in running.items():
        try:
            results[key] = call.result()
        except BaseException as error:  # raised once every call has ended
            errors[key] = error
    for key in lists:
        if key in errors:
            raise errors[key]
    return results
