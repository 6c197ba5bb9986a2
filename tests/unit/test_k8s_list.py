# SPDX-License-Identifier: GPL-3.0-or-later
"""The one paginated LIST helper (_k8s.list_all) and its concurrent runner, against fake list methods and, through
the real kubernetes client, against a fake API server."""

from __future__ import annotations

import json
import threading
import time
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_access
from kubernetes.client.rest import ApiException

from tests.unit.conftest import JsonHandler


class Response:
    def __init__(self, body):
        self.data = body if isinstance(body, bytes) else json.dumps(body).encode()


class FakeList:
    """A list_* method over ``count`` items: pages of ``limit``, continue tokens, optional failures by call number."""

    def __init__(self, count, fail=None):
        self.items = [{"metadata": {"name": "o%d" % n}} for n in range(count)]
        self.fail = fail or {}
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        failure = self.fail.get(len(self.calls))
        if failure is not None:
            raise failure
        start = int(kwargs.get("_continue") or 0)
        end = start + kwargs["limit"]
        token = str(end) if end < len(self.items) else None
        return Response({"kind": "List", "metadata": {"continue": token} if token else {}, "items": self.items[start:end]})


class Api:
    gpuharden_request_timeout = 7.0


def api_exception(status, message="boom"):
    error = ApiException(status=status, reason={403: "Forbidden", 410: "Gone", 500: "Internal Server Error"}.get(status, "Error"))
    error.body = json.dumps({"kind": "Status", "message": message})
    return error


def plain(action):
    """The failure of a LIST made outside _k8s_access (only these tests do): the API server's own words."""
    return lambda error: _k8s.api_error(error, action)


def test_follows_continue_and_passes_selectors_raw():
    method = FakeList(5)
    items, pages = _k8s.list_all(Api(), method, "t: listing things", plain("t: listing things"), 2, args=("ns",), field_selector="a!=")
    assert [item["metadata"]["name"] for item in items] == ["o0", "o1", "o2", "o3", "o4"] and pages == 3
    args, kwargs = method.calls[1]
    assert args == ("ns",)
    assert kwargs == {"field_selector": "a!=", "limit": 2, "_preload_content": False, "_continue": "2", "_request_timeout": 7.0}
    assert "_continue" not in method.calls[0][1]


def test_empty_list_is_one_page():
    assert _k8s.list_all(Api(), FakeList(0), "t", plain("t"), 500) == ([], 1)


def test_expired_continue_token_restarts_once():
    method = FakeList(5, fail={2: api_exception(410)})
    items, pages = _k8s.list_all(Api(), method, "t", plain("t"), 2)
    assert len(items) == 5 and pages == 5  # page, 410, then the three pages again
    assert "_continue" not in method.calls[2][1]


def test_second_expiry_and_expiry_of_the_first_page_fail():
    with pytest.raises(GpuhardenError) as error:
        _k8s.list_all(Api(), FakeList(5, fail={2: api_exception(410), 4: api_exception(410)}), "t: listing things", plain("t: listing things"), 2)
    assert error.value.msg.startswith("t: listing things: API server answered 410 Gone") and error.value.result["status"] == 410
    with pytest.raises(GpuhardenError):
        _k8s.list_all(Api(), FakeList(5, fail={1: api_exception(410)}), "t", plain("t"), 2)


def test_plain_failure_and_the_rbac_aware_one():
    with pytest.raises(GpuhardenError) as error:
        _k8s.list_all(Api(), FakeList(1, fail={1: api_exception(500, "etcd down")}), "t: listing pods", plain("t: listing pods"), 2)
    assert error.value.msg == "t: listing pods: API server answered 500 Internal Server Error: etcd down"
    target = _k8s_access.Target("list", "pods")
    denied = api_exception(403, 'pods is forbidden: User "alice" cannot list resource "pods"')
    with pytest.raises(GpuhardenError) as error:
        _k8s.list_all(Api(), FakeList(1, fail={1: denied}), "m: listing pods", lambda failed: _k8s_access.failure("m", target, failed), 2)
    assert error.value.msg.startswith("m: forbidden: alice may not list pods (API group \"\" (core)) at cluster scope")
    assert error.value.result["forbidden"]["identity"] == "alice"


def test_unreachable_and_not_json():
    with pytest.raises(GpuhardenError, match="t: cannot reach the API server: refused"):
        _k8s.list_all(Api(), FakeList(1, fail={1: OSError("refused")}), "t", plain("t"), 2)
    with pytest.raises(GpuhardenError, match="t: the API server's answer is not JSON"):
        _k8s.list_all(Api(), lambda **kwargs: Response(b"<html>"), "t", plain("t"), 2)
    with pytest.raises(GpuhardenError, match="t: the API server's answer is not a list object"):
        _k8s.list_all(Api(), lambda **kwargs: Response(b"[1]"), "t", plain("t"), 2)


def test_access_wrapper_keeps_its_forbidden_message():
    denied = api_exception(403, 'nodes is forbidden: User "bob" cannot list resource "nodes"')
    with pytest.raises(GpuhardenError) as error:
        _k8s_access.list_all("gpu_consistency", Api(), FakeList(1, fail={1: denied}), _k8s_access.Target("list", "nodes"), 10)
    assert "gpu_consistency: forbidden: bob may not list nodes" in error.value.msg and error.value.result["status"] == 403
    assert _k8s_access.list_all("m", Api(), FakeList(3), _k8s_access.Target("list", "nodes"), 2)[1] == 2


