# SPDX-License-Identifier: GPL-3.0-or-later
"""device_cgroup_audit (and node_audit's device_cgroups check) take the allocation from the kubelet's pod-resources
API when its socket is on the node: which source was used, when the answer is set aside, and the findings it gives.

The endpoint is tests/unit/podresources_fake.py (scripted HTTP/2 + gRPC); tests/real/test_podresources_client.py
runs the module against the real grpc-go server.
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _device_audit_node
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency

from tests.unit.conftest import run_module
from tests.unit.podresources_fake import FakeKubelet, encode_allocatable, encode_list
from tests.unit.test_device_cgroup_audit import CID, UID_A, UID_B, UID_C, _by_id, _uuid, v1_node  # noqa: F401 - fixture

SOCKET = "var/lib/kubelet/pod-resources/kubelet.sock"
BUNDLES = "run/containerd/io.containerd.runtime.v2.task/k8s.io"


def _bundle(node, cid, namespace, pod, name):
    directory = node.root / BUNDLES / cid
    directory.mkdir(parents=True, exist_ok=True)
    annotations = {
        "io.kubernetes.cri.container-name": name,
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-name": pod,
    }
    (directory / "config.json").write_text(json.dumps({"annotations": annotations}))


@pytest.fixture
def named_node(v1_node):  # noqa: F811 - the imported fixture
    """The v1 tree of test_device_cgroup_audit with every container named: ml/train-0 trainer (UID_A, the bundle
    there), ml/sneaky main (UID_B, can open every GPU), ml/lost main (UID_C, can open none)."""
    _bundle(v1_node, CID["b"], "ml", "sneaky", "main")
    _bundle(v1_node, CID["c"], "ml", "lost", "main")
    (v1_node.root / SOCKET).parent.mkdir(parents=True)
    return v1_node


def _pods(node, train_ids=None, lost_ids=None):
    train_ids = [_uuid(node, 1)] if train_ids is None else train_ids
    lost_ids = [_uuid(node, 2)] if lost_ids is None else lost_ids
    return [
        {"namespace": "ml", "name": "train-0", "containers": [{"name": "trainer", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": train_ids}]}]},
        {"namespace": "ml", "name": "sneaky", "containers": [{"name": "main", "devices": [{"resource_name": "example.com/nic", "device_ids": ["nic0"]}]}]},
        {"namespace": "ml", "name": "lost", "containers": [{"name": "main", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": lost_ids}]}]},
        {"namespace": "ml", "name": "pending", "containers": [{"name": "main", "devices": [{"resource_name": "nvidia.com/gpu",
                                                                                            "device_ids": [_uuid(node, 5)]}]}]},
    ]  # fmt: skip


def _answers(node, pods=None, gpus=range(8)):
    """The fake kubelet's answers: List, and GetAllocatableResources holding the node's GPUs."""
    return {"List": encode_list(_pods(node) if pods is None else pods), "GetAllocatableResources": encode_allocatable([_uuid(node, m) for m in gpus])}


def _audit(node, **args):
    result = run_module("device_cgroup_audit", {"root": str(node.root), "node_name": "dgx", **args}, {})
    assert not result.get("failed"), result
    return result


def test_pod_resources_give_the_allocation(named_node):
    with FakeKubelet(named_node.root / SOCKET, _answers(named_node)) as kubelet:
        result = _audit(named_node)
    assert kubelet.calls == ["List", "GetAllocatableResources"]
    assert result["allocation_source"] == "pod-resources"
    assert result["pod_resources"] == {"socket": str(named_node.root / SOCKET), "pods": 4, "unmatched": ["ml/pending/main"], "reason": None}
    # The same findings as test_module_on_a_v1_tree with the allocation given by hand.
    found = _by_id(result)
    assert set(found) == {"isolation_breach", "broken_allocation"}
    assert {f["gpu"] for f in found["isolation_breach"]} == set(range(8))
    assert {(f["pod"], f["pod_name"]) for f in found["isolation_breach"]} == {(UID_B, "ml/sneaky")}
    assert {f["device"] for f in found["broken_allocation"]} == {"/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"}


def test_time_slicing_replica_ids(named_node):
    pods = _pods(named_node, train_ids=[_uuid(named_node, 1) + "::0", _uuid(named_node, 1) + "::3"])
    with FakeKubelet(named_node.root / SOCKET, _answers(named_node, pods)):
        result = _audit(named_node)
    assert result["allocation_source"] == "pod-resources"
    assert next(c for c in result["containers"] if c["pod_uid"] == UID_A)["gpus"] == [1]
    assert "broken_allocation" not in {f["id"] for f in result["findings"] if f["pod"] == UID_A}


def test_allocations_given_win_and_the_socket_is_not_read(named_node):
    with FakeKubelet(named_node.root / SOCKET, {"List": encode_list([])}) as kubelet:
        result = _audit(named_node, allocations=[{"pod_uid": UID_A, "gpu_minors": [1]}])
    assert kubelet.calls == []
    assert result["allocation_source"] == "api-server"
    assert result["pod_resources"]["reason"] == "allocations given"


def test_no_socket_keeps_todays_path(v1_node):  # noqa: F811
    result = _audit(v1_node)
    assert result["allocation_source"] == "none"
    assert result["pod_resources"]["pods"] is None
    assert result["pod_resources"]["reason"].startswith("pod-resources API not available: %s" % (v1_node.root / SOCKET))
    assert {f["id"] for f in result["findings"]} == {"gpu_access"}


@pytest.mark.parametrize(
    "answer, reason",
    [
        ((12, "method List not implemented"), "Unimplemented (12): method List not implemented"),
        ((8, "rejected by rate limit"), "ResourceExhausted (8): rejected by rate limit"),
    ],
)
def test_grpc_errors_fall_back(named_node, answer, reason):
    with FakeKubelet(named_node.root / SOCKET, {"List": answer}):
        result = _audit(named_node)
    assert result["allocation_source"] == "none" and reason in result["pod_resources"]["reason"]
    assert {f["id"] for f in result["findings"]} == {"gpu_access"}


def test_allocatable_unimplemented_sets_the_answer_aside(named_node):
    with FakeKubelet(named_node.root / SOCKET, {"List": encode_list(_pods(named_node))}):
        result = _audit(named_node)
    assert result["allocation_source"] == "none" and result["pod_resources"]["pods"] == 4
    assert "GetAllocatableResources with gRPC status Unimplemented (12)" in result["pod_resources"]["reason"]


def test_gpus_outside_the_device_manager_set_the_answer_aside(named_node):
    """GPUs 6 and 7 are not the device plugin's (a DRA driver, MIG mode): who may open them is not in the answer."""
    with FakeKubelet(named_node.root / SOCKET, _answers(named_node, gpus=range(6))):
        result = _audit(named_node)
    assert result["allocation_source"] == "none"
    assert result["pod_resources"]["reason"] == (
        "GPUs of this node that the kubelet's device manager does not hold (a DRA driver, MIG mode, no device plugin): %s"
        % ", ".join(sorted([_uuid(named_node, 6), _uuid(named_node, 7)]))
    )


