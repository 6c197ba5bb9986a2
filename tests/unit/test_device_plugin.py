# SPDX-License-Identifier: GPL-3.0-or-later
"""The device plugin planner: version gate, per-version config, rendering, node placement, seed audit, rollout,
malformed options (each refused with a message naming the option and value, before any API request), and the
shared apply decision logic against a fake client."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin as dp
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin_reconcile as dpr
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s_objects
from ansible_collections.gpuharden.k8s.plugins.modules import device_plugin as module

from tests.unit.conftest import run_module

DEFAULTS = {name: spec.get("default") for name, spec in module.argument_spec().items()}


def params(**overrides):
    out = copy.deepcopy(DEFAULTS)
    out.update(overrides)
    return out


def render(**overrides):
    settings = dp.check_params(params(**overrides))
    objects, config = dp.desired_objects(settings)
    return settings, objects, config


def node(name, labels=None, taints=None):
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints} if taints else {}}


def plugin_ds(name, namespace="kube-system", image="nvcr.io/nvidia/k8s-device-plugin:v0.17.0", selector=None, config_map=None,
              init=None, probe=None, env=None, runtime_class="nvidia"):
    container = {"name": "nvidia-device-plugin-ctr", "image": image}
    spec = {"containers": [container], "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if selector is not None:
        spec["nodeSelector"] = selector
    if config_map:
        container["args"] = ["--config-file=/etc/nvidia-plugin/config.yaml"]
        container["volumeMounts"] = [{"name": "config", "mountPath": "/etc/nvidia-plugin"}]
        spec["volumes"] = [{"name": "config", "configMap": {"name": config_map}}]
    if init:
        spec["initContainers"] = [{"name": "wait", "image": "cuda", "command": ["sh", "-c", init]}]
    if probe:
        container["readinessProbe"] = probe
    if env:
        container["env"] = env
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": {"name": name}}, "template": {"metadata": {"labels": {"name": name}}, "spec": spec}}}


GPU = {"nvidia.com/gpu.present": "true"}
NODES = [node("gpu-a", dict(GPU, pool="a")), node("gpu-b", dict(GPU, pool="b")), node("cpu-0", {"pool": "a"})]


# ------------------------------------------------------------------------------------------------ versions


@pytest.mark.parametrize(("tag", "parsed"), [
    ("v0.17.0", (0, 17, 0, None)), ("0.15.0", (0, 15, 0, None)), ("v0.17.0-ubi9", (0, 17, 0, None)),
    ("v0.15.0-rc.2", (0, 15, 0, "rc.2")), ("v1.2.3", (1, 2, 3, None)),
])
def test_parse_version(tag, parsed):
    assert dp.parse_version(tag) == parsed


@pytest.mark.parametrize("tag", ["latest", "", "v0.17", "sha256:abc", "v0.17.0.1", "main", None, 17])
def test_unparseable_tags_are_refused(tag):
    assert dp.parse_version(tag) is None
    with pytest.raises(GpuhardenError, match="is not a device plugin release tag"):
        dp.gate(tag)


@pytest.mark.parametrize("tag", ["v0.14.5", "v0.9.0", "v0.15.0-rc.1", "0.14.99"])
def test_releases_below_0_15_are_refused(tag):
    with pytest.raises(GpuhardenError, match=r"is below 0\.15\.0, the oldest supported release"):
        dp.gate(tag)


def test_image_tag():
    assert dp.image_tag("nvcr.io/nvidia/k8s-device-plugin:v0.17.0") == "v0.17.0"
    assert dp.image_tag("registry:5000/k8s-device-plugin:v0.16.2@sha256:00") == "v0.16.2"
    assert dp.image_tag("registry:5000/k8s-device-plugin") is None
    assert dp.image_tag("k8s-device-plugin@sha256:00") is None


def test_per_version_features():
    v15, v16, v18, v20 = (dp.features(dp.gate(t)) for t in ("v0.15.1", "v0.16.2", "v0.18.2", "v0.20.0"))
    assert not v15["nvidia_dev_root"] and v16["nvidia_dev_root"] and v16["volume_mounts_needs_sys_admin"]
    assert not v16["static_manifest_fail_on_init_error"] and v18["static_manifest_fail_on_init_error"]
    assert not v18["shared_devices_allocation_policy"] and v20["shared_devices_allocation_policy"]
    assert dp.features(dp.gate("v0.21.0"))["newer_than_known"]


# ------------------------------------------------------------------------------------------------ config and rendering


def test_default_render_is_the_hardened_static_manifest():
    _settings, (cm, ds), config = render()
    spec = ds["spec"]["template"]["spec"]
    assert ds["metadata"] == {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system",
                              "labels": {"app.kubernetes.io/managed-by": "gpuharden", "app.kubernetes.io/name": "nvidia-device-plugin",
                                         "app.kubernetes.io/part-of": "gpuharden"}}
    assert ds["spec"]["selector"] == {"matchLabels": {"name": "nvidia-device-plugin-ds"}}
    assert spec["nodeSelector"] == GPU
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["runtimeClassName"] == "nvidia"
    (container,) = spec["containers"]
    assert container["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert "env" not in container
    assert {"name": "kubelet-device-plugins-dir", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}} in spec["volumes"]
    assert yaml.safe_load(cm["data"]["config.yaml"]) == config
    assert config == {"version": "v1", "flags": {"migStrategy": "none", "failOnInitError": True, "nvidiaDriverRoot": "/",
                                                 "plugin": {"passDeviceSpecs": False, "deviceListStrategy": "envvar", "deviceIDStrategy": "uuid"}}}
    annotation = ds["spec"]["template"]["metadata"]["annotations"][dp.CHECKSUM_ANNOTATION]
    assert len(annotation) == 64


def test_config_change_changes_the_pod_template_checksum():
    _s, (_cm, ds1), _c = render()
    _s, (_cm, ds2), _c = render(mig_strategy="mixed")
    assert ds1["spec"]["template"]["metadata"]["annotations"] != ds2["spec"]["template"]["metadata"]["annotations"]


def test_per_version_config_differences():
    _s, _o, config15 = render(version="v0.15.1")
    assert "nvidiaDevRoot" not in config15["flags"]
    _s, _o, config20 = render(version="v0.20.0", shared_devices_allocation_policy="packed", nvidia_dev_root="/dev-root",
                              device_discovery_strategy="nvml")
    assert config20["flags"]["nvidiaDevRoot"] == "/dev-root" and config20["flags"]["deviceDiscoveryStrategy"] == "nvml"
    assert config20["flags"]["plugin"]["sharedDevicesAllocationPolicy"] == "packed"


def test_registry_override_cdi_volume_mounts_driver_root_gfd_time_slicing():
    settings, objects, config = render(image_registry="registry.internal:5000/mirror/", version="v0.17.4",
                                       device_list_strategy=["volume-mounts", "cdi-cri"], nvidia_driver_root="/run/nvidia/driver",
                                       gpu_feature_discovery=True, time_slicing={"replicas": 4}, image_pull_secrets=["pull"])
    cm, ds, gfd = objects
    spec = ds["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["image"] == "registry.internal:5000/mirror/k8s-device-plugin:v0.17.4"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {
        "/var/lib/kubelet/device-plugins", "/etc/nvidia-device-plugin", "/driver-root", "/var/run/cdi"}
    assert spec["imagePullSecrets"] == [{"name": "pull"}]
    assert config["flags"]["plugin"]["deviceListStrategy"] == ["volume-mounts", "cdi-cri"]
    assert config["flags"]["plugin"]["containerDriverRoot"] == "/driver-root"
    assert config["sharing"] == {"timeSlicing": {"renameByDefault": False, "failRequestsGreaterThanOne": False,
                                                 "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}
    assert gfd["metadata"]["name"] == "gpu-feature-discovery"
    assert gfd["spec"]["template"]["spec"]["containers"][0]["command"] == ["/usr/bin/gpu-feature-discovery"]
    assert not dp.is_plugin_daemonset(gfd) and dp.is_plugin_daemonset(ds)
    assert any("CAP_SYS_ADMIN" in w for w in settings["warnings"])


def test_values_cannot_inject_yaml():
    _s, (_cm, ds), _c = render(node_selector={"nvidia.com/gpu.present": "true"}, tolerations=[{"key": "a", "operator": "Exists"}],
                               priority_class_name="x", image_registry="reg/x")
    assert ds["spec"]["template"]["spec"]["tolerations"] == [{"key": "a", "operator": "Exists"}]


# ------------------------------------------------------------------------------------------------ malformed options (>= 15)


MALFORMED = [
    ({"version": "latest"}, "option version='latest' is not a device plugin release tag"),
    ({"version": "v0.14.5"}, "option version='v0.14.5' is below 0.15.0"),
    ({"version": ""}, "option version='' is not a device plugin release tag"),
    ({"device_list_strategy": ["none"]}, "device_list_strategy=none is not a device list strategy"),
    ({"device_list_strategy": ["envvar,none"]}, "device_list_strategy=none is not a device list strategy"),
    ({"device_list_strategy": ["volume_mounts"]}, "device_list_strategy='volume_mounts' is not one of"),
    ({"device_list_strategy": []}, "option device_list_strategy is empty"),
    ({"mig_strategy": "auto"}, "option mig_strategy='auto' is not one of none, single, mixed"),
    ({"device_id_strategy": "serial"}, "option device_id_strategy='serial' is not one of uuid, index"),
    ({"node_selector": {}}, "option node_selector is empty: without one the plugin lands on CPU-only nodes"),
    ({"node_selector": {"nvidia.com/gpu.present": True}}, "value True must be a string"),
    ({"node_selector": {"bad key!": "x"}}, "label key 'bad key!'"),
    ({"namespace": "Kube_System"}, "option namespace='Kube_System' is not a DNS label"),
    ({"name": "Plugin"}, "option name='Plugin' is not a DNS subdomain"),
    ({"nvidia_driver_root": "run/nvidia"}, "option nvidia_driver_root='run/nvidia' must be an absolute path"),
    ({"version": "v0.15.1", "nvidia_dev_root": "/"}, "nvidia_dev_root='/' needs release 0.16.0 or newer; version is v0.15.1"),
    ({"version": "v0.19.3", "shared_devices_allocation_policy": "packed"}, "needs release 0.20.0 or newer; version is v0.19.3"),
    ({"version": "v0.15.1", "device_discovery_strategy": "nvml"}, "device_discovery_strategy='nvml' needs release 0.16.0"),
    ({"time_slicing": {"replicas": 1}}, "time_slicing.replicas=1 must be an integer of at least 2"),
    ({"time_slicing": {"replicas": 2, "resources": ["amd.com/gpu"]}}, "'amd.com/gpu' is not an nvidia.com/ resource"),
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}]}, "operator Exists takes no value"),
    ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "effect": "NoRun"}]}, "effect='NoRun' is not one of"),
    ({"tolerations": [{"keys": "nvidia.com/gpu"}]}, "unknown toleration field(s) keys"),
    ({"image_repository": "k8s-device-plugin:v1"}, "do not form an image reference"),
    ({"image_pull_secrets": ["Bad_Secret"]}, "option image_pull_secrets='Bad_Secret' is not a DNS subdomain"),
    ({"pull_policy": "Sometimes"}, "option pull_policy='Sometimes' is not Always, IfNotPresent or Never"),
]


@pytest.mark.parametrize(("overrides", "needle"), MALFORMED)
def test_malformed_options_are_refused_with_the_option_and_value(overrides, needle):
    with pytest.raises(GpuhardenError) as caught:
        dp.check_params(params(**overrides))
    assert needle in caught.value.msg


# Through the module as Ansible runs it: refused before any API request (the kubeconfig points at a closed port,
# so a request would fail with another message), hence nothing in a cluster can change.
MODULE_MALFORMED = [
    ({"version": "latest"}, "is not a device plugin release tag"),
    ({"version": "v0.14.5"}, "is below 0.15.0"),
    ({"device_list_strategy": ["none"]}, "device_list_strategy=none is not a device list strategy"),
    ({"node_selector": {}}, "option node_selector is empty"),
    ({"page_limit": 0}, "option page_limit=0 must be a positive number"),
    ({"wait_timeout": 0}, "option wait_timeout=0 must be a positive number"),
    ({"expected_resource_names": []}, "option expected_resource_names is empty"),
    ({"mig_strategy": "auto"}, "value of mig_strategy must be one of: none, single, mixed, got: auto"),
]


@pytest.fixture
def dead_kubeconfig(world_tmp):
    path = world_tmp / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


@pytest.mark.parametrize(("overrides", "needle"), MODULE_MALFORMED)
def test_module_refuses_malformed_options_before_any_request(dead_kubeconfig, overrides, needle):
    result = run_module("device_plugin", dict(overrides, kubeconfig=dead_kubeconfig), {})
    assert result.get("failed") and needle in result["msg"], result
    assert "cannot reach the API server" not in result["msg"]


def test_module_reports_an_unreachable_api_server_clearly(dead_kubeconfig):
    result = run_module("device_plugin", {"kubeconfig": dead_kubeconfig, "request_timeout": 2}, {})
    assert result["failed"] and "device_plugin: list daemonsets (API group apps) at cluster scope: cannot reach the API server" in result["msg"]


# ------------------------------------------------------------------------------------------------ placement


def test_lands_on_selector_affinity_and_taints():
    spec = {"nodeSelector": GPU, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    assert dp.targets(spec, NODES) == ["gpu-a", "gpu-b"]
    tainted = node("gpu-c", GPU, [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])
    auto = node("gpu-d", GPU, [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
    gpu_taint = node("gpu-e", GPU, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    assert dp.targets(spec, [tainted, auto, gpu_taint]) == ["gpu-d", "gpu-e"]
    affinity = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cpu-0"]}]}]}}}}
    assert dp.targets(affinity, NODES) == ["cpu-0", "gpu-b"]
    assert dp.targets({}, NODES) == ["cpu-0", "gpu-a", "gpu-b"]


# ------------------------------------------------------------------------------------------------ audit (the seeds)


SEED_CONFIG_MAPS = {
    ("kube-system", "typo"): {"config.yaml": "version: v1\nresources:\n  gpus:\n    - pattern: '*'\n      name: nvidia-gpu\n"},
    ("kube-system", "list-none"): {"config.yaml": "version: v1\nflags:\n  plugin:\n    deviceListStrategy: none\n"},
    ("kube-system", "broken"): {"config.yaml": "version: [v1\n"},
    ("kube-system", "wrong-domain"): {"config.yaml": "resources:\n  gpus:\n    - {pattern: '*', name: example.com/gpu}\n"},
}


def _audit(daemonsets, nodes=NODES, config_maps=SEED_CONFIG_MAPS, **overrides):
    _s, objects, _c = render(**overrides)
    return dp.audit(daemonsets, config_maps, nodes, objects[1], ["nvidia.com/gpu"])


def ids(findings):
    return sorted((f["subject"].split("/")[-1], f["id"]) for f in findings)


def test_audit_catches_each_seed_with_its_repair():
    daemonsets = [
        plugin_ds("nvidia-device-plugin-daemonset", selector={"pool": "a"}),  # ours by name: adopted, its leftovers go
        plugin_ds("typo", selector={"pool": "b"}, config_map="typo"),
        plugin_ds("list-none", selector={"pool": "b"}, config_map="list-none"),
        plugin_ds("old", namespace="legacy", image="nvcr.io/nvidia/k8s-device-plugin:v0.14.5", selector={"nowhere": "x"},
                  init="until nvidia-smi; do sleep 5; done"),
        plugin_ds("everywhere", namespace="other", image="nvcr.io/nvidia/k8s-device-plugin:latest"),
    ]
    findings, repairs, ours = _audit(daemonsets)
    assert ours == ["gpu-a", "gpu-b"]
    assert ids(findings) == [
        ("everywhere", "plugin_competing"), ("everywhere", "plugin_no_node_selector"), ("everywhere", "plugin_on_cpu_nodes"),
        ("everywhere", "plugin_version_unparseable"),
        ("list-none", "plugin_competing"), ("list-none", "plugin_device_list_strategy_invalid"),
        ("nvidia-device-plugin-daemonset", "plugin_on_cpu_nodes"),
        ("old", "plugin_init_gate_without_readiness"), ("old", "plugin_version_too_old"),
        ("typo", "plugin_competing"), ("typo", "plugin_resource_rename_ignored"),
    ]
    by = {(f["subject"], f["id"]): f for f in findings}
    typo = by[("DaemonSet kube-system/typo", "plugin_resource_rename_ignored")]
    assert typo["found"] == "nvidia.com/nvidia-gpu" and "resources.gpus[0].name is 'nvidia-gpu'" in typo["hint"]
    assert "ConfigMap kube-system/typo" in typo["hint"]
    none = by[("DaemonSet kube-system/list-none", "plugin_device_list_strategy_invalid")]
    assert none["found"] == "none" and "flags.plugin.deviceListStrategy is 'none'" in none["hint"]
    assert by[("DaemonSet kube-system/nvidia-device-plugin-daemonset", "plugin_on_cpu_nodes")]["repair"] == "replace"
    # 0.17 without a failOnInitError setting: the code default (true) applies -> crash-loop, an error.
    assert by[("DaemonSet kube-system/nvidia-device-plugin-daemonset", "plugin_on_cpu_nodes")]["severity"] == "error"
    assert {(r["object"], r["action"]) for r in repairs} == {
        ("DaemonSet kube-system/nvidia-device-plugin-daemonset", "replace"), ("DaemonSet kube-system/typo", "delete"),
        ("DaemonSet kube-system/list-none", "delete"), ("DaemonSet legacy/old", "manual"), ("DaemonSet other/everywhere", "manual")}
    everywhere = next(r for r in repairs if r["object"] == "DaemonSet other/everywhere")
    assert "cpu-0" in everywhere["reason"]  # it also serves a node ours does not: not deleted


def test_audit_readiness_probe_silences_the_init_gate_and_env_overrides():
    probe = {"exec": {"command": ["true"]}}
    ds = plugin_ds("gated", selector={"nowhere": "x"}, init="nvidia-smi -L", probe=probe,
                   env=[{"name": "DEVICE_LIST_STRATEGY", "value": "none"}, {"name": "MIG_STRATEGY", "value": "auto"}])
    findings, _repairs, _ours = _audit([ds])
    assert ids(findings) == [("gated", "plugin_device_list_strategy_invalid"), ("gated", "plugin_mig_strategy_invalid")]
    assert "environment variable DEVICE_LIST_STRATEGY" in findings[0]["hint"]


def test_audit_missing_broken_and_wrong_domain_configs():
    daemonsets = [plugin_ds("missing", selector={"nowhere": "x"}, config_map="absent"),
                  plugin_ds("broken", selector={"nowhere": "x"}, config_map="broken"),
                  plugin_ds("wrong-domain", selector={"nowhere": "x"}, config_map="wrong-domain")]
    findings, _repairs, _ours = _audit(daemonsets)
    assert ids(findings) == [("broken", "plugin_config_invalid"), ("missing", "plugin_config_missing"),
                             ("wrong-domain", "plugin_resource_name_invalid")]


def test_audit_fail_on_init_error_false_is_a_warning_on_cpu_nodes():
    ds = plugin_ds("old-static", image="nvcr.io/nvidia/k8s-device-plugin:v0.15.0", env=[{"name": "FAIL_ON_INIT_ERROR", "value": "false"}])
    findings, _repairs, _ours = _audit([ds])
    on_cpu = next(f for f in findings if f["id"] == "plugin_on_cpu_nodes")
    assert on_cpu["severity"] == "warning" and on_cpu["found"] == ["cpu-0"] and "idles" in on_cpu["hint"]


def test_referenced_config_maps():
    assert dp.referenced_config_maps([plugin_ds("a", config_map="typo"), plugin_ds("b"), plugin_ds("c", config_map="typo")]) == [
        ("kube-system", "typo")]


def test_audit_scales_linearly_in_memory_not_requests():
    nodes = [node("n%d" % i, dict(GPU)) for i in range(5000)]
    findings, _repairs, ours = _audit([plugin_ds("other", selector=GPU)], nodes=nodes)
    assert len(ours) == 5000
    (competing,) = [f for f in findings if f["id"] == "plugin_competing"]
    assert competing["node_count"] == 5000 and len(competing["found"]) == dp.SAMPLE and "and 4980 more" in competing["hint"]


# ------------------------------------------------------------------------------------------------ rollout


def test_rollout_done_and_not_ready_nodes():
    ds = {"metadata": {"name": "p", "namespace": "kube-system", "generation": 2},
          "status": {"observedGeneration": 2, "desiredNumberScheduled": 3, "updatedNumberScheduled": 3, "numberReady": 2,
                     "currentNumberScheduled": 3, "numberAvailable": 2}}
    pods = [
        {"metadata": {"name": "p-a"}, "spec": {"nodeName": "a"}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "p-b"}, "spec": {"nodeName": "b"}, "status": {"phase": "Pending", "containerStatuses": [
            {"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
    ]
    state = dp.rollout(ds, pods, ["a", "b", "c"])
    assert not state["done"]
    assert state["nodes_not_ready"] == [{"node": "b", "pod": "p-b", "phase": "Pending", "reason": "CrashLoopBackOff"},
                                        {"node": "c", "pod": None, "phase": None, "reason": "no pod"}]
    message = dp.rollout_message("DaemonSet kube-system/p", state, 300)
    assert "not finished after 300 s: desired 3, updated 3, ready 2" in message
    assert "b (pod p-b Pending: CrashLoopBackOff); c (no pod)" in message
    ds["status"]["numberReady"] = 3
    assert dp.rollout(ds)["done"]
    ds["metadata"]["generation"] = 3  # the controller has not seen the new spec yet
    assert not dp.rollout(ds)["done"]


def test_a_rollout_held_by_an_old_pod_that_never_terminates_says_where():
    """Measured with the real kubelet: a node whose kubelet is stopped keeps its old plugin pod Terminating, and the
    DaemonSet's rolling update stops there (updated 4 of 10, every pod ready)."""
    ds = {"metadata": {"name": "p", "namespace": "kube-system", "generation": 2},
          "status": {"observedGeneration": 2, "desiredNumberScheduled": 3, "updatedNumberScheduled": 1, "numberReady": 3,
                     "currentNumberScheduled": 3, "numberAvailable": 3}}
    ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    pods = [
        {"metadata": {"name": "p-a", "labels": {"pod-template-generation": "2"}}, "spec": {"nodeName": "a"}, "status": ready},
        {"metadata": {"name": "p-b", "labels": {"pod-template-generation": "1"}}, "spec": {"nodeName": "b"}, "status": ready},
        {"metadata": {"name": "p-c", "labels": {"pod-template-generation": "1"}, "deletionTimestamp": "2026-12-04T21:40:00Z"},
         "spec": {"nodeName": "c"}, "status": ready},
    ]
    state = dp.rollout(ds, pods, ["a", "b", "c"])
    assert not state["done"]
    assert state["nodes_not_updated"] == [{"node": "b", "pod": "p-b", "terminating": False},
                                          {"node": "c", "pod": "p-c", "terminating": True}]
    message = dp.rollout_message("DaemonSet kube-system/p", state, 300)
    assert "updated 1, ready 3" in message and "still the previous template on 2 node(s): b, c" in message
    assert "the old pod is terminating on c: the update waits until that node's kubelet ends it" in message