def test_the_next_page_is_asked_for_while_this_one_is_decoded(monkeypatch):
    """Each page's decoding waits until the request for the following page has gone out: without the request ahead it
    would wait in vain (and the list fail on the timeout below)."""
    method = FakeList(5)
    real_loads = _k8s.json.loads

    def loads(data):
        page = real_loads(data)
        following = (page.get("metadata") or {}).get("continue")
        if following:
            deadline = time.monotonic() + 5
            while not any(call[1].get("_continue") == following for call in method.calls) and time.monotonic() < deadline:
                time.sleep(0.005)
            assert any(call[1].get("_continue") == following for call in method.calls), "page %s not asked for ahead" % following
        return page

    monkeypatch.setattr(_k8s.json, "loads", loads)
    items, pages = _k8s.list_all(Api(), method, "t", plain("t"), 2)
    assert len(items) == 5 and pages == 3 and len(method.calls) == 3


def test_a_page_asked_for_ahead_for_another_token_is_dropped_and_counted():
    """The decoded page's own token is followed; a request made ahead from a misread head is counted, never used."""
    calls = []

    def method(**kwargs):
        calls.append(kwargs.get("_continue"))
        if kwargs.get("_continue") is None:  # two continue keys: the head says "wrong", the decoded page "2"
            return Response(b'{"kind":"PodList","metadata":{"continue":"wrong","continue":"2"},"items":[{"n":1}]}')
        if kwargs["_continue"] == "wrong":
            return Response(b'{"kind":"PodList","metadata":{},"items":[{"n":"never used"}]}')
        return Response(b'{"kind":"PodList","metadata":{},"items":[{"n":2}]}')

    items, pages = _k8s.list_all(Api(), method, "t", plain("t"), 1)
    assert items == [{"n": 1}, {"n": 2}]
    assert len(calls) == 3 and set(calls) == {None, "2", "wrong"} and pages == 3


@pytest.mark.parametrize(("raw", "token"), [
    # as the API server writes a page: TypeMeta, ListMeta, then the items
    (b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"eyJ2Ijoi+/=","remainingItemCount":7},'
     b'"items":[{"metadata":{"name":"p","annotations":{"continue":"x"}}}]}', "eyJ2Ijoi+/="),
    (b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[]}', None),  # the last page
    (b'{"items":[{"metadata":{"continue":"inside an item"}}],"metadata":{"continue":"late"}}', None),  # items first: not read ahead
    (b'{"kind":"PodList","metadata":{"continue":"x"}}', None),  # no items key in the head
])
def test_the_token_ahead_is_read_only_from_the_head_of_the_page(raw, token):
    assert _k8s._next_token_ahead(raw) == token


def test_concurrently_runs_at_once_and_raises_the_first_failure():
    started = threading.Barrier(2, timeout=5)

    def slow(value):
        started.wait()  # both must be running at the same time, or this times out
        return value

    assert _k8s.list_concurrently({"a": lambda: slow(1), "b": lambda: slow(2)}) == {"a": 1, "b": 2}

    def fail(message):
        raise GpuhardenError(message)

    ended = []
    with pytest.raises(GpuhardenError, match="first"):
        _k8s.list_concurrently({"x": lambda: fail("first"), "y": lambda: ended.append(time.sleep(0.2)), "z": lambda: fail("second")})
    assert ended == [None]  # the caller waited for every list


# ---------------------------------------------------------------------------------------------
# Through the real kubernetes client: raw bodies, pages, one connection per client