def test_dra_claims_set_the_answer_aside(named_node):
    pods = _pods(named_node)
    pods[1]["containers"][0]["claims"] = ["gpu-claim"]
    with FakeKubelet(named_node.root / SOCKET, _answers(named_node, pods)):
        result = _audit(named_node)
    assert result["allocation_source"] == "none"
    assert result["pod_resources"]["reason"] == "containers with DRA claims, whose devices are not mapped to GPUs: ml/sneaky/main"


def test_unnamed_containers_set_the_answer_aside(v1_node):  # noqa: F811
    """Without the bundles of sneaky and lost, their containers cannot be tied to the answer: using it would make
    their GPUs false breaches."""
    (v1_node.root / SOCKET).parent.mkdir(parents=True)
    with FakeKubelet(v1_node.root / SOCKET, _answers(v1_node)):
        result = _audit(v1_node)
    assert result["allocation_source"] == "none"
    assert "the names of 2 container(s) are unknown (%s, %s)" % (CID["b"][:12], CID["c"][:12]) in result["pod_resources"]["reason"]
    assert result["pod_resources"]["pods"] == 4


def test_mig_and_index_ids_set_the_answer_aside(named_node):
    pods = _pods(named_node, train_ids=["MIG-5c6a6f8e-1111-2222-3333-444455556666"], lost_ids=["2"])
    with FakeKubelet(named_node.root / SOCKET, _answers(named_node, pods)):
        result = _audit(named_node)
    assert result["allocation_source"] == "none"
    assert result["pod_resources"]["reason"] == (
        "device IDs that are no GPU UUID of this node (/proc/driver/nvidia/gpus): 2, MIG-5c6a6f8e-1111-2222-3333-444455556666"
    )