def test_selector_immutable():
    _s, (_cm, ds), _c = render()
    live = copy.deepcopy(ds)
    assert dp.selector_immutable(live, ds) is None
    live["spec"]["selector"] = {"matchLabels": {"app": "old"}}
    assert "spec.selector is immutable" in dp.selector_immutable(live, ds) and "force=true" in dp.selector_immutable(live, ds)


# ------------------------------------------------------------------------------------------------ apply decisions


class FakeClient:
    """Answers like an API server that defaults one field and records the managers."""

    def __init__(self, live=None):
        self.live = live
        self.calls = []

    def _stored(self, obj, manager_op):
        out = json.loads(json.dumps(obj))
        out.setdefault("metadata", {}).update(resourceVersion="2", uid="u", managedFields=[{"manager": "gpuharden", "operation": manager_op}])
        out.setdefault("data", {}).setdefault("defaulted", "x")
        return out

    def read(self, kind, name, namespace=None):
        self.calls.append(("read", name))
        return self.live

    def apply(self, obj, dry_run, force):
        self.calls.append(("apply", dry_run, force))
        merged = json.loads(json.dumps(self.live or {}))
        merged.update(json.loads(json.dumps(obj)))
        return self._stored(merged, "Apply")

    def replace(self, obj, dry_run):
        self.calls.append(("replace", dry_run))
        return self._stored(obj, "Update")

    def delete(self, kind, name, namespace, dry_run):
        self.calls.append(("delete", dry_run))


