# SPDX-License-Identifier: GPL-3.0-or-later
"""The whole cluster side under the least-privilege identity of deploy/rbac/gpuharden-rbac.yaml.

As admin: apply the RBAC file, mint a token for ServiceAccount gpuharden-system/gpuharden (TokenRequest API) and
write a kubeconfig with it and the lab's CA.  Under that token: gpu_consistency, gpu_pods_info, node_maintenance
(check mode, cordon + drain + uncordon) and, when they are in this checkout, the device_plugin / runtime_class /
node label modules (check mode).  Then forbidden actions fail with a message naming the identity, the verb and
the resource: a drain with disable_eviction (delete on pods, not granted), deleting a Node, reading Secrets.
"""

from __future__ import annotations

import base64
import tempfile

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._k8s_access import Target, call
from gpuharden_lab import REPO_ROOT
from kubernetes import client, utils

from tests.integration import cluster_side as cs
from tests.labfixtures import shared_lab

# real_nodes: the healthy lab's nodes run the real kubelet and containerd (they need real-components; `make real-nodes` runs only these).
pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

RBAC = REPO_ROOT / "deploy/rbac/gpuharden-rbac.yaml"
IDENTITY = "system:serviceaccount:gpuharden-system:gpuharden"
NODE = "gpu-l4-0"
NS = "identity-test"
# Modules of issue 5 sections 1-3, written in parallel: run when present (check mode, auth options only).
OTHER_MODULES = ["device_plugin", "runtime_class", "gpu_node_labels"]


def _tool_kubeconfig(state, token, directory):
    with open(state["cluster"]["admin_kubeconfig"]) as handle:
        admin = yaml.safe_load(handle)
    assert base64.b64decode(admin["clusters"][0]["cluster"]["certificate-authority-data"])  # TLS verified against the lab CA
    return cs.token_kubeconfig(state, token, directory)


@pytest.fixture(scope="module")
def lab():
    with shared_lab("healthy") as state, tempfile.TemporaryDirectory(prefix="gpuharden-identity-") as directory:
        api = cs.admin(state)
        # The lab already applied deploy/rbac (the tool runs as that ServiceAccount there); apply it again
        # anyway when it is missing, so this test does not depend on the lab doing it.
        try:
            utils.create_from_yaml(api, str(RBAC))
        except utils.FailToCreateError as error:
            assert all(getattr(cause, "status", None) == 409 for cause in error.api_exceptions), error
        core = client.CoreV1Api(api)
        request = core.create_namespaced_service_account_token("gpuharden", "gpuharden-system", {"spec": {"expirationSeconds": 3600}})
        state = dict(state, sa_kubeconfig=_tool_kubeconfig(state, request.status.token, directory))
        cs.ensure_namespace(core, NS)
        core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"},
                                        "spec": {"nodeName": NODE, "tolerations": [{"operator": "Exists"}],
                                                 "containers": [{"name": "main", "image": "registry.example/app:1"}]}})
        yield dict(state, _api=api)
        try:
            cs.put_back(core, NS, [NODE])
        finally:
            api.close()


def _module(lab, module, check=False, **options):
    found, _stats, _s = cs.run(lab, module="gpuharden.k8s." + module, args=cs.module_args(kubeconfig=lab["sa_kubeconfig"], **options), check=check)
    [result] = found
    return result


def test_token_is_the_service_account(lab):
    api = _k8s.api_client({"kubeconfig": lab["sa_kubeconfig"]})
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    finally:
        api.close()
    assert review.status.user_info.username == IDENTITY


def test_gpu_consistency_and_gpu_pods_info(lab):
    result = _module(lab, "gpu_consistency", nodes=[NODE])
    assert result["_event"] == "runner_on_ok", result.get("msg")
    assert result["api_requests"] == {"nodes": 1, "pods": 1} and NODE in result["nodes"]
    result = _module(lab, "gpu_pods_info", nodes=[NODE])
    assert result["_event"] == "runner_on_ok", result.get("msg")
    # the post-check's one run: the same LISTs plus the workload controllers, all allowed to the tool identity
    result = _module(lab, "gpu_consistency", nodes=[NODE], topology={NODE: {"gpus": [{"index": 0, "numa_node": 0}]}})
    assert result["_event"] == "runner_on_ok", result.get("msg")
    assert result["workloads_error"] is None and NODE in result["topology"]
    assert set(result["api_requests"]) == {"nodes", "pods", "deployments", "statefulsets", "daemonsets", "jobs", "cronjobs"}


