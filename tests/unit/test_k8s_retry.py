# SPDX-License-Identifier: GPL-3.0-or-later
"""The one retry policy of the Kubernetes request path (_k8s.request, _k8s.RetryPolicy), through the real kubernetes
client's urllib3 pool against a fake API server that answers from a script: throttling, failures, broken connections.
The clock and the sleep are injected: no test waits for real."""

from __future__ import annotations

import json
import socket
import struct
import threading
from http.server import ThreadingHTTPServer

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_access, _k8s_objects

from tests.unit.conftest import JsonHandler

# What the API server's flow control answers (k8s.io/apiserver v0.36.3 pkg/server/filters/priority-and-fairness.go
# tooManyRequests: http.Error, text/plain, Retry-After from the dropped-requests tracker, 1 at first).
APF_REJECTION = (429, {"Retry-After": "1"}, b"Too many requests, please try again later.\n", "text/plain; charset=utf-8")
UNAVAILABLE = (503, {}, json.dumps({"kind": "Status", "code": 503, "reason": "ServiceUnavailable", "message": "etcd is down"}).encode(),
               "application/json")
# An eviction a PodDisruptionBudget refuses: a handler's JSON Status (k8s.io/kubernetes v1.36.3
# pkg/registry/core/pod/storage/eviction.go), Retry-After from its retryAfterSeconds (responsewriters/writers.go).
BUDGET_REFUSAL = (429, {"Retry-After": "10"}, json.dumps({"kind": "Status", "code": 429, "reason": "TooManyRequests",
                                                          "message": "Cannot evict pod as it would violate the pod's disruption budget."}).encode(),
                  "application/json")
RESET = "reset"


def ok(body=None):
    return 200, {}, json.dumps(body if body is not None else {"kind": "NodeList", "metadata": {}, "items": [{"metadata": {"name": "n0"}}]}).encode(), \
        "application/json"


