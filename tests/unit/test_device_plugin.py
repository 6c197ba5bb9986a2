# SPDX-License-Identifier: GPL-3.0-or-later
"""The device plugin planner: version gate, per-version config, rendering, node placement, seed audit, rollout,
malformed options (each refused with a message naming the option and value, before any API request), and the
shared apply decision logic against a fake client."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils import _device_plugin as dp
from ansible_collections.gpuharden.k8s.plugins.module_utils import _k8s_objects
from ansible_collections.gpuharden.k8s.plugins.module_utils._errors import GpuhardenError
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
              init=None, probe=None, env=None):
    container = {"name": "nvidia-device-plugin-ctr", "image": image}
    spec = {"containers": [container], "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
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
    (container,) = spec["containers"]
    assert container["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert {"name": "kubelet-device-plugins-dir", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}} in spec["volumes"]
    assert yaml.safe_load(cm["data"]["config.yaml"]) == config
    assert config == {"version": "v1", "flags": {"migStrategy": "none", "failOnInitError": True, "nvidiaDriverRoot": "/", "nvidiaDevRoot": "/",
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
    assert result["failed"] and "device_plugin: listing DaemonSets: cannot reach the API server" in result["msg"]


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
    return sorted((f["object"].split("/")[-1], f["id"]) for f in findings)


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
        ("typo", "plugin_competing"), ("typo", "plugin_resource_name_typo"),
    ]
    by = {(f["object"], f["id"]): f for f in findings}
    typo = by[("DaemonSet kube-system/typo", "plugin_resource_name_typo")]
    assert typo["actual"] == "nvidia.com/nvidia-gpu" and "resources.gpus[0].name is 'nvidia-gpu'" in typo["message"]
    assert "ConfigMap kube-system/typo" in typo["message"]
    none = by[("DaemonSet kube-system/list-none", "plugin_device_list_strategy_invalid")]
    assert none["actual"] == "none" and "flags.plugin.deviceListStrategy is 'none'" in none["message"]
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
    assert "environment variable DEVICE_LIST_STRATEGY" in findings[0]["message"]


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
    assert on_cpu["severity"] == "warning" and on_cpu["actual"] == ["cpu-0"] and "idles" in on_cpu["message"]


def test_referenced_config_maps():
    assert dp.referenced_config_maps([plugin_ds("a", config_map="typo"), plugin_ds("b"), plugin_ds("c", config_map="typo")]) == [
        ("kube-system", "typo")]


def test_audit_scales_linearly_in_memory_not_requests():
    nodes = [node("n%d" % i, dict(GPU)) for i in range(5000)]
    findings, _repairs, ours = _audit([plugin_ds("other", selector=GPU)], nodes=nodes)
    assert len(ours) == 5000
    (competing,) = [f for f in findings if f["id"] == "plugin_competing"]
    assert competing["node_count"] == 5000 and len(competing["actual"]) == dp.SAMPLE and "and 4980 more" in competing["message"]


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
    assert "403 Forbidden" in findings[0]["message"]