def test_node_maintenance_cycle(lab):
    checked = _module(lab, "node_maintenance", check=True, nodes=[NODE], force=True)
    assert checked["_event"] == "runner_on_ok", checked.get("msg")
    assert [p["name"] for p in checked["evicted"]] == ["bare"]
    drained = _module(lab, "node_maintenance", nodes=[NODE], force=True, timeout=60)
    assert drained["_event"] == "runner_on_ok", drained.get("msg")
    assert [p["name"] for p in drained["evicted"]] == ["bare"] and drained["changed"] is True
    uncordoned = _module(lab, "node_maintenance", nodes=[NODE], state="uncordoned")
    assert uncordoned["_event"] == "runner_on_ok" and uncordoned["changed"] is True


def test_node_maintenance_finds_the_managed_device_plugin_pod_to_restart(lab):
    """Check mode: the pod it would evict after a MIG layout change is the one plugin pod of the node (the mig role
    evicts it under this identity in test_mig.py)."""
    checked = _module(lab, "node_maintenance", check=True, nodes=[NODE], state="device_plugin_restarted")
    assert checked["_event"] == "runner_on_ok", checked.get("msg")
    assert [(p["node"], p["controller"]) for p in checked["evicted"]] == [(NODE, "DaemonSet/nvidia-device-plugin-daemonset")], checked["evicted"]
    assert checked["nodes"][NODE]["unschedulable_before"] == checked["nodes"][NODE]["unschedulable_after"]


@pytest.mark.parametrize("name", OTHER_MODULES)
def test_other_cluster_modules_are_not_forbidden(lab, name):
    assert (REPO_ROOT / "plugins/modules" / (name + ".py")).exists()
    result = _module(lab, name, check=True)
    assert "forbidden" not in (result.get("msg") or "").lower(), result.get("msg")


def test_device_plugin_may_read_gpu_operator_clusterpolicies(lab):
    """No GPU Operator here: the LIST of clusterpolicies.nvidia.com answers 404 (no operator) only when the RBAC grants
    it; without the grant it answers 403, reported as plugin_operator_unknown."""
    result = _module(lab, "device_plugin", check=True)
    assert "findings" in result, result.get("msg")
    assert "plugin_operator_unknown" not in {f["id"] for f in result["findings"]}, result["findings"]


def test_forbidden_drain_without_eviction_names_identity_verb_resource(lab):
    core = client.CoreV1Api(lab["_api"])
    core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare-2"},
                                    "spec": {"nodeName": NODE, "tolerations": [{"operator": "Exists"}],
                                             "containers": [{"name": "main", "image": "registry.example/app:1"}]}})
    result = _module(lab, "node_maintenance", nodes=[NODE], force=True, disable_eviction=True, timeout=30)
    assert result["_event"] == "runner_on_failed"
    assert "forbidden: %s may not delete pods 'bare-2'" % IDENTITY in result["msg"], result["msg"]
    assert "in namespace %s" % NS in result["msg"] and "deploy/rbac/gpuharden-rbac.yaml" in result["msg"]
    assert result["forbidden"] == {"verb": "delete", "resource": "pods", "group": "", "namespace": NS, "name": "bare-2", "identity": IDENTITY}
    assert core.read_namespaced_pod("bare-2", NS).metadata.deletion_timestamp is None
    _module(lab, "node_maintenance", nodes=[NODE], state="uncordoned")


@pytest.mark.parametrize(("verb", "resource", "namespace", "call_args"), [
    ("delete", "nodes", None, lambda core: (core.delete_node, NODE)),
    ("list", "secrets", "kube-system", lambda core: (core.list_namespaced_secret, "kube-system")),
    ("get", "secrets", "gpuharden-system", lambda core: (core.read_namespaced_secret, "anything", "gpuharden-system")),
])
def test_forbidden_calls_fail_clearly(lab, verb, resource, namespace, call_args):
    api = _k8s.api_client({"kubeconfig": lab["sa_kubeconfig"]})
    try:
        method, *args = call_args(client.CoreV1Api(api))
        name = args[0] if verb in ("delete", "get") else None
        with pytest.raises(GpuhardenError) as error:
            call("identity_test", api, method, Target(verb, resource, namespace=namespace, name=name), *args)
    finally:
        api.close()
    assert "forbidden: %s may not %s %s" % (IDENTITY, verb, resource) in error.value.msg, error.value.msg
    assert error.value.result["status"] == 403
    assert client.CoreV1Api(lab["_api"]).read_node(NODE).metadata.name == NODE  # still there


def test_disruption_budget_and_workload_listing_under_the_tool_identity(lab):
    """What harden's rollout and admission check read (Nodes; the GPU workloads) is allowed to the tool identity."""
    budget = _module(lab, "disruption_budget", fleet=[NODE], batch=[NODE], max_unavailable=1)
    assert budget["_event"] == "runner_on_ok", budget.get("msg")
    assert budget["allowed"] == [NODE] and NODE in budget["fleet"]
    workloads = _module(lab, "gpu_workloads_info")
    assert workloads["_event"] == "runner_on_ok", workloads.get("msg")
    assert NODE in workloads["nodes"]