DESIRED = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"k": "v"}}


def test_plan_create_update_none_adopt():
    fake = FakeClient()
    decision = _k8s_objects.plan(fake, DESIRED)
    assert decision["action"] == "create" and fake.calls == [("read", "c"), ("apply", True, True)]
    ours = fake._stored(DESIRED, "Apply")
    decision = _k8s_objects.plan(FakeClient(ours), DESIRED)
    assert decision["action"] == "none" and not decision["changed"]
    changed = json.loads(json.dumps(DESIRED))
    changed["data"]["k"] = "w"
    decision = _k8s_objects.plan(FakeClient(ours), changed)
    assert decision["action"] == "update" and "-  k: v" not in _k8s_objects.diff_entry(decision, changed)["before"]
    assert "k: w" in _k8s_objects.diff_entry(decision, changed)["after"]
    foreign = dict(ours, metadata=dict(ours["metadata"], managedFields=[{"manager": "kubectl", "operation": "Update"}]))
    fake = FakeClient(foreign)
    decision = _k8s_objects.plan(fake, DESIRED)
    assert decision["action"] == "adopt" and decision["changed"]
    _k8s_objects.execute(fake, DESIRED, decision)
    assert fake.calls[-2:] == [("replace", False), ("apply", False, True)]


def test_plan_recreate_needs_force():
    live = {"kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "old"}
    desired = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}
    fake = FakeClient(live)
    decision = _k8s_objects.plan(fake, desired, immutable=lambda lv, d: "immutable" if lv["handler"] != d["handler"] else None)
    assert decision["action"] == "recreate" and fake.calls == [("read", "nvidia")]
    with pytest.raises(GpuhardenError, match="immutable"):
        _k8s_objects.execute(fake, desired, decision, recreate=False)
    assert ("delete", False) not in fake.calls


