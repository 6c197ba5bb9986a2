# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU node labels and the dedicated-GPU taint: one merge patch per node that needs one, computed from one LIST; other
labels and taints untouched; malformed options and unknown node names refused before anything is sent."""

from __future__ import annotations

import copy
import json

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _node_labels as nl
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.modules import gpu_node_labels as module

DEFAULTS = {name: spec.get("default") for name, spec in module.argument_spec().items()}
LABEL = {"nvidia.com/gpu.present": "true"}
TAINT = {"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}


def params(**overrides):
    out = copy.deepcopy(DEFAULTS)
    out.update(overrides)
    return out


def originals(labels=None, taints=None):
    """The annotation gpu_node_labels leaves for the uninstall: what each label and taint it set was before."""
    return {"annotations": {nl.ORIGINALS_ANNOTATION: json.dumps({"labels": labels or {}, "taints": taints or {}},
                                                                   sort_keys=True, separators=(",", ":"))}}


def node(name, labels=None, taints=None, rv="7"):
    return {"metadata": {"name": name, "labels": labels or {}, "resourceVersion": rv}, "spec": {"taints": taints} if taints else {}}


def test_labels_only_nodes_that_need_it():
    live = [node("a", dict(LABEL, other="x")), node("b", {"other": "y"}), node("c", {"nvidia.com/gpu.present": "false"}), node("cpu", LABEL)]
    patches, before, after = nl.plan(live, ["a", "b", "c"], ["cpu"], LABEL, None, "ignore")
    set_b = {"nvidia.com/gpu.present": {"original": None, "set": "true"}}
    set_c = {"nvidia.com/gpu.present": {"original": "false", "set": "true"}}
    # a label gpuharden removes (CPU-only node) is not recorded: the uninstall does not put it back
    assert patches == {"b": {"metadata": dict(originals(set_b), labels=LABEL)}, "c": {"metadata": dict(originals(set_c), labels=LABEL)},
                       "cpu": {"metadata": {"labels": {"nvidia.com/gpu.present": None}}}}
    assert before["c"] == {"labels": {"nvidia.com/gpu.present": "false"}} and after["c"] == {"labels": LABEL}
    assert after["cpu"] == {"labels": {}}


def test_taint_present_keeps_other_taints_and_sends_the_resource_version():
    other = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    live = [node("a", LABEL, [other]), node("b", LABEL, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])]
    patches, _before, after = nl.plan(live, ["a", "b"], [], LABEL, TAINT, "present")
    added = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    assert patches == {"a": {"metadata": dict(originals(taints={"nvidia.com/gpu:NoSchedule": {"original": None, "set": added}}),
                                              resourceVersion="7"), "spec": {"taints": [other, added]}}}
    assert after["a"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]


def test_taint_absent_and_value_change():
    live = [node("a", LABEL, [{"key": "nvidia.com/gpu", "value": "old", "effect": "NoSchedule"}])]
    patches, _b, _a = nl.plan(live, ["a"], [], LABEL, TAINT, "absent")
    assert patches == {"a": {"metadata": {"resourceVersion": "7"}, "spec": {"taints": None}}}  # a removal is not recorded
    patches, _b, _a = nl.plan(live, ["a"], [], LABEL, dict(TAINT, value="present"), "present")
    assert patches["a"]["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    recorded = json.loads(patches["a"]["metadata"]["annotations"][nl.ORIGINALS_ANNOTATION])
    assert recorded["taints"]["nvidia.com/gpu:NoSchedule"]["original"]["value"] == "old"


def test_cpu_nodes_keep_their_taints():
    live = [node("cpu", LABEL, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])]
    patches, _b, _a = nl.plan(live, [], ["cpu"], LABEL, TAINT, "present")
    assert patches == {"cpu": {"metadata": {"labels": {"nvidia.com/gpu.present": None}}}}


def test_unknown_nodes_fail_and_name_the_variable():
    with pytest.raises(GpuhardenError) as caught:
        nl.plan([node("a")], ["a", "gpu-9"], ["cpu-7"], LABEL, None, "ignore")
    assert "no Node object named cpu-7, gpu-9" in caught.value.msg and "gpuharden_k8s_node_name" in caught.value.msg
    assert caught.value.result["missing_nodes"] == ["cpu-7", "gpu-9"]


def test_5000_nodes_one_list_no_patch_when_labelled():
    live = [node("n%d" % i, LABEL) for i in range(5000)]
    patches, _b, _a = nl.plan(live, ["n%d" % i for i in range(5000)], [], LABEL, None, "ignore")
    assert patches == {}


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"nodes": ["Bad_Node"]}, "option nodes='Bad_Node' is not a DNS subdomain"),
    ({"nodes": ["a"], "unlabel_nodes": ["a"]}, "node(s) a are both in nodes and in unlabel_nodes"),
    ({"nodes": ["a"], "labels": {"nvidia.com/gpu.present": True}}, "value True must be a string"),
    ({"nodes": ["a"], "labels": {"a/b/c": "x"}}, "prefix 'a/b' is not a DNS subdomain"),
    ({"nodes": ["a"], "labels": {"x" * 64: "y"}}, "must be 1-63 letters"),
    ({"nodes": ["a"], "labels": {}, "taint": "ignore"}, "option labels is empty and taint=ignore"),
    ({"nodes": ["a"], "taint": "present", "taint_key": ""}, "label key '' is empty"),
    ({"nodes": ["a"], "taint": "present", "taint_effect": "NoRun"}, "taint_effect='NoRun' is not one of"),
    ({"nodes": ["a"], "taint": "sometimes"}, "option taint='sometimes' is not one of present, absent, ignore"),
])
def test_malformed_options(overrides, needle):
    with pytest.raises(GpuhardenError) as caught:
        nl.check_params(params(**overrides))
    assert needle in caught.value.msg