class ScriptedServer:
    """Answers the n-th request with ``script[n]`` (the last entry once the script is used up): (status, headers,
    body, content type), or RESET to drop the connection with a TCP reset before answering.  Records (method, path)."""

    def __init__(self, *script):
        self.script, self.requests = list(script), []
        server = self

        class Handler(JsonHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                server.requests.append((self.command, self.path))
                action = server.script[min(len(server.requests), len(server.script)) - 1]
                if action == RESET:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                status, headers, body, content_type = action
                self.send_response(status)
                for key, value in dict(headers, **{"Content-Type": content_type, "Content-Length": str(len(body))}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PATCH = do_PUT = do_DELETE = do_POST = _answer

            def handle_one_request(self):
                try:
                    super().handle_one_request()
                except OSError:  # the socket this handler reset itself
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Clock:
    """A monotonic clock that only the injected sleep moves; every sleep recorded."""

    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


def client_for(url, clock, attempts=5, timeout=30):
    params = {name: None for name in _k8s.AUTH_OPTION_NAMES}
    params.update(host=url, api_key="t0ken", request_timeout=timeout)
    api = _k8s.api_client(params)
    # random() 0.5: the jitter is half its bound, so that each wait is known
    api.gpuharden_retry = _k8s.RetryPolicy(attempts=attempts, clock=clock.clock, sleep=clock.sleep, random=lambda: 0.5)
    return api


@pytest.fixture
def serve():
    servers = []

    def start(*script):
        servers.append(ScriptedServer(*script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def nodes_target():
    return _k8s_access.Target("list", "nodes")


def get_nodes(api):
    return _k8s_access.call("t", api, _k8s.endpoint(api, "GET", "/api/v1/nodes"), nodes_target())


def test_apf_429_then_200_waits_what_retry_after_asks(serve):
    server, clock = serve(APF_REJECTION, ok()), Clock()
    api = client_for(server.url, clock)
    try:
        status, body = get_nodes(api)
    finally:
        api.close()
    assert (status, body["items"][0]["metadata"]["name"]) == (200, "n0")
    assert len(server.requests) == 2
    assert clock.sleeps == [1.0 + 0.5 * 0.25]  # Retry-After: 1, plus the jitter of the first retry (half of base 0.25)
    assert _k8s.retries_made(api) == 1


def test_503_exhausts_the_attempts_and_fails_as_without_retries(serve):
    server, clock = serve(UNAVAILABLE), Clock()
    api, once = client_for(server.url, clock, attempts=4), client_for(server.url, Clock(), attempts=1)
    try:
        with pytest.raises(GpuhardenError) as retried:
            get_nodes(api)
        assert len(server.requests) == 4
        with pytest.raises(GpuhardenError) as single:
            get_nodes(once)
        assert len(server.requests) == 5
    finally:
        api.close()
        once.close()
    assert clock.sleeps == [0.125, 0.25, 0.5]  # full jitter bounds 0.25, 0.5, 1 (exponential), random() 0.5
    assert str(retried.value) == str(single.value) == \
        "t: list nodes (API group \"\" (core)) at cluster scope: API server answered 503 Service Unavailable: etcd is down"
    assert retried.value.result["status"] == 503 and retried.value.result["access"]["kind"] == "api"
    assert (_k8s.retries_made(api), _k8s.retries_made(once)) == (3, 0)


def test_reset_connection_is_retried_for_a_list(serve):
    server, clock = serve(RESET, ok()), Clock()
    api = client_for(server.url, clock)
    try:
        items, pages = _k8s_access.list_kind("t", api, "Node")
    finally:
        api.close()
    assert [item["metadata"]["name"] for item in items] == ["n0"] and pages == 1
    assert len(server.requests) == 2 and clock.sleeps == [0.125] and _k8s.retries_made(api) == 1


def test_urllib3_repeats_nothing_on_its_own(serve):
    """One policy: with one attempt allowed, a reset GET is sent once (urllib3's default Retry(3) would send it four
    times, at once), and it fails as it failed before: cannot reach the API server."""
    server, clock = serve(RESET), Clock()
    api = client_for(server.url, clock, attempts=1)
    try:
        with pytest.raises(GpuhardenError) as raised:
            get_nodes(api)
    finally:
        api.close()
    assert len(server.requests) == 1 and clock.sleeps == []
    assert "cannot reach the API server" in str(raised.value) and raised.value.result["access"]["kind"] == "unreachable"


def test_a_create_or_a_merge_patch_is_not_repeated_after_a_5xx(serve):
    """A request that may have happened before its answer was lost is never sent twice: POST (create, eviction, token),
    PUT, a merge patch, DELETE."""
    server, clock = serve(UNAVAILABLE), Clock()
    api = client_for(server.url, clock)
    requests = [
        (_k8s.endpoint(api, "POST", "/api/v1/namespaces/{namespace}/configmaps", "namespace"), ("ns", {"metadata": {"name": "c"}}), {}),
        (_k8s.endpoint(api, "PUT", "/api/v1/nodes/{name}", "name"), ("n0", {"metadata": {"name": "n0", "resourceVersion": "7"}}), {}),
        (_k8s.endpoint(api, "PATCH", "/api/v1/nodes/{name}", "name"), ("n0", {"spec": {"unschedulable": True}}), {}),
        (_k8s.endpoint(api, "DELETE", "/api/v1/namespaces/{namespace}/pods/{name}", "name", "namespace"), ("p", "ns"), {}),
    ]
    try:
        for method, args, kwargs in requests:
            with pytest.raises(_k8s.ApiException):
                method(*args, **kwargs)
    finally:
        api.close()
    assert [verb for verb, _path in server.requests] == ["POST", "PUT", "PATCH", "DELETE"]
    assert clock.sleeps == [] and _k8s.retries_made(api) == 0


def test_a_dry_run_and_a_server_side_apply_are_repeated_after_a_5xx(serve):
    server, clock = serve(UNAVAILABLE, ok({"kind": "ConfigMap"}), UNAVAILABLE, ok({"kind": "ConfigMap"})), Clock()
    api = client_for(server.url, clock)
    client = _k8s_objects.Client(api, "t")
    desired = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}
    try:
        create = _k8s.endpoint(api, "POST", "/api/v1/namespaces/{namespace}/configmaps", "namespace")
        assert json.loads(create("ns", desired, dry_run="All").data) == {"kind": "ConfigMap"}
        assert client.apply(desired, dry_run=False, force=True) == {"kind": "ConfigMap"}
    finally:
        api.close()
    assert [verb for verb, _path in server.requests] == ["POST", "POST", "PATCH", "PATCH"]
    assert client.retries == 2 and clock.sleeps == [0.125, 0.125]


def test_an_apf_429_is_repeated_for_any_request_a_budget_429_never(serve):
    """The flow control's 429 (text, before any handler ran) is safe to repeat even for an eviction; the eviction
    API's own 429 (a JSON Status: the budget refused) is the caller's answer, returned at once."""
    server, clock = serve(APF_REJECTION, BUDGET_REFUSAL), Clock()
    api = client_for(server.url, clock)
    evict = _k8s.endpoint(api, "POST", "/api/v1/namespaces/{namespace}/pods/{name}/eviction", "name", "namespace")
    target = _k8s_access.Target("create", "pods/eviction", namespace="ns", name="p")
    try:
        status, body = _k8s_access.call("t", api, evict, target, "p", "ns", {"kind": "Eviction"}, accept=(429,))
    finally:
        api.close()
    assert (status, body["reason"]) == (429, "TooManyRequests")
    assert len(server.requests) == 2 and clock.sleeps == [1.125] and _k8s.retries_made(api) == 1


def test_a_refused_connection_is_retried_even_for_a_create():
    """A connection never made sent nothing: any request may be retried; the last failure reads as before."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = "http://127.0.0.1:%d" % probe.getsockname()[1]
    clock = Clock()
    api = client_for(url, clock, attempts=3)
    create = _k8s.endpoint(api, "POST", "/api/v1/namespaces/{namespace}/configmaps", "namespace")
    target = _k8s_access.Target("create", "configmaps", namespace="ns")
    try:
        with pytest.raises(GpuhardenError) as raised:
            _k8s_access.call("t", api, create, target, "ns", {"metadata": {"name": "c"}})
    finally:
        api.close()
    assert clock.sleeps == [0.125, 0.25] and _k8s.retries_made(api) == 2
    assert "cannot reach the API server" in str(raised.value) and "Connection refused" in str(raised.value)
    assert raised.value.result["access"]["kind"] == "unreachable"


def test_the_retries_end_within_the_request_timeout(serve):
    """Never retried past the deadline the caller gave (the request timeout, from the first attempt): a wait that
    would end after it is not made, and a Retry-After longer than the time left ends the request at once."""
    server, clock = serve((503, {"Retry-After": "2"}, UNAVAILABLE[2], "application/json")), Clock()
    api = client_for(server.url, clock, attempts=10, timeout=5)
    try:
        with pytest.raises(GpuhardenError) as raised:
            get_nodes(api)
        assert clock.sleeps == [2.125, 2.25] and clock.now - 100.0 < 5  # a third wait, 2.5 s, would end at 6.875 s
        assert len(server.requests) == 3 and raised.value.result["status"] == 503
        server.script = [(429, {"Retry-After": "30"}, b"Too many requests, please try again later.\n", "text/plain")]
        with pytest.raises(GpuhardenError) as throttled:
            get_nodes(api)
    finally:
        api.close()
    assert len(server.requests) == 4 and len(clock.sleeps) == 2 and throttled.value.result["status"] == 429


@pytest.mark.parametrize("method, content_type, dry_run, repeatable", [
    ("GET", None, None, True),
    ("HEAD", None, None, True),
    ("POST", "application/json", None, False),
    ("POST", "application/json", "All", True),
    ("PATCH", "application/apply-patch+yaml", None, True),
    ("PATCH", "application/merge-patch+json", None, False),
    ("PATCH", "application/strategic-merge-patch+json", "All", True),
    ("PUT", "application/json", None, False),
    ("DELETE", None, None, False),
])
def test_repeatable_requests(method, content_type, dry_run, repeatable):
    assert _k8s.repeatable_request(method, content_type, dry_run) is repeatable


@pytest.mark.parametrize("header, seconds", [("1", 1.0), ("0", 0.0), ("2.5", 2.5), ("Wed, 21 Oct 2026 07:28:00 GMT", None), ("-3", None),
                                             (None, None)])
def test_retry_after_seconds(header, seconds):
    error = _k8s.ApiException(status=429, reason="Too Many Requests")
    error.headers = {"Retry-After": header} if header is not None else {}
    assert _k8s.retry_after(error) == seconds