def test_comparable_ignores_server_bookkeeping():
    a = {"metadata": {"name": "x", "resourceVersion": "1", "generation": 1, "managedFields": [1],
                      "annotations": {"deprecated.daemonset.template.generation": "1"}}, "status": {"a": 1}, "spec": {"b": 1}}
    b = {"metadata": {"name": "x", "resourceVersion": "9", "generation": 4, "managedFields": [2],
                      "annotations": {"deprecated.daemonset.template.generation": "4"}}, "status": {"a": 2}, "spec": {"b": 1}}
    assert _k8s_objects.comparable(a) == _k8s_objects.comparable(b)


def test_audit_a_forbidden_config_map_is_a_warning_not_a_failure():
    config_maps = {("team", "cfg"): dp.Unreadable("API server answered 403 Forbidden")}
    findings, _repairs, _ours = _audit([plugin_ds("theirs", namespace="team", selector={"nowhere": "x"}, config_map="cfg")],
                                       config_maps=config_maps)
    assert [(f["id"], f["severity"]) for f in findings] == [("plugin_config_unreadable", "warning")]
    assert "403 Forbidden" in findings[0]["hint"]


# ------------------------------------------------------------------------------------------------ issue 13 items 1-5


def container_of(ds):
    return dp.plugin_container(ds["spec"]["template"]["spec"])


def test_item01_managed_daemonset_runs_with_the_nvidia_runtime_class():
    _s, (_cm, ds, gfd), _c = render(gpu_feature_discovery=True)
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert gfd["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"  # gpu-feature-discovery needs NVML too
    _s, (_cm, ds), _c = render(runtime_class_name="nvidia-cdi")
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia-cdi"
    settings, (_cm, ds), _c = render(runtime_class_name="")  # nvidia is containerd's default runtime on every node
    assert "runtimeClassName" not in ds["spec"]["template"]["spec"]
    assert any("default runtime" in w for w in settings["warnings"])
    with pytest.raises(GpuhardenError, match="option runtime_class_name='Bad_Class' is not a DNS subdomain"):
        render(runtime_class_name="Bad_Class")


def test_item01_audit_reports_a_plugin_that_cannot_get_nvml():
    bare = plugin_ds("bare", selector={"nowhere": "x"}, runtime_class=None)
    findings, _repairs, _ours = _audit([bare])
    (finding,) = findings
    assert finding["id"] == "plugin_no_nvidia_runtime" and finding["severity"] == "warning"
    assert finding["expected"] == {"runtimeClassName": "nvidia"} and "runtimeClassName" in finding["hint"]
    # Deliberate setups for a default nvidia runtime: privileged, or an explicit NVIDIA_VISIBLE_DEVICES.
    env = plugin_ds("env", selector={"nowhere": "x"}, runtime_class=None, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    privileged = plugin_ds("privileged", selector={"nowhere": "x"}, runtime_class=None)
    privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with_class = plugin_ds("with-class", selector={"nowhere": "x"}, runtime_class="nvidia")
    assert _audit([env, privileged, with_class])[0] == []


class FakeCluster:
    """An API server of plain dicts for run(): LIST, GET, server-side apply, PUT and DELETE, each recorded."""

    def __init__(self, *objects):
        self.objects = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): copy.deepcopy(o) for o in objects}
        self.writes, self.requests = [], 0
        self.api = type("Api", (), {"close": lambda self: None})()

    def list(self, kind, page_limit, namespace=None, **selectors):
        self.requests += 1
        return [copy.deepcopy(o) for (k, _ns, _n), o in sorted(self.objects.items()) if k == kind]

    def read(self, kind, name, namespace=None):
        self.requests += 1
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found else None

    def _store(self, obj, dry_run, operation):
        out = copy.deepcopy(obj)
        out["metadata"].update(resourceVersion="9", managedFields=[{"manager": "gpuharden", "operation": operation}])
        if not dry_run:
            self.objects[(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])] = copy.deepcopy(out)
        return out

    def apply(self, obj, dry_run, force):
        self.writes.append(("apply", dry_run, obj["kind"], obj["metadata"]["name"]))
        return self._store(obj, dry_run, "Apply")

    def replace(self, obj, dry_run):
        self.writes.append(("replace", dry_run, obj["kind"], obj["metadata"]["name"]))
        return self._store(obj, dry_run, "Update")

    def delete(self, kind, name, namespace, dry_run):
        self.writes.append(("delete", dry_run, kind, name))
        if not dry_run:
            self.objects.pop((kind, namespace, name), None)


class FakeModule:
    def __init__(self, check_mode=False, **overrides):
        self.params = params(wait=False, **overrides)
        self.check_mode, self._diff, self.warnings = check_mode, False, []

    def warn(self, message):
        self.warnings.append(message)


RUNTIME_CLASS = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}
API_NODES = [dict(n, kind="Node") for n in NODES]


def run_fake(monkeypatch, cluster, check_mode=False, cluster_policies=(), **overrides):
    monkeypatch.setattr(module._k8s, "api_client", lambda params: None)
    monkeypatch.setattr(module._k8s_objects, "Client", lambda api, who: cluster)
    monkeypatch.setattr(dpr, "read_cluster_policies", lambda client, limit: (list(cluster_policies), None))
    fake = FakeModule(check_mode, **overrides)
    return module.run(fake), fake