class FakeServer:
    def __init__(self, count):
        self.items = [{"metadata": {"name": "n%d" % n}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}} for n in range(count)]
        self.requests = []
        server = self

        class Handler(JsonHandler):
            def do_GET(self):
                url = urlparse(self.path)
                query = {key: values[0] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
                server.requests.append((url.path, query))
                start = int(query.get("continue") or 0)
                end = start + int(query["limit"])
                body = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"continue": str(end) if end < len(server.items) else ""},
                        "items": server.items[start:end]}
                self.send_json(200, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_real_client_plain_dicts():
    params = {name: None for name in _k8s.AUTH_OPTION_NAMES}
    with FakeServer(7) as server:
        params.update(host="http://127.0.0.1:%d" % server.httpd.server_address[1], api_key="t", request_timeout=5)
        api = _k8s.api_client(params)
        try:
            list_nodes = _k8s.endpoint(api, "GET", "/api/v1/nodes")
            items, pages = _k8s.list_all(api, list_nodes, "t: listing nodes", plain("t: listing nodes"), 3, label_selector="a=b")
        finally:
            api.close()
    assert pages == 3 and [type(item) for item in items] == [dict] * 7
    assert items[6] == {"metadata": {"name": "n6"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    assert [query.get("continue") for _path, query in server.requests] == [None, "3", "6"]
    assert {query["labelSelector"] for _path, query in server.requests} == {"a=b"}


class EchoServer:
    """Records each request (method, path, query, headers, JSON body); answers 404 with a Status for paths under
    /missing, else 200 with {"echo": path}."""

    def __init__(self):
        self.requests = []
        server = self

        class Handler(JsonHandler):
            def _answer(self):
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                server.requests.append({"method": self.command, "path": url.path, "query": parse_qs(url.query),
                                        "headers": {key.lower(): value for key, value in self.headers.items()}, "body": body})
                status, answer = (404, {"kind": "Status", "code": 404, "message": "pods \"gone\" not found"}) \
                    if url.path.startswith("/missing") else (200, {"echo": url.path})
                self.send_json(status, answer)

            do_GET = do_PATCH = do_PUT = do_DELETE = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    __enter__, __exit__ = FakeServer.__enter__, FakeServer.__exit__


def test_endpoint_sends_what_the_typed_clients_send():
    """One request path for every verb: path values quoted in place, typed-client keywords as the API server's query
    parameters, the body as JSON with the content type the call names (a PATCH without one: strategic merge, as the
    typed clients send a dict), the token and impersonation headers, and a 404 as the ApiException the typed clients
    raise (kubernetes/client/api/core_v1_api.py's patch_namespaced_pod and delete_namespaced_pod name the same
    parameters)."""
    params = {name: None for name in _k8s.AUTH_OPTION_NAMES}
    with EchoServer() as server:
        params.update(host="http://127.0.0.1:%d/" % server.httpd.server_address[1], api_key="t0ken", request_timeout=5,
                      impersonate_user="system:serviceaccount:gpuharden-system:gpuharden")
        api = _k8s.api_client(params)
        try:
            patch_pod = _k8s.endpoint(api, "PATCH", "/api/v1/namespaces/{namespace}/pods/{name}", "name", "namespace")
            answer = patch_pod("p 1", "ml", {"metadata": {"labels": {"a": "b"}}}, field_manager="gpuharden", force=True,
                               dry_run="All", _content_type="application/apply-patch+yaml", _preload_content=False)
            assert answer.status == 200 and json.loads(answer.data) == {"echo": "/api/v1/namespaces/ml/pods/p%201"}
            patch_pod("p2", "ml", {"spec": {"unschedulable": True}})
            _k8s.endpoint(api, "DELETE", "/api/v1/namespaces/{namespace}/pods/{name}", "name", "namespace")(
                "p3", "ml", body={"preconditions": {"uid": "u3"}}, propagation_policy="Background", force=False)
            _k8s.endpoint(api, "GET", "/api/v1/pods")(label_selector="x=y", _continue="tok", limit=2, field_selector=None)
            with pytest.raises(ApiException) as raised:
                _k8s.endpoint(api, "GET", "/missing/{name}", "name")("gone")
            target = _k8s_access.Target("get", "pods", name="gone")
            status, body = _k8s_access.call("t", api, _k8s.endpoint(api, "GET", "/missing/{name}", "name"), target, "gone",
                                            accept=(404,))
        finally:
            api.close()
    assert raised.value.status == 404 and "not found" in raised.value.body
    assert (status, body["message"]) == (404, 'pods "gone" not found')
    apply, merge, delete, listing = server.requests[:4]
    assert (apply["method"], apply["path"]) == ("PATCH", "/api/v1/namespaces/ml/pods/p%201")  # quoted, as on the wire
    assert apply["query"] == {"fieldManager": ["gpuharden"], "force": ["true"], "dryRun": ["All"]}
    assert apply["headers"]["content-type"] == "application/apply-patch+yaml"
    assert apply["body"] == {"metadata": {"labels": {"a": "b"}}}
    assert merge["headers"]["content-type"] == "application/strategic-merge-patch+json" and merge["query"] == {}
    assert (delete["method"], delete["query"]) == ("DELETE", {"propagationPolicy": ["Background"], "force": ["false"]})
    assert delete["body"] == {"preconditions": {"uid": "u3"}}
    assert listing["query"] == {"labelSelector": ["x=y"], "continue": ["tok"], "limit": ["2"]} and listing["body"] is None
    for sent in server.requests:
        assert sent["headers"]["authorization"] == "Bearer t0ken"
        assert sent["headers"]["impersonate-user"] == "system:serviceaccount:gpuharden-system:gpuharden"
        assert sent["headers"]["accept"] == "application/json"


def test_a_token_auth_settings_does_not_name_is_still_sent(monkeypatch):
    """kubernetes 36.0.0 stores a kubeconfig's token under api_key["authorization"] and its auth_settings() reads only
    "BearerToken": the request still carries the token."""
    params = {name: None for name in _k8s.AUTH_OPTION_NAMES}
    with EchoServer() as server:
        params.update(host="http://127.0.0.1:%d" % server.httpd.server_address[1], api_key="replaced", request_timeout=5)
        api = _k8s.api_client(params)
        try:
            api.configuration.api_key = {"authorization": "Bearer from-kubeconfig"}  # as that loader leaves it
            monkeypatch.setattr(type(api.configuration), "auth_settings", lambda self: {})
            _k8s.endpoint(api, "GET", "/api/v1/nodes")()
            api.configuration.api_key = {}
            _k8s.endpoint(api, "GET", "/api/v1/nodes")()
        finally:
            api.close()
    assert server.requests[0]["headers"]["authorization"] == "Bearer from-kubeconfig"
    assert "authorization" not in server.requests[1]["headers"]  # no token, no header


def test_controller_requests_never_import_the_typed_api_classes():
    """Each typed API class of the kubernetes client builds its pydantic models at import (0.9 CPU-s here for
    CoreV1Api): every request the k8s and cluster layers make (each LIST kind, each verb on each kind, the drain's
    calls, the GPU Operator's CRD) goes through _k8s.endpoint, and none pulls a typed class or a model in."""
    import subprocess
    import sys

    from tests.unit.conftest import COLLECTIONS, REPO_ROOT

    script = """
import sys
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_access, _k8s_objects
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin_reconcile
from ansible_collections.gpuharden.k8s.plugins.modules import node_maintenance
from tests.unit.test_k8s_list import EchoServer

with EchoServer() as server:
    params = dict.fromkeys(_k8s.AUTH_OPTION_NAMES)
    params.update(host="http://127.0.0.1:%d" % server.httpd.server_address[1], api_key="t", request_timeout=5)
    api = _k8s.api_client(params)
    for kind in ("Node", "Pod", "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"):
        _k8s_access.list_kind("t", api, kind)
    client = _k8s_objects.Client(api, "t")
    for kind in ("ConfigMap", "DaemonSet", "RuntimeClass", "Node", "Pod"):
        obj = {"kind": kind, "metadata": {"name": "x", "namespace": "ns"}}
        client.read(kind, "x", "ns"); client.apply(obj, True, True); client.replace(obj, True)
        client.merge_patch(kind, "x", {}, True, "ns"); client.delete(kind, "x", "ns", True)
        client.list(kind, 10); client.list(kind, 10, namespace="ns")
    _device_plugin_reconcile.read_cluster_policies(client, 10)
    cluster = node_maintenance.Cluster(api, 10)
    cluster.node("x"); cluster.set_unschedulable("x", True); cluster.pods(["x"]); cluster.pdbs()
    cluster.evict({"name": "p", "namespace": "ns", "uid": "u"}, None); cluster.delete({"name": "p", "namespace": "ns", "uid": "u"}, None)
    api.close()
print(len(server.requests), sorted(name for name in sys.modules if name.startswith(("kubernetes.client.api.", "kubernetes.client.models."))))
"""
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=REPO_ROOT,
                               env={"PYTHONPATH": "%s:%s" % (COLLECTIONS, REPO_ROOT), "PATH": "/usr/bin:/bin"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    count, loaded = completed.stdout.strip().split(" ", 1)
    assert (int(count), loaded) == (49, "[]"), completed.stdout[:2000]  # 7 LIST kinds, 5 kinds x 7 calls, 1 CRD, 6 drain calls


def test_gc_paused_nests_and_restores():
    import gc

    assert gc.isenabled()
    with _k8s.gc_paused():
        assert not gc.isenabled()
        with _k8s.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), _k8s.gc_paused():
        raise ValueError("x")
    assert gc.isenabled()
    gc.disable()
    try:
        with _k8s.gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_gc_paused_from_concurrent_lists_ends_enabled():
    import gc

    barrier = threading.Barrier(4, timeout=5)

    def work():
        with _k8s.gc_paused():
            barrier.wait()
        return True

    assert _k8s.list_concurrently({n: work for n in range(4)}) == {0: True, 1: True, 2: True, 3: True}
    assert gc.isenabled()


# ---------------------------------------------------------------------------------------------
# gpu_consistency end to end: both LISTs at once, paginated, the same answer as the pure check


class ClusterServer(FakeServer):
    """Nodes and pods (and any other path put in ``lists``) served as paginated LISTs; a path in ``refused`` answers
    403 as the API server's RBAC does."""

    def __init__(self, nodes, pods):
        super().__init__(0)
        self.lists = {"/api/v1/nodes": nodes, "/api/v1/pods": pods}
        self.refused = set()
        # called with the path after each LIST is answered: a test changes the cluster between two reads with it
        self.after_list = None
        server = self

        class Handler(JsonHandler):
            def do_GET(self):
                url = urlparse(self.path)
                query = {key: values[0] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
                server.requests.append((url.path, query))
                if url.path in server.refused:
                    resource = url.path.rsplit("/", 1)[-1]
                    self.send_json(403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403, "message": (
                        'User "system:serviceaccount:gpuharden-system:gpuharden" cannot list resource "%s" at the cluster scope'
                        % resource)})
                    return
                items = server.lists.get(url.path, [])
                start = int(query.get("continue") or 0)
                end = start + int(query["limit"])
                self.send_json(200, {"kind": "List", "metadata": {"continue": str(end) if end < len(items) else ""},
                                     "items": items[start:end]})
                if server.after_list:
                    server.after_list(url.path)

        self.httpd.RequestHandlerClass = Handler


def test_gpu_consistency_module_lists_both_kinds_and_matches_the_pure_check():
    from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency

    from tests.unit.conftest import run_module

    nodes = [{"metadata": {"name": "k%d" % n, "labels": {"nvidia.com/gpu.present": "true"}},
              "status": {"allocatable": {"nvidia.com/gpu": "8" if n else "4"}}} for n in range(25)]
    pods = [{"metadata": {"name": "p%d" % n, "namespace": "ml", "uid": "u%d" % n},
             "spec": {"nodeName": "k%d" % (n % 25), "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
             "status": {"phase": "Running"}} for n in range(60)]
    with ClusterServer(nodes, pods) as server:
        result = run_module("gpu_consistency", {"host": "http://127.0.0.1:%d" % server.httpd.server_address[1], "api_key": "test-token",
                                                "page_limit": 10}, {})
    assert result.get("failed") is not True, result
    assert result["api_requests"] == {"nodes": 3, "pods": 6}
    assert {query["fieldSelector"] for path, query in server.requests if path == "/api/v1/pods"} == {
        "status.phase!=Succeeded,status.phase!=Failed"}
    findings, summary = _consistency.check(nodes, pods, {})
    assert result["findings"] == json.loads(json.dumps(findings)) and result["nodes"] == json.loads(json.dumps(summary))
    assert [f["id"] for f in result["findings"]] == ["allocated_exceeds_declared"]  # k0: 4 declared, 3 pods x 2


def _gpu_node(allocatable):
    return {"metadata": {"name": "gpu-0", "labels": {"nvidia.com/gpu.present": "true"}}, "status": {"allocatable": allocatable}}


def test_gpu_consistency_settles_until_the_node_advertises_its_gpus():
    """The kubelet posts the plugin's devices with a later node status update: with settle_seconds the module reads
    again until the node advertises them, and reports only what the last read shows."""
    from tests.unit.conftest import run_module

    with ClusterServer([_gpu_node({"cpu": "8"})], []) as server:
        # The GPUs appear once the first Nodes LIST is answered, whenever that is: a wall-clock delay raced the module on
        # a loaded machine (CI at 89339b1 saw every read inside 20 s without them).
        def register_after_first_read(path):
            if path == "/api/v1/nodes":
                server.lists["/api/v1/nodes"] = [_gpu_node({"cpu": "8", "nvidia.com/gpu": "2"})]

        server.after_list = register_after_first_read
        result = run_module("gpu_consistency", {"host": "http://127.0.0.1:%d" % server.httpd.server_address[1], "api_key": "test-token",
                                                "settle_seconds": 20}, {})
    assert result.get("failed") is not True, result
    assert result["findings"] == [], result["findings"]
    # one read without the GPUs, one SETTLE_INTERVAL (3 s) later with them
    assert result["settle"]["reads"] == 2 and result["settle"]["awaiting"] == [] and 3 <= result["settle"]["seconds"] < 20
    assert result["api_requests"]["nodes"] == 2


GIVE_UP_SECONDS = 12


def test_gpu_consistency_settle_gives_up_and_reports_the_last_read():
    from tests.unit.conftest import run_module

    with ClusterServer([_gpu_node({"cpu": "8"})], []) as server:
        started = time.monotonic()
        result = run_module("gpu_consistency", {"host": "http://127.0.0.1:%d" % server.httpd.server_address[1], "api_key": "test-token",
                                                "settle_seconds": GIVE_UP_SECONDS}, {})
        waited = time.monotonic() - started
    assert [f["id"] for f in result["findings"]] == ["gpu_not_advertised"]
    # A second read needs the first one to end inside settle_seconds: with a 4 s budget, stop 29's loaded CI made one
    # read only, so the budget here is 12 s (no hook can stand in for the module's own clock, which this test is about).
    assert result["settle"]["awaiting"] == ["gpu-0"] and result["settle"]["reads"] >= 2, result["settle"]
    # The module's own clock (no interpreter start-up): it waits out the budget, then gives up after one more read at
    # most one SETTLE_INTERVAL (3 s) later; the slack is for a loaded CI machine's slow reads.
    assert GIVE_UP_SECONDS <= result["settle"]["seconds"] < GIVE_UP_SECONDS + 3 + 8
    assert waited < 60, "it gave up; a module that kept waiting would hang here"


def test_gpu_consistency_reads_once_without_settle_and_refuses_a_negative_one():
    from tests.unit.conftest import run_module

    with ClusterServer([_gpu_node({"cpu": "8"})], []) as server:
        url = "http://127.0.0.1:%d" % server.httpd.server_address[1]
        result = run_module("gpu_consistency", {"host": url, "api_key": "test-token"}, {})
        assert result["settle"] == {"seconds": 0, "reads": 1, "awaiting": ["gpu-0"], "stale_status": []}
        refused = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "settle_seconds": -1}, {})
        assert refused["failed"] and "settle_seconds=-1" in refused["msg"]
        assert len([path for path, _query in server.requests if path == "/api/v1/nodes"]) == 1


def test_gpu_consistency_settles_only_for_the_nodes_the_run_changed():
    """A node that was already broken (settle_nodes leaves it out) is reported at once: no wait for it."""
    from tests.unit.conftest import run_module

    with ClusterServer([_gpu_node({"cpu": "8"})], []) as server:
        url = "http://127.0.0.1:%d" % server.httpd.server_address[1]
        for settle_nodes in ([], ["gpu-1"]):
            started = time.monotonic()
            result = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "settle_seconds": 20,
                                                    "settle_nodes": settle_nodes}, {})
            # One read and no wait (the module's own account: it sleeps only between reads); the wall time only has to
            # show it ended, with room for a loaded CI machine's interpreter start-up (it failed at 20 s beside a lab).
            assert result["settle"] == {"seconds": 0, "reads": 1, "awaiting": ["gpu-0"], "stale_status": []}, settle_nodes
            assert time.monotonic() - started < 60
        # Named in settle_nodes, gpu-0 is waited for: the GPUs come right after the first Nodes LIST is answered, so the
        # module must read exactly once more (no race of wall-clock delays: with a 4 s settle_seconds, stop 29's loaded
        # CI made one read only).
        def register_after_first_read(path):
            if path == "/api/v1/nodes":
                server.lists["/api/v1/nodes"] = [_gpu_node({"cpu": "8", "nvidia.com/gpu": "2"})]

        server.after_list = register_after_first_read
        result = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "settle_seconds": 30, "settle_nodes": ["gpu-0"]}, {})
        assert result["settle"]["reads"] == 2 and result["settle"]["awaiting"] == [], result["settle"]
        assert result["findings"] == [] and result["api_requests"]["nodes"] == 2


