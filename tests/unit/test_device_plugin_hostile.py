# SPDX-License-Identifier: GPL-3.0-or-later
"""device_plugin on hostile API answers and plugin configs (issue 47 phase 2): the shape of every object read is
checked before the audit reads into it, and a config is parsed bounded; nothing is sent after either refusal."""

from __future__ import annotations

import time

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin_shapes as shapes
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

from tests.fuzz.mutations import LAUGHS
from tests.unit.test_device_plugin import API_NODES, RUNTIME_CLASS, FakeCluster, plugin_ds, run_fake

OLD = "old-plugin"


def _config_map(name, text, namespace="kube-system"):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": {"config.yaml": text}}


def _refused(monkeypatch, cluster, needle):
    with pytest.raises(GpuhardenError) as caught:
        run_fake(monkeypatch, cluster)
    assert needle in caught.value.msg and "\n" not in caught.value.msg, caught.value.msg
    assert cluster.writes == []  # not even a dry run: the refusal comes before the first request that could change
    return caught.value.msg


# ---------------------------------------------------------------------------------------------
# API answers of the wrong shape


def _ds_with(**pod_spec):
    ds = plugin_ds(OLD)
    ds["spec"]["template"]["spec"].update(pod_spec)
    return ds


@pytest.mark.parametrize(("pod_spec", "needle"), [
    ({"containers": "nvidia-device-plugin-ctr"}, "a string at field spec.template.spec.containers ('nvidia-device-plugin-ctr'), expected a list"),
    ({"containers": ["a string"]}, "a string at field spec.template.spec.containers[0] ('a string'), expected an object"),
    ({"tolerations": [{"key": 7}]}, "a number at field spec.template.spec.tolerations[0].key (7), expected a string"),
    ({"volumes": None}, "null at field spec.template.spec.volumes, expected a list"),
    ({"nodeSelector": {"pool": ["a"]}}, "a list at field spec.template.spec.nodeSelector.pool, expected a string"),
])
def test_a_daemonset_of_the_wrong_shape_is_refused_naming_object_and_field(monkeypatch, pod_spec, needle):
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES, _ds_with(**pod_spec))
    msg = _refused(monkeypatch, cluster, needle)
    assert msg.startswith("device_plugin: DaemonSet kube-system/old-plugin: ")


def test_a_node_list_of_strings_is_refused(monkeypatch):
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES)
    cluster.list = lambda kind, *args, **kwargs: ["gpu-a", "gpu-b"] if kind == "Node" else []
    _refused(monkeypatch, cluster, "Node #0 of the list: the API server's answer has a string ('gpu-a'), expected an object")


def test_a_config_map_whose_data_is_a_list_is_refused(monkeypatch):
    config_map = _config_map("old-config", "version: v1\n")
    config_map["data"] = [1, 2]
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES, plugin_ds(OLD, config_map="old-config"), config_map)
    _refused(monkeypatch, cluster, "ConfigMap kube-system/old-config: the API server's answer has a list at field data")


def test_shapes_accept_real_objects_and_null_scalars():
    ds = plugin_ds(OLD, config_map="cfg", env=[{"name": "FAIL_ON_INIT_ERROR", "value": "false"}])
    ds["spec"]["template"]["metadata"]["creationTimestamp"] = None  # what the API server writes in a template
    ds["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Helm", "name": "x", "uid": "u", "controller": True}]
    assert shapes.check("DaemonSet", ds) is ds
    assert shapes.check_all("Node", list(API_NODES)) == list(API_NODES)
    with pytest.raises(GpuhardenError, match=r"a string at field metadata.ownerReferences\[0\].controller \('true'\), expected a boolean"):
        ds["metadata"]["ownerReferences"][0]["controller"] = "true"
        shapes.check("DaemonSet", ds)


# ---------------------------------------------------------------------------------------------
# Plugin configs: bounded parse, one line


@pytest.mark.parametrize(("text", "needle"), [
    (LAUGHS, "once its aliases are expanded"),
    ("a: " + "[" * 200 + "]" * 200 + "\n", "nested more than 64 levels deep"),
    ("version: v1\nflags: [1,\n  2\nbar: x\n", "line 4"),
])
def test_a_hostile_config_of_a_competing_plugin_is_a_one_line_finding_and_nothing_is_sent(monkeypatch, text, needle):
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES, plugin_ds(OLD, config_map="old-config"), _config_map("old-config", text))
    started = time.monotonic()
    result, _fake = run_fake(monkeypatch, cluster)
    assert time.monotonic() - started < 10
    invalid = [f for f in result["findings"] if f["id"] == "plugin_config_invalid"]
    assert len(invalid) == 1 and needle in invalid[0]["hint"] and "\n" not in invalid[0]["hint"], invalid
    assert "ConfigMap kube-system/old-config" in invalid[0]["hint"]
    assert result["refused"] and not result["changed"]  # the competing plugin blocks the apply
    assert [w for w in cluster.writes if not w[1]] == []


def test_a_billion_laughs_in_the_managed_config_map_is_replaced_by_the_rendered_config(monkeypatch):
    # the managed plugin's own ConfigMap: the finding is reported, and the apply is the repair (a config the plugin reads)
    managed = run_fake(monkeypatch, FakeCluster(RUNTIME_CLASS, *API_NODES))[0]
    ds = next(obj for obj in managed["objects"] if obj["kind"] == "DaemonSet")
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES)
    run_fake(monkeypatch, cluster)
    key = ("ConfigMap", "kube-system", next(obj["name"] for obj in managed["objects"] if obj["kind"] == "ConfigMap"))
    cluster.objects[key]["data"] = {"config.yaml": LAUGHS}
    result, _fake = run_fake(monkeypatch, cluster)
    assert any(f["id"] == "plugin_config_invalid" and ds["name"] in f["subject"] for f in result["findings"]), result["findings"]
    assert result["changed"] and "migStrategy" in cluster.objects[key]["data"]["config.yaml"]