def test_item01_missing_runtime_class_fails_before_any_write_and_is_a_finding_in_check_mode(monkeypatch):
    cluster = FakeCluster(*API_NODES)
    with pytest.raises(GpuhardenError, match="RuntimeClass nvidia does not exist") as caught:
        run_fake(monkeypatch, cluster)
    assert [w for w in cluster.writes if not w[1]] == []  # dry runs only
    assert "plugin_runtime_class_missing" in {f["id"] for f in caught.value.result["findings"]}
    result, _fake = run_fake(monkeypatch, FakeCluster(*API_NODES), check_mode=True)
    assert "plugin_runtime_class_missing" in {f["id"] for f in result["findings"]} and result["changed"] is True
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES)
    result, _fake = run_fake(monkeypatch, cluster)
    assert result["changed"] and cluster.objects[("DaemonSet", "kube-system", PLUGIN_NAME)]["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    result, fake = run_fake(monkeypatch, FakeCluster(*API_NODES), runtime_class_name="")  # nothing to look for
    assert "plugin_runtime_class_missing" not in {f["id"] for f in result["findings"]}


def with_handlers(api_node, *handlers):
    return dict(api_node, status={"runtimeHandlers": [{"name": name, "features": {}} for name in handlers]})


def test_a_target_node_without_the_runtime_classs_handler_stops_the_rollout_before_any_write(monkeypatch):
    """Measured in the lab on the real kubelet and containerd: the managed DaemonSet, rolled out while a GPU node's
    containerd had no nvidia runtime, left that node's plugin pod in ContainerCreating until the 300 s wait failed (and a
    RollingUpdate takes a node's running plugin away first)."""
    monkeypatch.setattr(dpr, "HANDLER_WAIT_SECONDS", 0.0)
    gpu_a, gpu_b, cpu = API_NODES
    nodes = [with_handlers(gpu_a, "", "runc", "nvidia"), with_handlers(gpu_b, "", "runc"), cpu]
    cluster = FakeCluster(RUNTIME_CLASS, *nodes)
    with pytest.raises(GpuhardenError, match=r"not applied: 1 node\(s\) .* no runtime handler nvidia \(RuntimeClass nvidia\): gpu-b") as caught:
        run_fake(monkeypatch, cluster)
    assert [w for w in cluster.writes if not w[1]] == []  # dry runs only
    assert [(f["id"], f["subject"]) for f in caught.value.result["findings"]] == [("runtime_class_handler_missing_on_node", "Node gpu-b")]
    # check mode: the same finding, nothing refused
    result, _fake = run_fake(monkeypatch, FakeCluster(RUNTIME_CLASS, *nodes), check_mode=True)
    assert "runtime_class_handler_missing_on_node" in {f["id"] for f in result["findings"]} and result["changed"] is True
    # a node that does not report runtimeHandlers (kubelets before v1.30) is not held against the rollout
    cluster = FakeCluster(RUNTIME_CLASS, with_handlers(gpu_a, "", "nvidia"), gpu_b, cpu)
    result, _fake = run_fake(monkeypatch, cluster)
    assert result["changed"] and ("DaemonSet", "kube-system", PLUGIN_NAME) in cluster.objects
    # the DaemonSet already as desired: nothing is replaced, so the gap is reported, not refused
    cluster.objects[("Node", None, "gpu-b")] = with_handlers(gpu_b, "", "runc")
    result, _fake = run_fake(monkeypatch, cluster)
    assert not result["changed"] and "runtime_class_handler_missing_on_node" in {f["id"] for f in result["findings"]}


def test_a_node_that_reports_the_handler_within_the_wait_is_not_held_against_the_rollout(monkeypatch):
    """The same run's container_runtime just restarted containerd there: the kubelet posts the handler seconds later."""
    monkeypatch.setattr(dpr, "HANDLER_POLL_SECONDS", 0.0)
    gpu_a, gpu_b, cpu = API_NODES
    cluster = FakeCluster(RUNTIME_CLASS, with_handlers(gpu_a, "", "nvidia"), with_handlers(gpu_b, ""), cpu)
    reads = []
    plain_read = cluster.read

    def read(kind, name, namespace=None):
        if kind == "Node":
            reads.append(name)
            if len(reads) == 2:  # the kubelet's next status update
                cluster.objects[("Node", None, "gpu-b")] = with_handlers(gpu_b, "", "nvidia")
        return plain_read(kind, name, namespace)

    cluster.read = read
    result, _fake = run_fake(monkeypatch, cluster)
    assert result["changed"] and reads == ["gpu-b", "gpu-b"]
    assert "runtime_class_handler_missing_on_node" not in {f["id"] for f in result["findings"]}


PLUGIN_NAME = "nvidia-device-plugin-daemonset"


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_item02_mig_strategy_adds_sys_admin_and_the_mig_monitor_devices(strategy):
    _s, (_cm, ds), config = render(mig_strategy=strategy)
    container = container_of(ds)
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}
    assert container["env"] == [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}]
    assert config["flags"]["migStrategy"] == strategy
    _s, (_cm, ds), _c = render(mig_strategy="none")
    assert "add" not in container_of(ds)["securityContext"]["capabilities"] and "env" not in container_of(ds)


def test_item02_audit_reports_mig_without_sys_admin_or_monitor_devices():
    env = [{"name": "MIG_STRATEGY", "value": "mixed"}]
    bare = plugin_ds("bare", selector={"nowhere": "x"}, env=env)
    from_config = plugin_ds("from-config", selector={"nowhere": "x"}, config_map="mig-single")
    complete = plugin_ds("complete", selector={"nowhere": "x"}, env=env + [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}])
    complete["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}
    privileged = plugin_ds("privileged", selector={"nowhere": "x"}, env=env)
    privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    half = plugin_ds("half", selector={"nowhere": "x"}, env=env)
    half["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    config_maps = dict(SEED_CONFIG_MAPS)
    config_maps[("kube-system", "mig-single")] = {"config.yaml": "version: v1\nflags:\n  migStrategy: single\n"}
    findings, _repairs, _ours = _audit([bare, from_config, complete, privileged, half], config_maps=config_maps)
    by = {f["subject"].split("/")[-1]: f for f in findings}
    assert sorted(by) == ["bare", "from-config", "half"] and {f["id"] for f in findings} == {"plugin_mig_privileges_missing"}
    assert by["bare"]["found"] == ["capability SYS_ADMIN", "environment variable NVIDIA_MIG_MONITOR_DEVICES=all"]
    assert "environment variable MIG_STRATEGY" in by["bare"]["hint"] and by["bare"]["severity"] == "error"
    assert "ConfigMap kube-system/mig-single flags.migStrategy" in by["from-config"]["hint"]
    assert by["half"]["found"] == ["environment variable NVIDIA_MIG_MONITOR_DEVICES=all"]


def test_item03_dev_root_unset_stays_unset():
    for version in ("v0.16.2", "v0.20.0"):
        _s, _o, config = render(version=version)
        assert "nvidiaDevRoot" not in config["flags"]
        _s, _o, config = render(version=version, nvidia_driver_root="/run/nvidia/driver")
        assert "nvidiaDevRoot" not in config["flags"] and config["flags"]["nvidiaDriverRoot"] == "/run/nvidia/driver"
    _s, _o, config = render(nvidia_dev_root="/")
    assert config["flags"]["nvidiaDevRoot"] == "/"  # set explicitly: written


@pytest.mark.parametrize("strategy", ["cdi-annotations", "cdi-cri"])
def test_item03_cdi_strategies_mount_the_driver_root_at_driver_root(strategy):
    _s, (_cm, ds), config = render(device_list_strategy=[strategy])
    spec = ds["spec"]["template"]["spec"]
    assert {"name": "driver-root", "mountPath": "/driver-root", "readOnly": True} in container_of(ds)["volumeMounts"]
    assert {"name": "driver-root", "hostPath": {"path": "/", "type": "Directory"}} in spec["volumes"]
    assert config["flags"]["plugin"]["containerDriverRoot"] == "/driver-root"
    _s, (_cm, ds), config = render(device_list_strategy=["envvar"])
    assert "driver-root" not in {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert "containerDriverRoot" not in config["flags"]["plugin"]


def test_item03_audit_reports_a_forced_dev_root_and_an_unmounted_driver_root_for_cdi():
    forced = plugin_ds("forced", selector={"nowhere": "x"}, env=[{"name": "NVIDIA_DRIVER_ROOT", "value": "/run/nvidia/driver"},
                                                                {"name": "NVIDIA_DEV_ROOT", "value": "/"}])
    unset = plugin_ds("unset", selector={"nowhere": "x"}, env=[{"name": "NVIDIA_DRIVER_ROOT", "value": "/run/nvidia/driver"}])
    cdi = plugin_ds("cdi", selector={"nowhere": "x"}, env=[{"name": "DEVICE_LIST_STRATEGY", "value": "cdi-cri"}])
    flags = plugin_ds("flags", selector={"nowhere": "x"})
    flags["spec"]["template"]["spec"]["containers"][0]["args"] = ["--driver-root=/run/nvidia/driver", "--dev-root", "/"]
    findings, _repairs, _ours = _audit([forced, unset, cdi, flags])
    assert ids(findings) == [("cdi", "plugin_cdi_driver_root_unmounted"), ("flags", "plugin_dev_root_forced"),
                             ("forced", "plugin_dev_root_forced")]
    assert "argument --dev-root is /" in next(f for f in findings if "flags" in f["subject"])["hint"]


HELM_LABELS = {"helm.sh/chart": "nvidia-device-plugin-0.17.4", "app.kubernetes.io/name": "nvidia-device-plugin",
               "app.kubernetes.io/instance": "nvdp", "app.kubernetes.io/managed-by": "Helm"}
HELM_ANNOTATIONS = {"meta.helm.sh/release-name": "nvdp", "meta.helm.sh/release-namespace": "nvidia-device-plugin"}


def _config_manager(name, send_signal):
    return {"name": name, "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.4", "command": ["config-manager"],
            "env": [{"name": "ONESHOT", "value": "false" if send_signal else "true"},
                    {"name": "CONFIG_FILE_SRCDIR", "value": "/available-configs"},
                    {"name": "CONFIG_FILE_DST", "value": "/config/config.yaml"},
                    {"name": "DEFAULT_CONFIG", "value": "default"}],
            "volumeMounts": [{"name": "available-configs", "mountPath": "/available-configs"}, {"name": "config", "mountPath": "/config"}]}


def helm_plugin(namespace="nvidia-device-plugin", selector=None, runtime_class=None, mig=None):
    """The chart's plugin DaemonSet with config.map set: config-manager init + sidecar, CONFIG_FILE on an emptyDir
    (deployments/helm/nvidia-device-plugin/templates/daemonset-device-plugin.yml)."""
    env = [{"name": "MPS_ROOT", "value": "/run/nvidia/mps"}, {"name": "CONFIG_FILE", "value": "/config/config.yaml"},
           {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    if mig:
        env.insert(1, {"name": "MIG_STRATEGY", "value": mig})
    spec = {"shareProcessNamespace": True, "initContainers": [_config_manager("nvidia-device-plugin-init", False)],
            "containers": [_config_manager("nvidia-device-plugin-sidecar", True),
                           {"name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.4",
                            "command": ["nvidia-device-plugin"], "env": env,
                            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                            "volumeMounts": [{"name": "kubelet-device-plugins-dir", "mountPath": "/var/lib/kubelet/device-plugins"},
                                             {"name": "available-configs", "mountPath": "/available-configs"},
                                             {"name": "config", "mountPath": "/config"}]}],
            "volumes": [{"name": "kubelet-device-plugins-dir", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}},
                        {"name": "available-configs", "configMap": {"name": "nvdp-nvidia-device-plugin-configs"}},
                        {"name": "config", "emptyDir": {}}],
            "nodeSelector": selector or GPU}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvdp-nvidia-device-plugin", "namespace": namespace, "labels": dict(HELM_LABELS), "annotations": dict(HELM_ANNOTATIONS)},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "nvidia-device-plugin", "app.kubernetes.io/instance": "nvdp"}},
                     "template": {"metadata": {"labels": {"app.kubernetes.io/name": "nvidia-device-plugin", "app.kubernetes.io/instance": "nvdp"}},
                                  "spec": spec}}}


def helm_mps_daemon(namespace="nvidia-device-plugin"):
    """The chart's mps-control-daemon DaemonSet: same image, not a plugin (templates/daemonset-mps-control-daemon.yml)."""
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvdp-nvidia-device-plugin-mps-control-daemon", "namespace": namespace,
                         "labels": dict(HELM_LABELS), "annotations": dict(HELM_ANNOTATIONS)},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "nvidia-device-plugin-mps-control-daemon"}},
                     "template": {"metadata": {"labels": {"app.kubernetes.io/name": "nvidia-device-plugin-mps-control-daemon"}},
                                  "spec": {"nodeSelector": {"nvidia.com/mps.capable": "true"},
                                           "initContainers": [{"name": "mps-control-daemon-mounts", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.4",
                                                               "command": ["mps-control-daemon", "mount-shm"]}],
                                           "containers": [{"name": "mps-control-daemon-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.4",
                                                           "command": ["mps-control-daemon"],
                                                           "env": [{"name": "CONFIG_FILE", "value": "/config/config.yaml"}]}]}}}}