def test_socket_option_is_rooted(named_node):
    other = named_node.root / "run/other.sock"
    with FakeKubelet(other, _answers(named_node)):
        result = _audit(named_node, pod_resources_socket="/run/other.sock")
    assert result["allocation_source"] == "pod-resources" and result["pod_resources"]["socket"] == str(other)


def test_node_audit_device_cgroups_check(named_node):
    with FakeKubelet(named_node.root / SOCKET, _answers(named_node)):
        result = _node_audit.audit({"root": str(named_node.root), "node_name": "dgx", "device_cgroups": {}})
    check = result["checks"]["device_cgroups"]
    assert check["status"] == "findings"
    assert check["details"]["allocation_source"] == "pod-resources" and check["details"]["pod_resources"]["pods"] == 4
    assert {f["id"] for f in result["findings"]} == {"isolation_breach", "broken_allocation"}


def test_pure_mapping():
    containers = [
        {"pod_uid": "u1", "container_id": "a" * 64, "name": "main", "pod_name": "ns/p"},
        {"pod_uid": "u1", "container_id": "b" * 64, "sandbox": True, "name": None, "pod_name": "ns/p"},
    ]
    pods = [{"namespace": "ns", "name": "p", "containers": [{"name": "main", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-1"]}]}]}]
    allocatable = {"devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-1::0", "GPU-1::1"]}]}
    allocations, unmatched, reason = _device_audit_node.pod_resources_allocations(pods, containers, {"GPU-1": 0}, allocatable)
    assert reason is None and unmatched == []
    assert allocations == [{"pod_uid": "u1", "container": "a" * 64, "gpu_minors": [], "gpu_uuids": ["GPU-1"], "privileged": False, "pod": "ns/p"}]


# ---------------------------------------------------------------------------------------------
# gpu_consistency: the answer node_audit read travels in the node report


def test_node_audit_puts_the_answer_in_the_node_report(named_node, monkeypatch):
    fake_nvml = ("nvml", lambda: {"root": {"type": "path"}}, None, lambda _params: (False, [], {"node_report": {"gpu_count": 8, "gpus": [], "processes": []}}))
    checks = tuple(fake_nvml if name == "nvml" else (name, spec, rules, fn) for name, spec, rules, fn in _node_audit.CHECKS)
    monkeypatch.setattr(_node_audit, "CHECKS", checks)
    with FakeKubelet(named_node.root / SOCKET, _answers(named_node)):
        result = _node_audit.audit({"root": str(named_node.root), "node_name": "dgx", "nvml": {}, "device_cgroups": {}})
    answer = result["node_report"]["pod_resources"]
    assert "node_report_pod_resources" not in result["checks"]["device_cgroups"]["details"]
    assert {"%s/%s" % (p["namespace"], p["name"]): p["containers"] for p in answer}["ml/sneaky"] == [{"name": "main", "devices": []}]
    assert answer[0]["containers"][0]["devices"] == [{"resource_name": "nvidia.com/gpu", "device_ids": [_uuid(named_node, 1)]}]
    # Without the socket, the report has no pod_resources (gpu_consistency then has the API server's requests only).
    result = _node_audit.audit({"root": str(named_node.root), "node_name": "dgx", "nvml": {}, "device_cgroups": {}})
    assert "pod_resources" not in result["node_report"]


def test_consistency_takes_the_answer_from_the_node_report():
    report = {"gpu_count": 2, "gpus": [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}], "processes": []}
    answer = [{"namespace": "ml", "name": "a", "containers": [{"name": "main", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-0"]}]}]}]
    node = {"metadata": {"name": "n1", "labels": {}}, "status": {"allocatable": {"nvidia.com/gpu": "2"}}}
    _reports, allocations = _consistency.validate({"n1": dict(report, pod_resources=answer), "n2": report})
    assert allocations == {"n1": {("ml", "a", "main"): {"GPU-0"}}}
    _reports, allocations = _consistency.validate({"n1": dict(report, pod_resources=answer)}, {"n1": []})  # the option wins
    assert allocations == {"n1": {}}
    _findings, summary = _consistency.check([node], [], {"n1": dict(report, pod_resources=answer)})
    assert summary["n1"]["allocation_source"] == "pod-resources" and summary["n1"]["pod_resources"] is True
    _findings, summary = _consistency.check([node], [], {"n1": report})
    assert summary["n1"]["allocation_source"] == "api-server"
