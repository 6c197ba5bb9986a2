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


# reconcile: the one labelling path of gpu_node_labels and of device_plugin's node_labels option


class FakeNodes:
    """The Node calls reconcile makes: merge patches (answered as the API server applies them) and GETs, with an
    optional number of 409 answers first."""

    def __init__(self, live, conflicts=0):
        self.stored = {n["metadata"]["name"]: copy.deepcopy(n) for n in live}
        self.sent = []
        self.conflicts = conflicts

    def merge_patch(self, kind, name, patch, dry_run, namespace=None):
        assert kind == "Node" and dry_run is False and namespace is None
        self.sent.append((name, copy.deepcopy(patch)))
        if self.conflicts:
            self.conflicts -= 1
            raise GpuhardenError("conflict", status=409)
        self.stored[name] = nl.merge_patched(self.stored[name], patch)
        self.stored[name]["metadata"]["resourceVersion"] = str(int(self.stored[name]["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.stored[name])

    def read(self, kind, name, namespace=None):
        return copy.deepcopy(self.stored.get(name))


def _fleet():
    return [node("gpu-a"), node("gpu-b", LABEL, [TAINT]), node("cpu-c", dict(LABEL, zone="z1")), node("gpu-d", {"zone": "z2"})]


def test_reconcile_check_mode_sends_nothing_and_predicts_what_the_patches_leave():
    live = _fleet()
    checked = nl.check_params(params(nodes=["gpu-a", "gpu-b", "gpu-d"], unlabel_nodes=["cpu-c"], taint="present"))
    client = FakeNodes(live)
    result, after = nl.reconcile(client, copy.deepcopy(live), checked, apply=False)
    assert client.sent == []
    assert result["changed"] is True and result["changed_nodes"] == ["cpu-c", "gpu-a", "gpu-d"]
    assert result["nodes"]["cpu-c"] == {"before": {"labels": LABEL, "taints": []}, "after": {"labels": {}, "taints": []}}
    # The Nodes in LIST order, the unchanged one as listed, the others as the server would store the patches.
    assert [n["metadata"]["name"] for n in after] == ["gpu-a", "gpu-b", "cpu-c", "gpu-d"] and after[1] == live[1]
    assert after[0]["metadata"]["labels"] == LABEL and after[0]["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert after[2]["metadata"]["labels"] == {"zone": "z1"} and after[3]["metadata"]["labels"] == {"zone": "z2", **LABEL}
    # What the patches leave needs no further patch: the prediction is the fixed point the real run reaches.
    again, _nodes = nl.reconcile(client, after, checked, apply=False)
    assert again["changed"] is False and again["changed_nodes"] == []


def test_reconcile_applies_in_name_order_and_returns_the_servers_answers():
    live = _fleet()
    checked = nl.check_params(params(nodes=["gpu-a", "gpu-b", "gpu-d"], unlabel_nodes=["cpu-c"]))
    predicted, predicted_nodes = nl.reconcile(FakeNodes(live), copy.deepcopy(live), checked, apply=False)
    client = FakeNodes(live)
    result, after = nl.reconcile(client, copy.deepcopy(live), checked, apply=True)
    assert [name for name, _patch in client.sent] == ["cpu-c", "gpu-a", "gpu-d"]
    assert result == predicted
    assert after == [client.stored[n["metadata"]["name"]] for n in live]  # the server's objects, new resourceVersions
    assert [n["metadata"]["labels"] for n in after] == [n["metadata"]["labels"] for n in predicted_nodes]
    assert after[0]["metadata"]["resourceVersion"] == "8" and after[1]["metadata"]["resourceVersion"] == "7"


def test_reconcile_recomputes_a_taint_patch_after_a_conflict():
    live = [node("gpu-a", LABEL)]
    client = FakeNodes(live, conflicts=1)
    result, after = nl.reconcile(client, copy.deepcopy(live), nl.check_params(params(nodes=["gpu-a"], taint="present")), apply=True)
    assert len(client.sent) == 2 and result["changed_nodes"] == ["gpu-a"]
    assert after[0]["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]


def test_reconcile_failing_midway_names_the_nodes_it_already_patched():
    live = _fleet()
    client = FakeNodes(live)
    sent = client.merge_patch

    def refuse_gpu_d(kind, name, patch, dry_run, namespace=None):
        if name == "gpu-d":
            raise GpuhardenError("gpu_node_labels: API server answered 500", status=500)
        return sent(kind, name, patch, dry_run, namespace)

    client.merge_patch = refuse_gpu_d
    with pytest.raises(GpuhardenError) as caught:
        nl.reconcile(client, copy.deepcopy(live), nl.check_params(params(nodes=["gpu-a", "gpu-d"], unlabel_nodes=["cpu-c"])), apply=True)
    assert caught.value.result["changed"] is True and caught.value.result["changed_nodes"] == ["cpu-c", "gpu-a"]


def test_reconcile_refuses_unknown_nodes_before_any_patch():
    client = FakeNodes(_fleet())
    with pytest.raises(GpuhardenError, match="no Node object named gpu-z"):
        nl.reconcile(client, _fleet(), nl.check_params(params(nodes=["gpu-a", "gpu-z"])), apply=True)
    assert client.sent == []


def test_merge_patched_follows_rfc_7396():
    target = {"a": {"b": 1, "c": 2}, "l": [1, 2], "k": "v"}
    assert nl.merge_patched(target, {"a": {"b": None, "d": 3}, "l": [3], "k": None, "n": {"x": None}}) == {
        "a": {"c": 2, "d": 3}, "l": [3], "n": {}}
    assert target == {"a": {"b": 1, "c": 2}, "l": [1, 2], "k": "v"}  # the LIST's object is left as it was


def test_device_plugin_node_labels_option_is_the_same_spec_and_validation():
    from ansible_collections.gpuharden.k8s.plugins.modules import device_plugin

    spec = device_plugin.argument_spec()["node_labels"]
    assert spec["type"] == "dict" and spec["options"] == nl.LABEL_OPTIONS
    assert {key: value for key, value in module.argument_spec().items() if key in nl.LABEL_OPTIONS} == nl.LABEL_OPTIONS
    sub = {name: option.get("default") for name, option in nl.LABEL_OPTIONS.items()}
    for overrides, needle in [
        ({"nodes": ["Bad_Node"]}, "option node_labels.nodes='Bad_Node' is not a DNS subdomain"),
        ({"nodes": ["a"], "unlabel_nodes": ["a"]}, "device_plugin: node(s) a are both in node_labels.nodes and in node_labels.unlabel_nodes"),
        ({"labels": {}}, "device_plugin: option node_labels.labels is empty and node_labels.taint=ignore"),
        ({"taint": "present", "taint_effect": "NoRun"}, "option node_labels: taint_effect='NoRun' is not one of"),
    ]:
        with pytest.raises(GpuhardenError) as caught:
            nl.check_params(dict(sub, **overrides), "device_plugin", "node_labels")
        assert needle in caught.value.msg, caught.value.msg