HELM_CONFIGS = {("nvidia-device-plugin", "nvdp-nvidia-device-plugin-configs"): {
    "default": "version: v1\nflags:\n  migStrategy: none\n",
    "a100-mixed": "version: v1\nflags:\n  migStrategy: mixed\n"}}


def test_item04_helm_config_manager_config_is_the_plugin_config():
    ds = helm_plugin()
    assert dp.config_sources(ds) == [("nvidia-device-plugin", "nvdp-nvidia-device-plugin-configs", None, "/config/config.yaml")]
    assert dp.referenced_config_maps([ds, helm_mps_daemon()]) == [("nvidia-device-plugin", "nvdp-nvidia-device-plugin-configs")]
    findings, _repairs, _ours = _audit([ds], config_maps=HELM_CONFIGS, nodes=[node("elsewhere", {"pool": "x"})])
    assert "plugin_config_missing" not in {f["id"] for f in findings}
    # Every config in the ConfigMap is one the plugin may get (the node label nvidia.com/device-plugin.config picks it).
    (mig,) = [f for f in findings if f["id"] == "plugin_mig_privileges_missing"]
    assert "ConfigMap nvidia-device-plugin/nvdp-nvidia-device-plugin-configs key a100-mixed flags.migStrategy" in mig["hint"]
    findings, _repairs, _ours = _audit([ds], config_maps={}, nodes=[])
    assert "plugin_config_missing" in {f["id"] for f in findings}  # the ConfigMap itself is gone: reported


def test_item04_mps_control_daemon_is_not_a_second_plugin():
    mps = helm_mps_daemon()
    assert not dp.is_plugin_daemonset(mps)
    mps["spec"]["template"]["spec"]["nodeSelector"] = GPU
    findings, repairs, _ours = _audit([mps])
    assert findings == [] and repairs == []


def test_item05_resource_rename_is_reported_as_ignored_not_advertised():
    config_maps = {
        ("kube-system", "typo"): SEED_CONFIG_MAPS[("kube-system", "typo")],
        ("kube-system", "same"): {"config.yaml": "resources:\n  gpus:\n    - {pattern: '*', name: nvidia.com/gpu}\n"},
        ("kube-system", "shared"): {"config.yaml": "sharing:\n  timeSlicing:\n    renameByDefault: true\n"
                                                   "    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"
                                                   "resources:\n  gpus:\n    - {pattern: '*', name: a100}\n"},
        ("kube-system", "mig"): {"config.yaml": "resources:\n  mig:\n    - {pattern: 1g.10gb, name: small}\n"
                                                "    - {pattern: 2g.20gb, name: mig-2g.20gb}\n"},
        ("kube-system", "wrong-domain"): SEED_CONFIG_MAPS[("kube-system", "wrong-domain")],
    }
    daemonsets = [plugin_ds(name, selector={"nowhere": "x"}, config_map=name) for name, _key in
                  [(n, None) for _ns, n in config_maps]]
    findings, _repairs, _ours = _audit(daemonsets, config_maps=config_maps)
    by = {f["subject"].split("/")[-1]: f for f in findings}
    assert sorted(by) == ["mig", "shared", "typo", "wrong-domain"]
    typo = by["typo"]
    assert typo["id"] == "plugin_resource_rename_ignored" and typo["severity"] == "warning"
    assert typo["expected"] == "nvidia.com/gpu" and typo["found"] == "nvidia.com/nvidia-gpu"
    assert "ignored by the plugin; it advertises nvidia.com/gpu" in typo["hint"]
    assert "it advertises nvidia.com/gpu.shared" in by["shared"]["hint"]
    assert by["mig"]["found"] == "nvidia.com/small" and "nvidia.com/mig-<profile>" in by["mig"]["hint"]
    assert by["wrong-domain"]["id"] == "plugin_resource_name_invalid" and by["wrong-domain"]["severity"] == "error"
    assert not any(f["id"] == "plugin_resource_name_typo" for f in findings)


# ------------------------------------------------------------------------------------------------ issue 12: other installers


def operator_plugin(namespace="gpu-operator", policy="cluster-policy", uid="cp-uid"):
    """The GPU Operator's plugin DaemonSet as its controller leaves it (NVIDIA/gpu-operator
    assets/state-device-plugin/0500_daemonset.yaml + controllers/object_controls.go: ownerReference to the
    ClusterPolicy, runtimeClassName, MIG_STRATEGY from spec.mig.strategy)."""
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": namespace,
                         "labels": {"app": "nvidia-device-plugin-daemonset", "app.kubernetes.io/managed-by": "gpu-operator"},
                         "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": policy, "uid": uid,
                                              "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"selector": {"matchLabels": {"app": "nvidia-device-plugin-daemonset"}},
                     "template": {"metadata": {"labels": {"app": "nvidia-device-plugin-daemonset"}},
                                  "spec": {"nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
                                           "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                                           "containers": [{"name": "nvidia-device-plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.4",
                                                           "command": ["/bin/sh", "-c"], "args": ["/bin/entrypoint.sh"],
                                                           "env": [{"name": "MIG_STRATEGY", "value": "mixed"},
                                                                   {"name": "DEVICE_LIST_STRATEGY", "value": "none"}]}]}}}}


CLUSTER_POLICY = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy", "uid": "cp-uid"},
                  "spec": {"devicePlugin": {"enabled": True}, "mig": {"strategy": "mixed"}}}
OPERATOR_NODES = [node("gpu-a", dict(GPU, **{"nvidia.com/gpu.deploy.device-plugin": "true"})),
                  node("gpu-b", dict(GPU, **{"nvidia.com/gpu.deploy.device-plugin": "true"})), node("cpu-0", {"pool": "a"})]


