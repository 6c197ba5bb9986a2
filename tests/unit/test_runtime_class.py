# SPDX-License-Identifier: GPL-3.0-or-later
"""The RuntimeClass planner: the desired object, the podFixed GPU trap, the immutable handler, the audit of existing
RuntimeClasses, and malformed options refused with the option and value before any API request."""

from __future__ import annotations

import copy

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _runtime_class as rc
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.modules import runtime_class as module

from tests.unit.conftest import run_module

DEFAULTS = {name: spec.get("default") for name, spec in module.argument_spec().items()}


def params(**overrides):
    out = copy.deepcopy(DEFAULTS)
    out.update(overrides)
    return out


def test_minimal_object_is_the_device_plugin_readme_one():
    assert rc.check_params(params()) == {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                         "metadata": {"name": "nvidia", "labels": {"app.kubernetes.io/managed-by": "gpuharden"}},
                                         "handler": "nvidia"}


def test_scheduling_and_cpu_memory_overhead():
    obj = rc.check_params(params(handler="nvidia-cdi", node_selector={"nvidia.com/gpu.present": "true"},
                                 tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                                 overhead_pod_fixed={"cpu": "250m", "memory": "128Mi"}))
    assert obj["handler"] == "nvidia-cdi"
    assert obj["scheduling"] == {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    assert obj["overhead"] == {"podFixed": {"cpu": "250m", "memory": "128Mi"}}


@pytest.mark.parametrize("pod_fixed", [{"nvidia.com/gpu": "1"}, {"cpu": "250m", "memory": "128Mi", "nvidia.com/gpu": "1"},
                                       {"nvidia.com/mig-1g.10gb": 1}])
def test_gpu_overhead_is_refused_with_the_reason(pod_fixed):
    with pytest.raises(GpuhardenError) as caught:
        rc.check_params(params(overhead_pod_fixed=pod_fixed))
    assert "option overhead_pod_fixed names nvidia.com/" in caught.value.msg and "phantom GPUs" in caught.value.msg


def test_handler_immutable():
    desired = rc.check_params(params())
    assert rc.handler_immutable({"handler": "nvidia"}, desired) is None
    message = rc.handler_immutable({"handler": "nvidia-legacy"}, desired)
    assert "handler 'nvidia-legacy' but containerd's runtime is 'nvidia'" in message and "force=true" in message


def test_audit_reports_overhead_traps_and_the_handler_mismatch():
    live = [{"metadata": {"name": "nvidia"}, "handler": "nvidia-legacy"},
            {"metadata": {"name": "nvidia-overhead"}, "handler": "nvidia",
             "overhead": {"podFixed": {"cpu": "250m", "memory": "128Mi", "nvidia.com/gpu": "1"}}},
            {"metadata": {"name": "fpga"}, "handler": "runc", "overhead": {"podFixed": {"example.com/fpga": "1"}}},
            {"metadata": {"name": "runc"}, "handler": "runc", "overhead": {"podFixed": {"cpu": "1", "hugepages-2Mi": "2Mi"}}}]
    findings = rc.audit(live, rc.check_params(params()))
    assert [(f["subject"], f["id"], f["severity"], f["repair"]) for f in findings] == [
        ("RuntimeClass fpga", "runtime_class_overhead_extended", "warning", "manual"),
        ("RuntimeClass nvidia", "runtime_class_handler_mismatch", "error", "recreate (force)"),
        ("RuntimeClass nvidia-overhead", "runtime_class_overhead_gpu", "error", "manual"),
    ]
    assert findings[2]["found"] == {"nvidia.com/gpu": "1"} and "phantom GPUs" in findings[2]["hint"]
    # none of them is the stage's to fix: another RuntimeClass, or an immutable handler (a forced recreate)
    assert [f["remediable"] for f in findings] == [False, False, False]
    ours = rc.audit([{"metadata": {"name": "nvidia"}, "handler": "nvidia", "overhead": {"podFixed": {"nvidia.com/gpu": "1"}}}],
                    rc.check_params(params()))
    assert [(f["id"], f["repair"], f["stage"], f["remediable"]) for f in ours] == [
        ("runtime_class_overhead_gpu", "replace", "runtime_class", True)]


MALFORMED = [
    ({"handler": "Nvidia"}, "option handler (the containerd runtime name)='Nvidia' is not a DNS label"),
    ({"handler": "nvidia.runtime"}, "is not a DNS label"),
    ({"handler": ""}, "is not a DNS label"),
    ({"handler": "a" * 64}, "is not a DNS label"),
    ({"name": "NVIDIA"}, "option name='NVIDIA' is not a DNS subdomain"),
    ({"name": "nvidia_rc"}, "option name='nvidia_rc' is not a DNS subdomain"),
    ({"overhead_pod_fixed": {"nvidia.com/gpu": "1"}}, "option overhead_pod_fixed names nvidia.com/gpu"),
    ({"overhead_pod_fixed": {"example.com/fpga": "1"}}, "names extended resource(s) example.com/fpga"),
    ({"overhead_pod_fixed": {"cpu": "lots"}}, "option overhead_pod_fixed.cpu: 'lots' is not a Kubernetes quantity"),
    ({"overhead_pod_fixed": {"memory": "12 Mi"}}, "option overhead_pod_fixed.memory: '12 Mi' is not a Kubernetes quantity"),
    ({"node_selector": {"nvidia.com/gpu.present": True}}, "value True must be a string"),
    ({"node_selector": {"-bad": "x"}}, "label key '-bad'"),
    ({"node_selector": {"nvidia.com/gpu.present": "a b"}}, "value 'a b' must be empty or 1-63"),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "a toleration without key must use operator Exists"),
    ({"tolerations": ["nvidia.com/gpu"]}, "is not a toleration mapping"),
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Equals"}]}, "operator='Equals' is not Equal or Exists"),
]