# gpu_consistency with the topology option: the post-check's one controller module run

WORKLOAD_PATHS = {"/apis/apps/v1/deployments": "deployments", "/apis/apps/v1/statefulsets": "statefulsets",
                  "/apis/apps/v1/daemonsets": "daemonsets", "/apis/batch/v1/jobs": "jobs", "/apis/batch/v1/cronjobs": "cronjobs"}
DGX_GPUS = [{"index": n, "numa_node": n // 4} for n in range(8)]


def _topology_cluster():
    nodes = [{"metadata": {"name": "dgx-%d" % n, "labels": {"nvidia.com/gpu.present": "true", "pool": "dgx" if n == 1 else "other"}},
              "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}} for n in (1, 2)]
    pods = [{"metadata": {"name": "small", "namespace": "ml", "uid": "u1"},
             "spec": {"nodeName": "dgx-1", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
             "status": {"phase": "Running"}}]
    train = {"metadata": {"name": "train-8g", "namespace": "ml"},
             "spec": {"template": {"spec": {"nodeSelector": {"pool": "dgx"},
                                            "containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}
    return nodes, pods, train


def test_gpu_consistency_weighs_the_topology_from_the_same_lists():
    """One module run, one LIST per kind: the consistency findings are those of a run without topology, and each node's
    topology is what topology_check gives for it with the same workloads, labels and taints."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _gpu_workloads

    from tests.unit.conftest import run_module

    nodes, pods, train = _topology_cluster()
    single = {"gpus": DGX_GPUS, "topology_manager_policy": "single-numa-node", "cpu_manager_policy": "static"}
    with ClusterServer(nodes, pods) as server:
        server.lists["/apis/apps/v1/deployments"] = [train]
        url = "http://127.0.0.1:%d" % server.httpd.server_address[1]
        plain_run = run_module("gpu_consistency", {"host": url, "api_key": "test-token"}, {})
        server.requests.clear()
        result = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "topology": {"dgx-1": single, "dgx-2": single}}, {})
    assert result.get("failed") is not True, result
    assert result["findings"] == plain_run["findings"] and result["nodes"] == plain_run["nodes"]
    assert plain_run["topology"] == {} and plain_run["api_requests"] == {"nodes": 1, "pods": 1}
    assert result["workloads_error"] is None
    assert result["api_requests"] == {"nodes": 1, "pods": 1, "deployments": 1, "statefulsets": 1, "daemonsets": 1, "jobs": 1, "cronjobs": 1}
    assert sorted(path for path, _query in server.requests) == sorted(["/api/v1/nodes", "/api/v1/pods", *WORKLOAD_PATHS])
    blocked = [entry["workload"]["name"] for entry in result["topology"]["dgx-1"]["findings"] if entry["id"] == "workload_cannot_fit_numa"]
    assert blocked == ["train-8g"]  # its nodeSelector picks dgx-1 only
    assert not [entry for entry in result["topology"]["dgx-2"]["findings"] if entry["id"] == "workload_cannot_fit_numa"]
    workloads = _gpu_workloads.collect({"Pod": pods, "Deployment": [train]}, ["nvidia.com/gpu"])
    alone = run_module("topology_check", dict(single, node_name="dgx-1", workloads=workloads, node_labels={
        "nvidia.com/gpu.present": "true", "pool": "dgx"}), {})
    assert {key: alone[key] for key in result["topology"]["dgx-1"]} == result["topology"]["dgx-1"]


def test_gpu_consistency_keeps_its_findings_when_a_workload_kind_is_forbidden():
    from tests.unit.conftest import run_module

    nodes, pods, train = _topology_cluster()
    single = {"gpus": DGX_GPUS, "topology_manager_policy": "single-numa-node"}
    with ClusterServer(nodes, pods) as server:
        server.lists["/apis/apps/v1/deployments"] = [train]
        server.refused.add("/apis/batch/v1/cronjobs")
        url = "http://127.0.0.1:%d" % server.httpd.server_address[1]
        plain_run = run_module("gpu_consistency", {"host": url, "api_key": "test-token"}, {})
        result = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "topology": {"dgx-1": single}}, {})
    assert result.get("failed") is not True, result
    assert result["findings"] == plain_run["findings"]
    assert "forbidden" in result["workloads_error"] and "list cronjobs (API group batch)" in result["workloads_error"], result["workloads_error"]
    # weighed without workloads, as topology_check alone would: the node's own findings only
    assert not [entry for entry in result["topology"]["dgx-1"]["findings"] if entry.get("workload")]


def test_gpu_consistency_refuses_a_malformed_topology_before_any_request():
    from tests.unit.conftest import run_module

    with ClusterServer([], []) as server:
        url = "http://127.0.0.1:%d" % server.httpd.server_address[1]
        result = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "topology": {"dgx-1": {"gpus": DGX_GPUS,
                                                "topology_manager_policy": "strict"}}}, {})
        empty = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "workload_resources": [""],
                                               "topology": {"dgx-1": {"gpus": DGX_GPUS}}}, {})
    assert result["failed"] and "gpu_consistency: option topology.dgx-1.topology_manager_policy: 'strict'" in result["msg"], result["msg"]
    assert empty["failed"] and "option workload_resources is empty" in empty["msg"], empty["msg"]
    assert server.requests == []


# a drift run's one LIST of pods: gpu_pods_info hands them to gpu_consistency in a snapshot


def _drift_cluster():
    nodes = [{"metadata": {"name": "gpu-%d" % n, "labels": {"nvidia.com/gpu.present": "true"}},
              "status": {"allocatable": {"nvidia.com/gpu": "2"}}} for n in range(3)]
    pods = [{"metadata": {"name": "p%d" % n, "namespace": "ml", "uid": "u%d" % n,
                          "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "DB_PASSWORD=hunter2"}},
             "spec": {"nodeName": "gpu-%d" % (n % 3), "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                                                      "env": [{"name": "DB_PASSWORD", "value": "hunter2"}]}]},
             "status": {"phase": "Running"}} for n in range(7)]
    pods.append({"metadata": {"name": "pending", "namespace": "ml", "uid": "u-pending"},
                 "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpus": "1"}}}]}, "status": {"phase": "Pending"}})
    return nodes, pods


def test_drift_lists_pods_once_gpu_pods_info_hands_them_to_gpu_consistency(tmp_path):
    import os
    import stat

    from tests.unit.conftest import run_module

    env = {"TMPDIR": str(tmp_path)}  # the snapshot goes to the controller's temp directory
    nodes, pods = _drift_cluster()
    with ClusterServer(nodes, pods) as server:
        url = "http://127.0.0.1:%d" % server.httpd.server_address[1]
        auth = {"host": url, "api_key": "test-token"}
        plain_pods = run_module("gpu_pods_info", dict(auth, nodes=["gpu-0", "gpu-1"]), env)
        plain_check = run_module("gpu_consistency", auth, env)
        server.requests.clear()
        listed = run_module("gpu_pods_info", dict(auth, nodes=["gpu-0", "gpu-1"], pods_snapshot=True), env)
        path = listed["pods_snapshot"]
        directory = os.path.dirname(path)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        assert "hunter2" not in text and "DB_PASSWORD" not in text
        checked = run_module("gpu_consistency", dict(auth, pods_snapshot=path), env)
    assert plain_pods["pods_snapshot"] is None and listed.get("failed") is not True, listed
    assert {key: listed[key] for key in ("pods", "pod_uids_by_node", "unlimited_pods")} == {
        key: plain_pods[key] for key in ("pods", "pod_uids_by_node", "unlimited_pods")}
    assert checked.get("failed") is not True, checked
    assert checked["findings"] == plain_check["findings"] and checked["nodes"] == plain_check["nodes"]
    assert "requested_resource_not_advertised" in [f["id"] for f in checked["findings"]]  # the pending pod came through
    assert checked["api_requests"] == {"nodes": 1, "pods": 0}
    # one LIST of pods in all, gpu_consistency's own selector (the whole cluster, pending pods too)
    assert [query.get("fieldSelector") for path_, query in server.requests if path_ == "/api/v1/pods"] == [
        "status.phase!=Succeeded,status.phase!=Failed"]
    assert not os.path.exists(directory), "the snapshot is read once and removed"


def test_a_pods_snapshot_is_only_taken_from_where_gpu_pods_info_writes_them(tmp_path, monkeypatch):
    import os
    import tempfile
    import time as clock

    from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s_snapshot

    from tests.unit.conftest import run_module

    foreign = tmp_path / "pods.json"
    foreign.write_text('{"kind": "pods", "items": []}')
    result = run_module("gpu_consistency", {"host": "http://127.0.0.1:9", "api_key": "test-token", "pods_snapshot": str(foreign)},
                        {"TMPDIR": str(tmp_path)})
    assert result["failed"] and "is not a snapshot this user wrote" in result["msg"], result["msg"]
    assert foreign.exists(), "a file it did not write is never removed"
    refused = run_module("gpu_pods_info", {"host": "http://127.0.0.1:9", "api_key": "test-token", "nodes": ["n"],
                                           "pods_snapshot": True, "include_terminated": True}, {})
    assert refused["failed"] and "exclude each other" in refused["msg"]
    # a run that stopped before its reader left a snapshot behind: the next write removes it once it is stale
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = _k8s_snapshot.write("pods", [])
    fresh = _k8s_snapshot.write("pods", [])
    old = clock.time() - _k8s_snapshot.STALE_SECONDS - 60
    os.utime(os.path.dirname(stale), (old, old))
    newest = _k8s_snapshot.write("pods", [{"metadata": {"name": "p"}}])
    assert not os.path.exists(os.path.dirname(stale)) and os.path.exists(fresh)
    assert _k8s_snapshot.take("test", "snapshot", newest, "pods") == [{"metadata": {"name": "p"}}]
    assert not os.path.exists(os.path.dirname(newest))
    with pytest.raises(GpuhardenError, match="not a snapshot of nodes"):
        _k8s_snapshot.take("test", "snapshot", fresh, "nodes")


def _restarted_node(allocatable, heartbeat):
    node = _gpu_node(allocatable)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}]
    return node


RESTART = 1782907203.4  # 2026-07-01T12:00:03.4Z on the node's clock


def test_gpu_consistency_trusts_a_restarted_nodes_allocatable_only_from_its_new_kubelets_status():
    """Issue 43, item 8 (the flake of stop 41): right after the kubelet's restart the Node still shows the old kubelet's
    allocatable (8), then the new kubelet's first status shows 0 (its device manager starts every resource empty until
    the plugin registers again), then 8.  Without restarted_at the check judges the first read, the old status: clean.
    With it, that read is not trusted (its Ready heartbeat is from before the restart, here in the same second), and the
    zero window is waited out like any advertisement lag."""
    from tests.unit.conftest import run_module

    statuses = [_restarted_node({"nvidia.com/gpu": "8"}, "2026-07-01T12:00:03Z"),  # the old kubelet's, same second
                _restarted_node({"nvidia.com/gpu": "0"}, "2026-07-01T12:00:05Z"),  # the new kubelet's first status
                _restarted_node({"nvidia.com/gpu": "8"}, "2026-07-01T12:00:09Z")]  # the plugin registered again
    report = {"gpu-0": {"gpu_count": 8, "gpus": [{"index": index, "uuid": "GPU-%d" % index} for index in range(8)]}}
    with ClusterServer([statuses[0]], []) as server:
        url = "http://127.0.0.1:%d" % server.httpd.server_address[1]
        old = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "settle_seconds": 30, "node_reports": report,
                                             "settle_nodes": ["gpu-0"]}, {})
        assert old["findings"] == [] and old["settle"]["reads"] == 1  # the flake: the old status, taken as the new one

        def next_status(path):
            if path == "/api/v1/nodes" and len(statuses) > 1:
                statuses.pop(0)
                server.lists["/api/v1/nodes"] = [statuses[0]]

        server.after_list = next_status
        result = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "settle_seconds": 30, "node_reports": report,
                                                "settle_nodes": ["gpu-0"], "restarted_at": {"gpu-0": RESTART}}, {})
    assert result.get("failed") is not True, result
    assert result["findings"] == [] and result["settle"]["reads"] == 3, result["settle"]
    assert result["settle"]["stale_status"] == [] and result["settle"]["awaiting"] == []


def test_a_restarted_kubelet_that_posts_no_status_is_named_not_judged_clean():
    from tests.unit.conftest import run_module

    report = {"gpu-0": {"gpu_count": 2, "gpus": [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}]}}
    with ClusterServer([_restarted_node({"nvidia.com/gpu": "2"}, "2026-07-01T12:00:01Z")], []) as server:
        url = "http://127.0.0.1:%d" % server.httpd.server_address[1]
        result = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "settle_seconds": 4, "node_reports": report,
                                                "restarted_at": {"gpu-0": RESTART}}, {})
        refused = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "restarted_at": {"gpu-0": "soon"}}, {})
    [item] = result["findings"]
    assert item["id"] == "kubelet_status_not_posted" and item["node"] == "gpu-0" and item["remediable"] is False
    assert item["found"] == {"kubelet_restarted_at": "2026-07-01T12:00:03Z", "ready_heartbeat": "2026-07-01T12:00:01Z"}
    assert result["settle"]["stale_status"] == ["gpu-0"] and result["settle"]["reads"] >= 2
    assert refused["failed"] and "restarted_at[gpu-0]='soon'" in refused["msg"]


def test_gpu_consistency_predicts_the_nodes_harden_s_admission_check_keeps():
    """The drift check's admission option: the kubelet plan switches dgx-0 to single-numa-node, and a pod of the cluster
    asks for 8 GPUs, which no NUMA node of the 4+4 DGX holds: harden would keep the node on its policy."""
    from tests.unit.conftest import run_module

    node = {"metadata": {"name": "dgx-0", "labels": {"nvidia.com/gpu.present": "true"}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    trainer = {"metadata": {"name": "train-8g", "namespace": "train", "uid": "u-train"},
               "spec": {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}, "status": {"phase": "Pending"}}
    report = {"dgx-0": {"gpu_count": 8, "gpus": [{"index": index, "uuid": "GPU-%d" % index, "numa_node": index // 4} for index in range(8)]}}
    plan = {"sources": {"topologyManagerPolicy": {"before": None, "after": "single-numa-node"},
                        "topologyManagerScope": {"before": None, "after": None}}, "cpu_manager_policy_changed": True}
    with ClusterServer([node], [trainer]) as server:
        url = "http://127.0.0.1:%d" % server.httpd.server_address[1]
        result = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "node_reports": report, "admission": {"dgx-0": plan}}, {})
        assert result.get("failed") is not True, result
        assert "/apis/apps/v1/deployments" in {path for path, _query in server.requests}
        kept = result["kept"]["dgx-0"]
        assert kept["policy"] == "single-numa-node" and kept["workloads"] == [{"kind": "Pod", "namespace": "train", "name": "train-8g"}]
        server.requests.clear()
        unchanged = dict(plan, sources=dict(plan["sources"], topologyManagerPolicy={"before": "single-numa-node", "after": "single-numa-node"}),
                         cpu_manager_policy_changed=False)
        result = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "node_reports": report, "admission": {"dgx-0": unchanged}}, {})
        assert result["kept"] == {} and "/apis/apps/v1/deployments" not in {path for path, _query in server.requests}
        refused = run_module("gpu_consistency", {"host": url, "api_key": "test-token", "admission": {"dgx-0": "switch"}}, {})
        assert refused["failed"] and "option admission.dgx-0='switch'" in refused["msg"]