def test_coexistence_installer_of_each_installer():
    assert dp.installer_of(operator_plugin()) == {"installer": "gpu-operator", "name": "ClusterPolicy cluster-policy"}
    labelled = operator_plugin()
    del labelled["metadata"]["ownerReferences"]
    assert dp.installer_of(labelled, [CLUSTER_POLICY]) == {"installer": "gpu-operator", "name": "ClusterPolicy cluster-policy"}
    assert dp.installer_of(helm_plugin()) == {"installer": "helm",
                                              "name": "Helm release nvidia-device-plugin/nvdp (chart nvidia-device-plugin-0.17.4)"}
    owned = plugin_ds("x")
    owned["metadata"]["ownerReferences"] = [{"kind": "NicClusterPolicy", "name": "nic", "controller": True}]
    assert dp.installer_of(owned) == {"installer": "controller", "name": "NicClusterPolicy nic"}
    argo = plugin_ds("x")
    argo["metadata"]["annotations"] = {"argocd.argoproj.io/tracking-id": "gpu-stack:apps/DaemonSet:kube-system/x"}
    assert dp.installer_of(argo)["installer"] == "argocd"
    _s, (_cm, ours), _c = render()
    assert dp.installer_of(ours) is None and dp.installer_of(plugin_ds("static")) is None


def test_coexistence_operator_install_is_reported_with_clusterpolicy_fields_and_never_repaired():
    _s, objects, _c = render()
    findings, repairs, ours = dp.audit([operator_plugin()], {}, OPERATOR_NODES, objects[1], ["nvidia.com/gpu"], [CLUSTER_POLICY])
    assert ours == ["gpu-a", "gpu-b"]
    by = {f["id"]: f for f in findings}
    assert set(by) == {"plugin_mig_privileges_missing", "plugin_device_list_strategy_invalid", "plugin_no_nvidia_runtime",
                       "plugin_managed_by_other_installer"}
    assert all(f["repair"] == "manual" and f["installer"] == "gpu-operator" for f in findings)
    assert by["plugin_mig_privileges_missing"]["fix"] == {"installer": "gpu-operator", "object": "ClusterPolicy cluster-policy",
                                                         "field": "spec.mig.strategy"}
    assert by["plugin_no_nvidia_runtime"]["fix"]["field"] == "spec.operator.runtimeClass"
    assert by["plugin_device_list_strategy_invalid"]["fix"]["field"] == "spec.devicePlugin.env (DEVICE_LIST_STRATEGY)"
    assert "fix it there, field spec.mig.strategy" in by["plugin_mig_privileges_missing"]["hint"]
    managed = by["plugin_managed_by_other_installer"]
    assert managed["found"] == ["gpu-a", "gpu-b"] and managed["fix"]["field"] == "spec.devicePlugin.enabled"
    assert "ClusterPolicy cluster-policy" in managed["hint"] and "adopt_installers" not in managed["hint"]
    assert repairs == [{"action": "manual", "object": "DaemonSet gpu-operator/nvidia-device-plugin-daemonset", "namespace": "gpu-operator",
                        "name": "nvidia-device-plugin-daemonset", "installer": "gpu-operator",
                        "reason": "ClusterPolicy cluster-policy owns it: gpuharden neither changes nor deletes it; fix it there"}]
    assert dp.blocking(findings) == [managed]


def test_coexistence_clusterpolicy_claims_its_labelled_nodes_before_its_daemonset_exists():
    _s, objects, _c = render()
    findings, _repairs, _ours = dp.audit([], {}, OPERATOR_NODES, objects[1], ["nvidia.com/gpu"], [CLUSTER_POLICY])
    (claim,) = findings
    assert claim["id"] == "plugin_managed_by_other_installer" and claim["subject"] == "ClusterPolicy cluster-policy"
    disabled = copy.deepcopy(CLUSTER_POLICY)
    disabled["spec"]["devicePlugin"]["enabled"] = False
    assert dp.audit([], {}, OPERATOR_NODES, objects[1], ["nvidia.com/gpu"], [disabled])[0] == []
    assert dp.audit([], {}, NODES, objects[1], ["nvidia.com/gpu"], [CLUSTER_POLICY])[0] == []  # no node labelled for it


def test_coexistence_helm_install_is_reported_with_chart_values():
    findings, repairs, _ours = _audit([helm_plugin(mig="single"), helm_mps_daemon()], config_maps=HELM_CONFIGS)
    by = {f["id"]: f for f in findings}
    assert set(by) == {"plugin_mig_privileges_missing", "plugin_managed_by_other_installer"}
    assert by["plugin_mig_privileges_missing"]["fix"]["field"] == "migStrategy"
    assert "value migStrategy" in by["plugin_mig_privileges_missing"]["hint"]
    managed = by["plugin_managed_by_other_installer"]
    assert managed["installer"] == "helm" and managed["fix"]["field"] == "devicePlugin.enabled"
    assert "adopt_installers: [helm]" in managed["hint"]
    assert [r["action"] for r in repairs] == ["manual"]
    # No runtimeClassName, and no NVIDIA_VISIBLE_DEVICES either: the chart value to set is named.
    bare = helm_plugin()
    bare["spec"]["template"]["spec"]["containers"][1]["env"] = [e for e in bare["spec"]["template"]["spec"]["containers"][1]["env"]
                                                                if e["name"] != "NVIDIA_VISIBLE_DEVICES"]
    findings, _repairs, _ours = _audit([bare], config_maps=HELM_CONFIGS)
    (runtime,) = [f for f in findings if f["id"] == "plugin_no_nvidia_runtime"]
    assert runtime["fix"] == {"installer": "helm", "object": "Helm release nvidia-device-plugin/nvdp (chart nvidia-device-plugin-0.17.4)",
                              "field": "runtimeClassName"}


def test_coexistence_helm_adoption_is_an_explicit_opt_in_and_the_operator_is_never_adopted():
    _s, objects, _c = render()
    findings, repairs, _ours = dp.audit([helm_plugin()], HELM_CONFIGS, NODES, objects[1], ["nvidia.com/gpu"], [], ["helm"])
    assert not dp.blocking(findings) and {f["id"] for f in findings} == {"plugin_competing", "plugin_mig_privileges_missing"}
    assert not any("fix" in f or "installer" in f for f in findings)
    assert [r["action"] for r in repairs] == ["delete"] and "taken over as adopt_installers allows" in repairs[0]["reason"]
    with pytest.raises(GpuhardenError, match="gpu-operator is never adopted"):
        dp.check_params(params(adopt_installers=["gpu-operator"]))
    with pytest.raises(GpuhardenError, match="'kustomize' is not one of helm"):
        dp.check_params(params(adopt_installers=["kustomize"]))
    findings, _repairs, _ours = dp.audit([operator_plugin()], {}, OPERATOR_NODES, objects[1], ["nvidia.com/gpu"], [CLUSTER_POLICY], ["helm"])
    assert dp.blocking(findings)


def test_coexistence_remove_competing_defaults_to_false_in_module_and_role():
    assert module.argument_spec()["remove_competing"]["default"] is False
    role = Path(__file__).resolve().parents[2] / "roles" / "device_plugin"
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text())
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert defaults["device_plugin_remove_competing"] is False and specs["device_plugin_remove_competing"]["default"] is False
    assert defaults["device_plugin_adopt_installers"] == [] and specs["device_plugin_adopt_installers"]["default"] == []


def test_coexistence_module_leaves_other_installers_untouched_even_with_remove_competing(monkeypatch):
    seed = plugin_ds("typo-seed", selector=GPU)  # unowned, only on our nodes: would be deleted
    cluster = FakeCluster(RUNTIME_CLASS, *[dict(n, kind="Node") for n in OPERATOR_NODES], operator_plugin(), helm_plugin(),
                          helm_mps_daemon(), seed)
    before = copy.deepcopy(cluster.objects)
    result, _fake = run_fake(monkeypatch, cluster, cluster_policies=[CLUSTER_POLICY], remove_competing=True)
    assert cluster.writes == [] and cluster.objects == before  # not even a dry run
    assert result["skipped"] is True and result["changed"] is False and result["deleted"] == []
    assert result["installers"] == ["gpu-operator", "helm"]
    assert [o["action"] for o in result["objects"]] == ["skip", "skip"]
    blocked = {f["subject"]: f for f in result["findings"] if f["id"] == "plugin_managed_by_other_installer"}
    assert sorted(blocked) == ["DaemonSet gpu-operator/nvidia-device-plugin-daemonset", "DaemonSet nvidia-device-plugin/nvdp-nvidia-device-plugin"]
    seed_repair = next(r for r in result["repairs"] if r.get("name") == "typo-seed")
    assert seed_repair["action"] == "manual" and "not deleted while another installer serves these nodes" in seed_repair["reason"]