@pytest.mark.parametrize(("overrides", "needle"), MALFORMED)
def test_malformed_options_are_refused(overrides, needle):
    with pytest.raises(GpuhardenError) as caught:
        rc.check_params(params(**overrides))
    assert needle in caught.value.msg


@pytest.fixture
def dead_kubeconfig(world_tmp):
    path = world_tmp / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"overhead_pod_fixed": {"nvidia.com/gpu": "1"}}, "phantom GPUs"),
    ({"handler": "Bad"}, "is not a DNS label"),
    ({"page_limit": -1}, "option page_limit=-1 must be a positive number"),
])
def test_module_refuses_before_any_request(dead_kubeconfig, overrides, needle):
    result = run_module("runtime_class", dict(overrides, kubeconfig=dead_kubeconfig), {})
    assert result.get("failed") and needle in result["msg"], result
    assert "cannot reach the API server" not in result["msg"]


def test_coexistence_runtime_class_of_another_installer_is_never_rewritten():
    desired = rc.check_params({"name": "nvidia", "handler": "nvidia"})
    operator_owned = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "nvidia",
                      "metadata": {"name": "nvidia", "ownerReferences": [
                          {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy", "controller": True}]}}
    for action in ("adopt", "update", "recreate"):
        finding = rc.owned_elsewhere({"action": action, "live": operator_owned, "changed": True})
        assert finding["id"] == "runtime_class_managed_by_other_installer" and finding["repair"] == "manual"
        assert finding["found"]["installer"] == "gpu-operator" and "ClusterPolicy cluster-policy" in finding["hint"]
    helm = dict(operator_owned, metadata={"name": "nvidia", "labels": {"app.kubernetes.io/managed-by": "Helm"}})
    assert rc.owned_elsewhere({"action": "adopt", "live": helm, "changed": True})["found"]["installer"] == "helm"
    # ours, an unowned static one, an unchanged one and a new one are not another installer's
    ours = dict(operator_owned, metadata={"name": "nvidia", "labels": desired["metadata"]["labels"]})
    static = dict(operator_owned, metadata={"name": "nvidia"})
    assert rc.owned_elsewhere({"action": "update", "live": ours, "changed": True}) is None
    assert rc.owned_elsewhere({"action": "adopt", "live": static, "changed": True}) is None
    assert rc.owned_elsewhere({"action": "none", "live": operator_owned, "changed": False}) is None
    assert rc.owned_elsewhere({"action": "create", "live": None, "changed": True}) is None


def test_gpu_consistency_refuses_a_malformed_runtime_class_before_any_request(dead_kubeconfig):
    """The drift check's RuntimeClass dry run inside gpu_consistency: its options are checked as the module's are."""
    result = run_module("gpu_consistency", {"kubeconfig": dead_kubeconfig, "runtime_class": {"handler": "Bad"}}, {})
    assert result.get("failed") and "is not a DNS label" in result["msg"], result
    assert "cannot reach the API server" not in result["msg"]
