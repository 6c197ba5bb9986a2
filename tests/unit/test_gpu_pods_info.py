# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_pods_info and the shared k8s auth options: pure planners, client construction, and the module
against a small fake API server on 127.0.0.1 that records every request (one paginated LIST, no GETs)."""

from __future__ import annotations

import base64
import json
import threading
from decimal import Decimal
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.doc_fragments import _k8s_auth
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _gpu_pods
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s
from ansible_collections.gpuharden.k8s.plugins.modules import gpu_pods_info

from tests.unit.conftest import JsonHandler, run_module

GI = 1024**3


def pod(name, node, uid, containers, namespace="ml", phase="Running", qos=None, init=None):
    body = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"nodeName": node, "containers": containers},
        "status": {"phase": phase},
    }
    if qos:
        body["status"]["qosClass"] = qos
    if init:
        body["spec"]["initContainers"] = init
    return body


def container(name="main", limits=None, requests=None, restart_policy=None):
    entry = {"name": name, "resources": {}}
    if limits:
        entry["resources"]["limits"] = limits
    if requests:
        entry["resources"]["requests"] = requests
    if restart_policy:
        entry["restartPolicy"] = restart_policy
    return entry


def uid(number):
    return "00000000-0000-4000-8000-%012d" % number


CLUSTER = [
    pod("infer-0", "gpu-1", uid(1), [container(limits={"nvidia.com/gpu": "1", "memory": "16Gi"})], qos="Burstable"),
    pod("notebook", "gpu-1", uid(2), [container(limits={"nvidia.com/gpu": 1})], qos="BestEffort"),
    pod("web", "gpu-1", uid(3), [container(limits={"memory": "1Gi"})], qos="Burstable"),
    pod("train", "gpu-2", uid(4), [container(limits={"nvidia.com/gpu": "8", "memory": "512Gi", "cpu": "32"})], qos="Guaranteed"),
    pod("other", "cpu-1", uid(5), [container(limits={"nvidia.com/gpu": "1"})]),
    pod("done", "gpu-2", uid(6), [container(limits={"nvidia.com/gpu": "1"})], phase="Succeeded"),
    pod("mig", "gpu-2", uid(7), [container(limits={"nvidia.com/mig-1g.10gb": "2", "memory": "4G"})]),
    pod("pending", "", uid(8), [container(limits={"nvidia.com/gpu": "1"})], phase="Pending"),
]


# ---------------------------------------------------------------------------------------------
# Pure: quantities, QoS, summaries, the list plan


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("16Gi", 16 * GI), ("1.5Gi", 3 * GI // 2), ("1G", 10**9), ("512Mi", 512 * 1024**2), ("1e9", 10**9), ("100m", 1), (1024, 1024), ("0", 0), ("2Ki", 2048)],
)
def test_quantity_bytes(quantity, expected):
    assert _gpu_pods.quantity_bytes(quantity, "x") == expected


@pytest.mark.parametrize("quantity", ["16GB", "lots", "", "1.2.3Gi", "Gi", True, None, [1], "-1Gi"])
def test_bad_quantities_are_named(quantity):
    with pytest.raises(GpuhardenError, match="pod ml/x container main resources.limits.memory"):
        _gpu_pods.quantity_bytes(quantity, "pod ml/x container main resources.limits.memory")


def test_parse_quantity_decimal_suffixes():
    assert _gpu_pods.parse_quantity("250m", "x") == Decimal("0.25")
    assert _gpu_pods.parse_quantity("2k", "x") == 2000


def test_list_plan_one_node_filters_on_the_server():
    assert _gpu_pods.list_plan(["gpu-1"]) == ("spec.nodeName=gpu-1,status.phase!=Succeeded,status.phase!=Failed", ["gpu-1"])


def test_list_plan_several_nodes_lists_bound_pods_once():
    selector, names = _gpu_pods.list_plan(["gpu-1", "gpu-2", "gpu-1"], include_terminated=True)
    assert (selector, names) == ("spec.nodeName!=", ["gpu-1", "gpu-2"])


@pytest.mark.parametrize("node", ["", "a,b", "spec.nodeName=x", None])
def test_list_plan_refuses_odd_node_names(node):
    with pytest.raises(GpuhardenError, match=r"nodes\[1\]"):
        _gpu_pods.list_plan(["gpu-1", node])


def test_summarize_gpu_pod():
    summary = _gpu_pods.summarize(CLUSTER[0], ["nvidia.com/"])
    assert summary["gpu_requests"] == {"nvidia.com/gpu": 1}
    assert summary["memory_limit_bytes"] == 16 * GI and summary["memory_unlimited"] is False
    assert summary["qos_class"] == "Burstable"
    assert _gpu_pods.summarize(CLUSTER[2], ["nvidia.com/"]) is None


def test_summarize_init_and_sidecar_containers():
    body = pod(
        "x", "n", uid(9),
        [container(limits={"nvidia.com/gpu": "1", "memory": "1Gi"})],
        init=[container("setup", limits={"nvidia.com/gpu": "2"}), container("proxy", limits={"memory": "1Gi"}, restart_policy="Always")],
    )
    summary = _gpu_pods.summarize(body, ["nvidia.com/"])
    assert summary["gpu_requests"] == {"nvidia.com/gpu": 2}  # an init container's peak counts
    assert summary["memory_limit_bytes"] == 2 * GI  # main + sidecar


def test_qos_class_computed_when_status_lacks_it():
    assert _gpu_pods.qos_class(pod("g", "n", uid(1), [container(limits={"cpu": "1", "memory": "1Gi"})])) == "Guaranteed"
    assert _gpu_pods.qos_class(pod("b", "n", uid(1), [container(limits={"memory": "1Gi"})])) == "Burstable"
    assert _gpu_pods.qos_class(pod("e", "n", uid(1), [container(limits={"nvidia.com/gpu": "1"})])) == "BestEffort"


def test_collect_groups_by_node_and_reports_unlimited():
    found, by_node, unlimited = _gpu_pods.collect(CLUSTER, ["gpu-1", "gpu-2", "gpu-9"], ["nvidia.com/"])
    assert [p["name"] for p in found] == ["infer-0", "notebook", "done", "mig", "train"]
    assert by_node == {"gpu-1": [uid(1), uid(2)], "gpu-2": [uid(6), uid(7), uid(4)], "gpu-9": []}
    assert unlimited == [
        {"uid": uid(2), "namespace": "ml", "name": "notebook", "node": "gpu-1"},
        {"uid": uid(6), "namespace": "ml", "name": "done", "node": "gpu-2"},
    ]


def test_summarize_names_the_bad_field():
    body = pod("bad", "gpu-1", uid(1), [container(limits={"nvidia.com/gpu": "1", "memory": "sixteen"})])
    with pytest.raises(GpuhardenError, match="pod ml/bad container main resources.limits.memory: 'sixteen'"):
        _gpu_pods.summarize(body, ["nvidia.com/"])


# ---------------------------------------------------------------------------------------------
# Auth options: spec and documentation in sync, validation, client construction


def test_auth_spec_matches_doc_fragment():
    documented = yaml.safe_load(_k8s_auth.ModuleDocFragment.DOCUMENTATION)["options"]
    spec = _k8s.auth_argument_spec()
    assert set(documented) == set(spec)
    for name, option in documented.items():
        assert option["type"] == spec[name]["type"], name
        assert option.get("default") == spec[name].get("default"), name
        assert sorted(option.get("aliases", [])) == sorted(spec[name].get("aliases", [])), name
        assert set(option.get("suboptions", {})) == set(spec[name].get("options", {})), name
    assert spec["api_key"]["no_log"] is True
    assert spec["proxy_headers"]["options"]["proxy_basic_auth"]["no_log"] is True


def test_auth_spec_is_a_copy():
    spec = _k8s.auth_argument_spec()
    spec["host"]["type"] = "int"
    assert _k8s.AUTH_ARG_SPEC["host"]["type"] == "str"


def test_module_spec_includes_auth_options():
    assert set(_k8s.AUTH_OPTION_NAMES) <= set(gpu_pods_info.argument_spec())


def _params(**kwargs):
    params = {name: None for name in _k8s.AUTH_ARG_SPEC}
    params["request_timeout"] = 60
    params.update(kwargs)
    return params


FAKE_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def kubeconfig_dict(server="https://10.0.0.1:6443", token="secret-token", contexts=("lab",)):
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": base64.b64encode(FAKE_PEM.encode()).decode()}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "c", "user": "u"}} for name in contexts],
        "current-context": contexts[0],
    }


def test_auth_sources():
    assert _k8s.auth_settings(_params(), environ={})["source"] == "default_kubeconfig"
    assert _k8s.auth_settings(_params(), environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})["source"] == "in_cluster"
    assert _k8s.auth_settings(_params(host="https://h:6443", api_key="t"), environ={})["source"] == "params"
    assert _k8s.auth_settings(_params(kubeconfig={"a": 1}), environ={})["source"] == "kubeconfig_dict"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kubeconfig": "/nonexistent/kubeconfig"}, "kubeconfig=/nonexistent/kubeconfig: no such file"),
        ({"kubeconfig": 42}, "kubeconfig must be a path or a dictionary, not int"),
        ({"host": "10.0.0.1:6443", "api_key": "t"}, "host='10.0.0.1:6443' is not an http(s) URL"),
        ({"host": "https://h:6443"}, "needs api_key or client_cert"),
        ({"proxy": "proxy:3128"}, "proxy='proxy:3128' is not an http(s) URL"),
        ({"client_cert": "/etc/hostname"}, "client_cert and client_key go together; only client_cert is set"),
        ({"ca_cert": "/nonexistent/ca.crt"}, "ca_cert=/nonexistent/ca.crt: no such file"),
        ({"request_timeout": 0}, "request_timeout=0 must be a positive"),
    ],
)
def test_auth_settings_refuse_bad_input(params, message):
    with pytest.raises(GpuhardenError) as caught:
        _k8s.auth_settings(_params(**params), environ={})
    assert message in caught.value.msg


def test_configuration_from_kubeconfig_file_with_overrides(world_tmp):
    path = world_tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig_dict(contexts=("lab", "other"))))
    ca = world_tmp / "ca.crt"
    ca.write_text(FAKE_PEM)
    before = path.read_bytes()
    settings = _k8s.auth_settings(_params(kubeconfig=str(path), context="other", validate_certs=False, ca_cert=str(ca), proxy="http://127.0.0.1:3128",
                                          proxy_headers={"proxy_basic_auth": "u:p", "user_agent": None}), environ={})
    conf = _k8s.configuration(settings)
    assert conf.host == "https://10.0.0.1:6443"
    assert conf.get_api_key_with_prefix("BearerToken", alias="authorization") == "Bearer secret-token"
    assert conf.verify_ssl is False and conf.ssl_ca_cert == str(ca)
    assert conf.proxy == "http://127.0.0.1:3128" and "proxy-authorization" in conf.proxy_headers
    assert path.read_bytes() == before  # never written back


def test_configuration_from_dict_and_api_key_override():
    settings = _k8s.auth_settings(_params(kubeconfig=kubeconfig_dict(), host="https://other:6443/", api_key="override"), environ={})
    conf = _k8s.configuration(settings)
    assert conf.host == "https://other:6443"
    assert conf.auth_settings()["BearerToken"]["value"] == "Bearer override"


def test_impersonation_header():
    api = _k8s.api_client(_params(host="https://h:6443", api_key="t", impersonate_user="system:serviceaccount:x:y"))
    assert api.default_headers["Impersonate-User"] == "system:serviceaccount:x:y"
    api.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("clusters: [\n", "cannot load kubeconfig"),
        ("apiVersion: v1\nkind: Config\n", "cannot load kubeconfig"),
        (yaml.safe_dump(kubeconfig_dict()), "context"),
    ],
)
def test_broken_kubeconfig_is_a_clear_error(world_tmp, content, message):
    path = world_tmp / "kubeconfig"
    path.write_text(content)
    params = _params(kubeconfig=str(path), context="missing" if "context" in message else None)
    with pytest.raises(GpuhardenError) as caught:
        _k8s.configuration(_k8s.auth_settings(params, environ={}))
    assert message in caught.value.msg and str(path) in caught.value.msg


# ---------------------------------------------------------------------------------------------
# The module against a fake API server


class FakeApi:
    """GET /api/v1/pods with fieldSelector, limit and continue; anything else is recorded and 404."""

    def __init__(self, pods, status=None):
        self.pods = pods
        self.status = status
        self.requests = []
        self.expire_once = False
        api = self

        class Handler(JsonHandler):
            def do_GET(self):
                url = urlparse(self.path)
                query = {key: values[0] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
                api.requests.append((url.path, query, self.headers.get("Authorization")))
                if api.status:
                    return self.send_json(api.status, {"kind": "Status", "message": 'pods is forbidden: User "gpuharden" cannot list resource "pods"'})
                if url.path != "/api/v1/pods":
                    return self.send_json(404, {"kind": "Status", "message": "not found"})
                if api.expire_once and query.get("continue"):
                    api.expire_once = False
                    return self.send_json(410, {"kind": "Status", "message": "The provided continue parameter is too old"})
                items = [item for item in api.pods if api.matches(item, query.get("fieldSelector", ""))]
                start = int(query.get("continue") or 0)
                limit = int(query.get("limit") or len(items) or 1)
                page = items[start : start + limit]
                token = str(start + limit) if start + limit < len(items) else ""
                return self.send_json(200, {"kind": "PodList", "metadata": {"continue": token}, "items": page})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @staticmethod
    def matches(item, selector):
        for term in filter(None, selector.split(",")):
            negate = "!=" in term
            field, value = term.split("!=" if negate else "=", 1)
            actual = item["spec"].get("nodeName", "") if field == "spec.nodeName" else item["status"].get("phase", "")
            if (actual == value) == negate:
                return False
        return True

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def run_info(api, **args):
    args.setdefault("host", api.url)
    args.setdefault("api_key", "test-token")
    return run_module("gpu_pods_info", args, {})


def test_module_one_paginated_list_for_several_nodes():
    with FakeApi(CLUSTER) as api:
        result = run_info(api, nodes=["gpu-1", "gpu-2"], page_limit=2)
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    assert [p["name"] for p in result["pods"]] == ["infer-0", "notebook", "mig", "train"]
    assert result["pod_uids_by_node"] == {"gpu-1": [uid(1), uid(2)], "gpu-2": [uid(7), uid(4)]}
    assert [p["name"] for p in result["unlimited_pods"]] == ["notebook"]
    # Only LISTs of /api/v1/pods, each a page of the same selector, authenticated with the token.
    assert {path for path, _query, _auth in api.requests} == {"/api/v1/pods"}
    assert {query["fieldSelector"] for _path, query, _auth in api.requests} == {"spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"}
    assert len(api.requests) == result["api_requests"] == 3  # 6 bound, live pods in pages of 2
    assert {auth for _path, _query, auth in api.requests} == {"Bearer test-token"}
    assert "test-token" not in json.dumps(result)


def test_module_one_node_uses_a_server_side_selector():
    with FakeApi(CLUSTER) as api:
        result = run_info(api, nodes=["gpu-2"], include_terminated=True)
    assert [p["name"] for p in result["pods"]] == ["done", "mig", "train"]
    assert api.requests[0][1]["fieldSelector"] == "spec.nodeName=gpu-2"
    assert result["api_requests"] == 1
    mig = result["pods"][1]
    assert mig["gpu_requests"] == {"nvidia.com/mig-1g.10gb": 2} and mig["memory_limit_bytes"] == 4 * 10**9


def test_module_restarts_the_list_once_when_the_continue_token_expired():
    with FakeApi(CLUSTER) as api:
        api.expire_once = True
        result = run_info(api, nodes=["gpu-1", "gpu-2"], page_limit=4)
    assert len(result["pods"]) == 4 and result["api_requests"] == 4  # page, 410, page, page


def test_module_forbidden_is_a_clear_error():
    with FakeApi(CLUSTER, status=403) as api:
        result = run_info(api, nodes=["gpu-1"])
    assert result["failed"] is True
    assert "gpu_pods_info: forbidden: gpuharden may not list pods (API group \"\" (core)) at cluster scope" in result["msg"]
    assert "deploy/rbac/gpuharden-rbac.yaml" in result["msg"]
    assert 'cannot list resource "pods"' in result["msg"]


def test_module_unreachable_server_is_a_clear_error():
    result = run_module("gpu_pods_info", {"host": "http://127.0.0.1:9", "api_key": "unused-token", "nodes": ["n"], "request_timeout": 2}, {})
    assert result["failed"] is True and "cannot reach the API server" in result["msg"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"page_limit": 0}, "page_limit=0"),
        ({"resource_prefixes": [""]}, "resource_prefixes is empty"),
        ({"nodes": ["a,b"]}, "nodes[0]='a,b' is not a node name"),
        ({"kubeconfig": "/nonexistent"}, "kubeconfig=/nonexistent: no such file"),
    ],
)
def test_module_bad_options(args, message):
    with FakeApi(CLUSTER) as api:
        result = run_info(api, **dict({"nodes": ["gpu-1"]}, **args))
    assert result["failed"] is True and message in result["msg"]
    assert api.requests == []


def test_module_empty_node_list_makes_no_request():
    with FakeApi(CLUSTER) as api:
        result = run_info(api, nodes=[])
    assert result["pods"] == [] and result["api_requests"] == 0 and api.requests == []