def test_coexistence_unowned_competing_plugin_is_still_deleted_on_request(monkeypatch):
    seed = plugin_ds("typo-seed", selector={"pool": "b"})
    elsewhere = helm_plugin(selector={"pool": "elsewhere"})  # Helm serves none of our nodes: reported, not blocking
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES, seed, elsewhere)
    result, _fake = run_fake(monkeypatch, cluster, remove_competing=True)
    assert result["deleted"] == ["kube-system/typo-seed"] and not result["skipped"]
    assert ("DaemonSet", "nvidia-device-plugin", "nvdp-nvidia-device-plugin") in cluster.objects
    assert not [w for w in cluster.writes if w[3] == "nvdp-nvidia-device-plugin"]


def test_coexistence_a_managed_name_owned_by_another_installer_is_not_adopted(monkeypatch):
    _s, (cm, _ds), _c = render()
    taken = copy.deepcopy(cm)
    taken["metadata"].update(labels=dict(HELM_LABELS), annotations=dict(HELM_ANNOTATIONS))
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES, taken)
    result, _fake = run_fake(monkeypatch, cluster)
    assert result["skipped"] and [w for w in cluster.writes if not w[1]] == []
    (finding,) = [f for f in result["findings"] if f["id"] == "plugin_managed_by_other_installer"]
    assert finding["subject"] == "ConfigMap kube-system/nvidia-device-plugin-config" and finding["installer"] == "helm"


def test_coexistence_missing_clusterpolicy_crd_is_no_operator(monkeypatch):
    from kubernetes.client.rest import ApiException

    class Api:
        def __init__(self, status):
            self.status = status

        def __call__(self, *args, **kwargs):
            if self.status:
                raise ApiException(status=self.status, reason="x")
            return type("R", (), {"data": json.dumps({"items": [CLUSTER_POLICY]}).encode()})()

    requested = []

    def endpoint(status):
        def make(api, http_method, path, *keys):
            requested.append((http_method, path, keys))
            return Api(status)
        return make

    client = module._k8s_objects.Client(object(), "device_plugin")
    for status, expected in ((404, ([], None)), (None, ([CLUSTER_POLICY], None))):
        monkeypatch.setattr(module._k8s, "endpoint", endpoint(status))
        assert dpr.read_cluster_policies(client, 500) == expected
    assert requested[0] == ("GET", "/apis/nvidia.com/v1/clusterpolicies", ())  # the CRD's cluster-wide LIST
    monkeypatch.setattr(module._k8s, "endpoint", endpoint(403))
    policies, finding = dpr.read_cluster_policies(client, 500)
    assert policies == [] and finding["id"] == "plugin_operator_unknown" and "clusterpolicies.nvidia.com" in finding["hint"]
    assert "forbidden: the identity in use may not list clusterpolicies (API group nvidia.com)" in finding["hint"]
    assert client.requests == 3
    monkeypatch.setattr(module._k8s, "endpoint", endpoint(500))
    with pytest.raises(GpuhardenError, match="500"):
        dpr.read_cluster_policies(client, 500)


# ------------------------------------------------------------------------------------------------ in harden's plan
# Harden's plan makes the module's check-mode run inside its gpu_pods_info module run (option device_plugin:
# _device_plugin_reconcile.dry_run over the same code), and runs the device plugin stage only where it would change
# or report something. It must answer exactly as the module does in check mode.


def plan_clusters():
    _s, (cm, ds), _c = render()
    seed = plugin_ds("typo-seed", selector={"pool": "b"})
    taken = copy.deepcopy(cm)
    taken["metadata"].update(labels=dict(HELM_LABELS), annotations=dict(HELM_ANNOTATIONS))
    return {
        "fresh": (FakeCluster(RUNTIME_CLASS, *API_NODES), {}),
        "installed": (FakeCluster(RUNTIME_CLASS, *API_NODES, cm, ds), {}),
        "no RuntimeClass": (FakeCluster(*API_NODES), {}),
        "competing seed, removed": (FakeCluster(RUNTIME_CLASS, *API_NODES, seed), {"remove_competing": True}),
        "name taken by Helm": (FakeCluster(RUNTIME_CLASS, *API_NODES, taken), {}),
        "labels to set": (FakeCluster(RUNTIME_CLASS, *API_NODES, cm, ds),
                          {"node_labels": {"nodes": [n["metadata"]["name"] for n in API_NODES], "labels": {"gpu": "yes"}}}),
        "MIG mixed": (FakeCluster(RUNTIME_CLASS, *API_NODES, cm, ds), {"mig_strategy": "mixed"}),
    }


@pytest.mark.parametrize("name", sorted(plan_clusters()))
def test_the_plan_dry_run_answers_as_the_module_in_check_mode(monkeypatch, name):
    cluster, options = plan_clusters()[name]
    alone, fake = run_fake(monkeypatch, cluster, check_mode=True, **options)
    cluster, options = plan_clusters()[name]
    before = copy.deepcopy(cluster.objects)
    planned = dpr.dry_run(cluster, dpr.check_option(dict(options, wait=False), "gpu_pods_info: option device_plugin"))
    assert planned.pop("warnings") == fake.warnings
    assert planned.pop("clean") is False  # each of these clusters needs a change or a report
    assert planned == alone
    assert cluster.objects == before and [write for write in cluster.writes if not write[1]] == []


def test_the_plan_dry_run_is_clean_only_where_the_stage_has_nothing_to_do(monkeypatch):
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES)
    applied, _fake = run_fake(monkeypatch, cluster)  # the stage installs the plugin
    assert applied["changed"]
    option = dpr.check_option({"wait": False}, "gpu_pods_info: option device_plugin")
    again = dpr.dry_run(cluster, option)
    assert again["changed"] is False and again["clean"] is True, (again.get("findings"), again["warnings"])
    cluster.objects.pop(("DaemonSet", "kube-system", PLUGIN_NAME))  # someone deleted the DaemonSet
    assert dpr.dry_run(cluster, option)["clean"] is False


def test_the_plan_dry_run_reports_a_refusal_instead_of_raising(monkeypatch):
    _s, (cm, ds), _c = render()
    immutable = copy.deepcopy(ds)
    immutable["spec"]["selector"] = {"matchLabels": {"name": "someone-else"}}  # only a recreate changes a selector
    cluster = FakeCluster(RUNTIME_CLASS, *API_NODES, cm, immutable)
    monkeypatch.setattr(dpr, "read_cluster_policies", lambda client, limit: ([], None))
    with pytest.raises(GpuhardenError) as refused:
        run_fake(monkeypatch, FakeCluster(RUNTIME_CLASS, *API_NODES, cm, copy.deepcopy(immutable)), check_mode=True)
    planned = dpr.dry_run(cluster, dpr.check_option({}, "gpu_pods_info: option device_plugin"))
    assert planned["failed"] is True and planned["msg"] == str(refused.value) and planned["clean"] is False
    assert [write for write in cluster.writes if not write[1]] == []


@pytest.mark.parametrize("option, needle", [
    ({"mig_strategy": "some"}, "mig_strategy"),
    ({"verison": "v0.18.2"}, "verison"),
    ({"version": "v0.14.5"}, "v0.14.5"),
    ({"page_limit": 0}, "page_limit=0"),
    ("v0.18.2", "must be a mapping"),
])
def test_the_plan_option_is_validated_as_the_module_options(option, needle):
    with pytest.raises(GpuhardenError) as caught:
        dpr.check_option(option, "gpu_pods_info: option device_plugin")
    assert needle in str(caught.value)


def test_the_plan_option_takes_the_module_defaults():
    assert dpr.check_option({}, "x") == {name: spec.get("default") for name, spec in dpr.OPTIONS.items()}


def test_the_roles_options_rendered_from_its_defaults_pass_the_modules_validation(tmp_path):
    """device_plugin_audit_options as Ansible renders it from the role's defaults (what the role's call takes as
    module_defaults and the plan hands its dry run): the module's own validation takes it. An option the role leaves
    unset must be left out, not passed as null, which the module refuses where it has choices (the first harden on the
    real-nodes lab failed so)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    playbook = tmp_path / "render.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.import_role": {"name": "gpuharden.k8s.device_plugin", "tasks_from": "audit_params.yml"}},
        {"ansible.builtin.copy": {"content": "{{ device_plugin_audit_options | to_json }}", "dest": str(tmp_path / "rendered.json"),
                                  "mode": "0600"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(repo / "ansible.cfg"))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
                           "-e", "ansible_python_interpreter=%s" % sys.executable],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rendered = json.loads((tmp_path / "rendered.json").read_text())
    assert "shared_devices_allocation_policy" not in rendered and "nvidia_dev_root" not in rendered
    params = dpr.check_option(rendered, "device_plugin_audit_options")
    assert params["version"] == rendered["version"] and params["node_selector"] == {"nvidia.com/gpu.present": "true"}
