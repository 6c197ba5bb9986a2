# SPDX-License-Identifier: GPL-3.0-or-later
"""Roles runtime_class and device_plugin (with gpu_node_labels) on the seed-failures lab, over SSH and the real API server.

Check mode changes nothing (resourceVersions equal) and reports every seeded plugin misconfiguration; the RuntimeClass
with the wrong (immutable) handler fails clearly without force; the apply adopts the static install, deletes the
competing (unowned) DaemonSets when asked to (remove_competing), rolls out to the GPU nodes only (not to a CPU-only kwok
node) with runtimeClassName nvidia, the stand-in kubelets then advertise nvidia.com/gpu on the typo and list-none nodes;
a second run is changed=0 with resourceVersions unchanged; the version gate, deviceListStrategy none and the podFixed GPU
trap are refused with nothing changed.  Last, a Helm-shaped install (plugin + config-manager + mps-control-daemon) and a
GPU-Operator-shaped one (ClusterPolicy CRD + owned DaemonSet) are left byte-identical by a run with the role defaults,
and reported with where to fix them.

This module runs the seed-failures nodes on the stand-in kubelet and containerd (``stand_ins=True``), because what it
checks needs plugin pods that the real nodes cannot run here:
- the role's default release (v0.20.0), the Helm install's v0.17.4 with its config-manager, and the Operator's v0.14.5
  are not served by the Go module proxy, so the lab has no binary for their images (lab/versions.env builds v0.18.2 and
  v0.15.0), and the other installs would never settle;
- the rollout over every GPU node includes seed-no-runtime, whose containerd has no nvidia handler: the module refuses
  that rollout on real nodes (tests/integration/test_real_nodes.py pins the refusal).
The real plugin run from the role's DaemonSet, with the real kubelet and containerd, is in test_real_nodes.py and
test_real_nodes_harden.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from gpuharden_lab import REPO_ROOT

from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab

PLAYBOOK = REPO_ROOT / "tests/integration/playbooks/device_plugin.yml"
# The identity the product runs as: switch to "tool_kubeconfig" once the RBAC role set lands.
IDENTITY = "admin_kubeconfig"
NS = "kube-system"
PLUGIN = "nvidia-device-plugin-daemonset"
CPU_NODE = "dp-cpu-0"
LEGACY_NS = "gpu-legacy"
LEGACY = {
    "apiVersion": "apps/v1", "kind": "DaemonSet",
    "metadata": {"name": "legacy-plugin", "namespace": LEGACY_NS},
    "spec": {
        "selector": {"matchLabels": {"app": "legacy-plugin"}},
        "template": {
            "metadata": {"labels": {"app": "legacy-plugin"}},
            "spec": {
                "nodeSelector": {"gpuharden.io/legacy": "yes"},  # no node has it: reported, never deleted
                "initContainers": [{"name": "wait-driver", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                                    "command": ["sh", "-c", "until nvidia-smi; do sleep 5; done"]}],
                "containers": [{"name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.14.5"}],
            },
        },
    },
}


def _api(state):
    from kubernetes import config

    return config.new_client_from_config(config_file=state["cluster"]["admin_kubeconfig"])


def _play(state, *args, **extra):
    """Run the test playbook; returns (saved result, seconds)."""
    with tempfile.TemporaryDirectory() as results:
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"))
        variables = dict({"dp_test_results": results, "gpuharden_kubeconfig": state["cluster"][IDENTITY]}, **extra)
        started = time.monotonic()
        completed = subprocess.run(["ansible-playbook", "-i", state["inventory"], str(PLAYBOOK), "-e", json.dumps(variables), *args],
                                   cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - started
        path = Path(results, "result.json")
        assert path.exists(), "no result saved: %s\n%s" % (completed.stdout[-4000:], completed.stderr[-3000:])
        return json.loads(path.read_text()), elapsed


def _versions(state):
    """resourceVersion of every object the roles could touch, once the controllers have stopped updating statuses."""
    previous = _read_versions(state)
    for _attempt in range(15):
        time.sleep(2)
        current = _read_versions(state)
        if current == previous:
            return current
        previous = current
    return previous


def _read_versions(state):
    from kubernetes import client

    api = _api(state)
    try:
        out = {}
        for ds in client.AppsV1Api(api).list_daemon_set_for_all_namespaces().items:
            out["ds/%s/%s" % (ds.metadata.namespace, ds.metadata.name)] = ds.metadata.resource_version
        for cm in client.CoreV1Api(api).list_namespaced_config_map(NS).items:
            out["cm/%s" % cm.metadata.name] = cm.metadata.resource_version
        for rc in client.NodeV1Api(api).list_runtime_class().items:
            out["rc/%s" % rc.metadata.name] = rc.metadata.resource_version
        for node in client.CoreV1Api(api).list_node().items:
            out["node-labels/%s" % node.metadata.name] = (node.metadata.labels, node.spec.taints)
        return out
    finally:
        api.close()


def _findings(result, ident):
    return [f for f in result["plugin"].get("findings") or [] if f["id"] == ident]


@pytest.fixture(scope="module")
def lab():
    with running_lab("seed-failures", stand_ins=True) as state:
        from kubernetes import client

        api = _api(state)
        core = client.CoreV1Api(api)
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEGACY_NS}})
        client.AppsV1Api(api).create_namespaced_daemon_set(LEGACY_NS, LEGACY)
        # A CPU-only node that exists only in the API server (kwok keeps it Ready and runs pods bound to it).
        core.create_node({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": CPU_NODE, "annotations": {"kwok.x-k8s.io/node": "fake"},
                                       "labels": {"kubernetes.io/hostname": CPU_NODE, "gpuharden.io/lab": "true"}},
                          "status": {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                                     "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}})
        # One GPU node without the GPU label: the role labels it and installs the plugin in one module run, so even
        # check mode must count it among the plugin's nodes (it picks them from the Nodes as the labels leave them).
        core.patch_node(_unlabelled(state), {"metadata": {"labels": {"nvidia.com/gpu.present": None}}})
        api.close()
        yield state


def _unlabelled(state):
    return sorted(state["nodes"])[-1]


@pytest.fixture(scope="module")
def check_run(lab):
    before = _versions(lab)
    result, elapsed = _play(lab, "--check", "--diff", runtime_class_force=True, device_plugin_remove_competing=True)
    print("check mode: %.1fs" % elapsed)
    return before, result, _versions(lab)


def test_check_mode_reports_changes_and_changes_nothing(lab, check_run):
    before, result, after = check_run
    assert result["ok"], result.get("msg")
    assert before == after  # every resourceVersion, every node's labels and taints
    plugin = result["plugin"]
    assert plugin["changed"] is True
    actions = {(o["kind"], o["name"]): o["action"] for o in plugin["objects"]}
    assert actions == {("ConfigMap", "nvidia-device-plugin-config"): "create", ("DaemonSet", PLUGIN): "adopt"}
    assert sorted(plugin["deleted"]) == ["kube-system/nvidia-device-plugin-list-none", "kube-system/nvidia-device-plugin-typo"]
    assert plugin["rollout"] == {}
    assert result["runtime_class"]["changed"] is True and result["runtime_class"]["action"] == "recreate"
    unlabelled = _unlabelled(lab)
    assert result["labels"]["changed"] is True and result["labels"]["changed_nodes"] == [unlabelled]
    assert result["labels"]["nodes"][unlabelled] == {"before": {"labels": {}}, "after": {"labels": {"nvidia.com/gpu.present": "true"}}}
    # the plugin's nodes as the labels will leave them, the unlabelled one included, from the one LIST of Nodes
    assert sorted(plugin["target_nodes"]) == sorted(lab["nodes"])


def test_seed_misconfigurations_are_caught_with_clear_messages(check_run):
    _before, result, _after = check_run
    (typo,) = _findings(result, "plugin_resource_rename_ignored")
    assert typo["subject"] == "DaemonSet kube-system/nvidia-device-plugin-typo" and typo["found"] == "nvidia.com/nvidia-gpu"
    assert "'nvidia-gpu': ignored by the plugin; it advertises nvidia.com/gpu" in typo["hint"] and typo["severity"] == "warning"
    # The seeds set no runtimeClassName: NVML only where nvidia is containerd's default runtime.
    assert {f["subject"] for f in _findings(result, "plugin_no_nvidia_runtime")} >= {
        "DaemonSet kube-system/nvidia-device-plugin-typo", "DaemonSet kube-system/nvidia-device-plugin-list-none"}
    (none,) = _findings(result, "plugin_device_list_strategy_invalid")
    assert none["subject"] == "DaemonSet kube-system/nvidia-device-plugin-list-none" and none["found"] == "none"
    assert "refuses to start" in none["hint"]
    competing = {f["subject"]: f["found"] for f in _findings(result, "plugin_competing")}
    assert competing == {"DaemonSet kube-system/nvidia-device-plugin-list-none": ["seed-list-none"],
                         "DaemonSet kube-system/nvidia-device-plugin-typo": ["seed-resource-typo"]}
    (old,) = _findings(result, "plugin_version_too_old")
    assert old["subject"] == "DaemonSet gpu-legacy/legacy-plugin" and old["found"] == "v0.14.5" and old["repair"] == "manual"
    (gate,) = _findings(result, "plugin_init_gate_without_readiness")
    assert gate["subject"] == "DaemonSet gpu-legacy/legacy-plugin" and "nvidia-smi" in gate["hint"]
    rc = {f["id"]: f for f in result["runtime_class"]["findings"]}
    assert rc["runtime_class_handler_mismatch"]["found"] == "nvidia-legacy"
    assert rc["runtime_class_overhead_gpu"]["subject"] == "RuntimeClass nvidia-overhead"
    assert "phantom" in rc["runtime_class_overhead_gpu"]["hint"]


def test_wrong_handler_without_force_fails_clearly_and_changes_nothing(lab, check_run):
    before = _versions(lab)
    result, _elapsed = _play(lab, dp_test_plugin=False)
    assert not result["ok"]
    assert "handler 'nvidia-legacy'" in result["msg"] and "immutable" in result["msg"] and "force=true" in result["msg"]
    assert _versions(lab) == before


@pytest.fixture(scope="module")
def applied(lab, check_run):
    result, elapsed = _play(lab, runtime_class_force=True, device_plugin_remove_competing=True)
    print("apply with rollout: %.1fs" % elapsed)
    return result


def test_apply_installs_and_rolls_out_to_gpu_nodes_only(lab, applied):
    from kubernetes import client

    assert applied["ok"], applied.get("msg")
    plugin = applied["plugin"]
    assert plugin["changed"] is True
    assert plugin["rollout"]["done"] is True and plugin["rollout"]["ready"] == len(lab["nodes"]) == plugin["rollout"]["target_count"]
    assert sorted(plugin["target_nodes"]) == sorted(lab["nodes"])
    assert applied["labels"]["changed_nodes"] == [_unlabelled(lab)]
    api = _api(lab)
    try:
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        names = {ds.metadata.name for ds in apps.list_namespaced_daemon_set(NS).items}
        assert names == {PLUGIN}  # the competing DaemonSets are gone
        ds = apps.read_namespaced_daemon_set(PLUGIN, NS)
        assert ds.spec.template.spec.node_selector == {"nvidia.com/gpu.present": "true"}  # the seed's selector did not survive
        assert ds.spec.template.spec.containers[0].image == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
        assert ds.spec.template.spec.runtime_class_name == "nvidia"
        assert any(entry.manager == "gpuharden" and entry.operation == "Apply" for entry in ds.metadata.managed_fields)
        pods = core.list_namespaced_pod(NS, label_selector="name=nvidia-device-plugin-ds").items
        assert sorted(p.spec.node_name for p in pods if p.metadata.deletion_timestamp is None) == sorted(lab["nodes"])
        assert CPU_NODE not in {p.spec.node_name for p in pods}
        rc = client.NodeV1Api(api).read_runtime_class("nvidia")
        assert rc.handler == "nvidia"
        # The stand-in kubelets mirror the running plugin: the typo and list-none nodes now advertise nvidia.com/gpu.
        deadline = time.monotonic() + 30
        while True:
            allocatable = {name: core.read_node(name).status.allocatable or {} for name in ("seed-resource-typo", "seed-list-none")}
            if all(a.get("nvidia.com/gpu") == "2" and "nvidia.com/nvidia-gpu" not in a for a in allocatable.values()):
                break
            assert time.monotonic() < deadline, allocatable
            time.sleep(1)
    finally:
        api.close()


def test_second_run_is_unchanged(lab, applied):
    before = _versions(lab)
    result, elapsed = _play(lab, runtime_class_force=True, device_plugin_remove_competing=True)
    print("second run: %.1fs" % elapsed)
    assert result["ok"], result.get("msg")
    assert result["plugin"]["changed"] is False and result["labels"]["changed"] is False
    assert result["runtime_class"]["changed"] is False
    assert [o["action"] for o in result["plugin"]["objects"]] == ["none", "none"]
    assert _findings(result, "plugin_competing") == []
    after = _versions(lab)
    for key in ("ds/kube-system/%s" % PLUGIN, "cm/nvidia-device-plugin-config", "rc/nvidia"):
        assert before[key] == after[key]


@pytest.mark.parametrize(("extra", "needle"), [
    ({"device_plugin_version": "v0.14.2"}, "'v0.14.2' is below 0.15.0"),
    ({"device_plugin_version": "latest"}, "'latest' is not a device plugin release tag"),
    ({"device_plugin_version": "v0.15.0-rc.2"}, "is below 0.15.0"),
    ({"device_plugin_version": "v0.15.1", "device_plugin_nvidia_dev_root": "/"}, "nvidia_dev_root='/' needs release 0.16.0"),
    ({"device_plugin_device_list_strategy": ["none"]}, "device_list_strategy=none is not a device list strategy"),
])
def test_refused_plugin_settings_change_nothing(lab, applied, extra, needle):
    before = _versions(lab)
    result, _elapsed = _play(lab, dp_test_runtime_class=False, **extra)
    assert not result["ok"] and needle in result["msg"], result["msg"]
    assert _versions(lab) == before


def test_gpu_overhead_is_refused(lab, applied):
    before = _versions(lab)
    result, _elapsed = _play(lab, dp_test_plugin=False, runtime_class_overhead_pod_fixed={"cpu": "100m", "nvidia.com/gpu": "1"})
    assert not result["ok"] and "phantom GPUs" in result["msg"], result["msg"]
    assert _versions(lab) == before


# ------------------------------------------------------------------------------------------------ other installers
# Shapes as the real installers leave them: the nvidia-device-plugin Helm chart with config.map set
# (NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin/templates/daemonset-device-plugin.yml,
# daemonset-mps-control-daemon.yml) and the GPU Operator's plugin DaemonSet owned by its ClusterPolicy
# (NVIDIA/gpu-operator assets/state-device-plugin/0500_daemonset.yaml, controllers/object_controls.go).

HELM_NS = "nvidia-device-plugin"
OPERATOR_NS = "gpu-operator"
HELM_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"
HELM_META = {"labels": {"helm.sh/chart": "nvidia-device-plugin-0.17.4", "app.kubernetes.io/name": "nvidia-device-plugin",
                        "app.kubernetes.io/instance": "nvdp", "app.kubernetes.io/version": "0.17.4",
                        "app.kubernetes.io/managed-by": "Helm"},
             "annotations": {"meta.helm.sh/release-name": "nvdp", "meta.helm.sh/release-namespace": HELM_NS}}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _helm_objects():
    def config_manager(name, sidecar):
        return {"name": name, "image": HELM_IMAGE, "command": ["config-manager"],
                "env": [{"name": "ONESHOT", "value": "false" if sidecar else "true"}, {"name": "KUBECONFIG", "value": ""},
                        {"name": "NODE_LABEL", "value": "nvidia.com/device-plugin.config"},
                        {"name": "CONFIG_FILE_SRCDIR", "value": "/available-configs"},
                        {"name": "CONFIG_FILE_DST", "value": "/config/config.yaml"}, {"name": "DEFAULT_CONFIG", "value": "default"}],
                "volumeMounts": [{"name": "available-configs", "mountPath": "/available-configs"}, {"name": "config", "mountPath": "/config"}]}

    def meta(name):
        return dict(json.loads(json.dumps(HELM_META)), name=name, namespace=HELM_NS)

    plugin_labels = {"app.kubernetes.io/name": "nvidia-device-plugin", "app.kubernetes.io/instance": "nvdp"}
    mps_labels = {"app.kubernetes.io/name": "nvidia-device-plugin-mps-control-daemon", "app.kubernetes.io/instance": "nvdp"}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("nvdp-nvidia-device-plugin-configs"),
                  "data": {"default": "version: v1\nflags:\n  migStrategy: none\n",
                           "typo": "version: v1\nresources:\n  gpus:\n    - pattern: '*'\n      name: nvidia-gpu\n"}}
    plugin = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta("nvdp-nvidia-device-plugin"),
              "spec": {"selector": {"matchLabels": plugin_labels}, "template": {"metadata": {"labels": plugin_labels}, "spec": {
                  "priorityClassName": "system-node-critical", "shareProcessNamespace": True, "nodeSelector": {"nvidia.com/gpu.present": "true"},
                  "tolerations": TOLERATIONS, "initContainers": [config_manager("nvidia-device-plugin-init", False)],
                  "containers": [config_manager("nvidia-device-plugin-sidecar", True), {
                      "name": "nvidia-device-plugin-ctr", "image": HELM_IMAGE, "command": ["nvidia-device-plugin"],
                      "env": [{"name": "MPS_ROOT", "value": "/run/nvidia/mps"}, {"name": "CONFIG_FILE", "value": "/config/config.yaml"},
                              {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}],
                      "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                      "volumeMounts": [{"name": "kubelet-device-plugins-dir", "mountPath": "/var/lib/kubelet/device-plugins"},
                                       {"name": "available-configs", "mountPath": "/available-configs"}, {"name": "config", "mountPath": "/config"}]}],
                  "volumes": [{"name": "kubelet-device-plugins-dir", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}},
                              {"name": "available-configs", "configMap": {"name": "nvdp-nvidia-device-plugin-configs"}},
                              {"name": "config", "emptyDir": {}}]}}}}
    mps = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta("nvdp-nvidia-device-plugin-mps-control-daemon"),
           "spec": {"selector": {"matchLabels": mps_labels}, "template": {"metadata": {"labels": mps_labels}, "spec": {
               "nodeSelector": {"nvidia.com/mps.capable": "true"}, "tolerations": TOLERATIONS,
               "initContainers": [{"name": "mps-control-daemon-mounts", "image": HELM_IMAGE, "command": ["mps-control-daemon", "mount-shm"],
                                   "securityContext": {"privileged": True}}],
               "containers": [{"name": "mps-control-daemon-ctr", "image": HELM_IMAGE, "command": ["mps-control-daemon"],
                               "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], "securityContext": {"privileged": True}}]}}}}
    return config_map, plugin, mps


CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "clusterpolicies.nvidia.com"},
       "spec": {"group": "nvidia.com", "scope": "Cluster",
                "names": {"kind": "ClusterPolicy", "listKind": "ClusterPolicyList", "plural": "clusterpolicies", "singular": "clusterpolicy"},
                "versions": [{"name": "v1", "served": True, "storage": True,
                              "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
POLICY = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
          "spec": {"operator": {"defaultRuntime": "containerd", "runtimeClass": "nvidia"}, "mig": {"strategy": "single"},
                   "devicePlugin": {"enabled": True, "repository": "nvcr.io/nvidia", "image": "k8s-device-plugin", "version": "v0.14.5"}}}


def _operator_daemonset(policy_uid):
    labels = {"app": "nvidia-device-plugin-daemonset"}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": OPERATOR_NS,
                         "labels": dict(labels, **{"app.kubernetes.io/managed-by": "gpu-operator"}),
                         "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy",
                                              "uid": policy_uid, "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"}, "tolerations": TOLERATIONS,
                "priorityClassName": "system-node-critical", "runtimeClassName": "nvidia",
                "containers": [{"name": "nvidia-device-plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.14.5",
                                "command": ["/bin/sh", "-c"], "args": ["/bin/entrypoint.sh"], "securityContext": {"privileged": True},
                                "env": [{"name": "PASS_DEVICE_SPECS", "value": "true"}, {"name": "FAIL_ON_INIT_ERROR", "value": "true"},
                                        {"name": "DEVICE_LIST_STRATEGY", "value": "envvar"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                                        {"name": "MIG_STRATEGY", "value": "single"}, {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}]}]}}}}


def _foreign_state(state):
    """Every object of the two other installs (and the managed ones), as the API server stores them."""
    from kubernetes import client

    api = _api(state)
    try:
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)

        def raw(response):
            return json.loads(response.data)

        out = {}
        for namespace, name in ((HELM_NS, "nvdp-nvidia-device-plugin"), (HELM_NS, "nvdp-nvidia-device-plugin-mps-control-daemon"),
                                (OPERATOR_NS, "nvidia-device-plugin-daemonset"), (NS, PLUGIN)):
            out["ds/%s/%s" % (namespace, name)] = raw(apps.read_namespaced_daemon_set(name, namespace, _preload_content=False))
        for namespace, name in ((HELM_NS, "nvdp-nvidia-device-plugin-configs"), (NS, "nvidia-device-plugin-config")):
            out["cm/%s/%s" % (namespace, name)] = raw(core.read_namespaced_config_map(name, namespace, _preload_content=False))
        out["clusterpolicy"] = client.CustomObjectsApi(api).get_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy")
        out["crd"] = raw(client.ApiextensionsV1Api(api).read_custom_resource_definition(CRD["metadata"]["name"], _preload_content=False))
        return out
    finally:
        api.close()


def _rolled_out(objects):
    for key, obj in objects.items():
        if key.startswith("ds/"):
            status, meta = obj.get("status") or {}, obj["metadata"]
            if status.get("observedGeneration") != meta.get("generation") or not (
                    status.get("desiredNumberScheduled", 0) == status.get("numberReady", 0) == status.get("updatedNumberScheduled", 0)):
                return False
    return True


def _settled_foreign_state(state):
    """The state once every DaemonSet has rolled out and three reads in a row (4 s) are equal."""
    history = [_foreign_state(state)]
    deadline = time.monotonic() + 120
    while not (len(history) >= 3 and history[-1] == history[-2] == history[-3] and _rolled_out(history[-1])):
        assert time.monotonic() < deadline, "the other installs never settled"
        time.sleep(2)
        history.append(_foreign_state(state))
    return history[-1]


@pytest.fixture(scope="module")
def other_installers(lab, applied):
    """A Helm release and a GPU Operator install serving the lab's GPU nodes next to the managed plugin."""
    from kubernetes import client

    api = _api(lab)
    try:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        for namespace in (HELM_NS, OPERATOR_NS):
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        config_map, plugin, mps = _helm_objects()
        core.create_namespaced_config_map(HELM_NS, config_map)
        apps.create_namespaced_daemon_set(HELM_NS, plugin)
        apps.create_namespaced_daemon_set(HELM_NS, mps)
        client.ApiextensionsV1Api(api).create_custom_resource_definition(CRD)
        custom = client.CustomObjectsApi(api)
        deadline = time.monotonic() + 60
        while True:  # the new resource is served once the CRD is Established
            try:
                policy = custom.create_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", POLICY)
                break
            except client.exceptions.ApiException as error:
                assert error.status == 404 and time.monotonic() < deadline, error
                time.sleep(1)
        apps.create_namespaced_daemon_set(OPERATOR_NS, _operator_daemonset(policy["metadata"]["uid"]))
        # The operator labels the GPU nodes it deploys its plugin to.
        for name in sorted(lab["nodes"])[:2]:
            core.patch_node(name, {"metadata": {"labels": {"nvidia.com/gpu.deploy.device-plugin": "true"}}})
    finally:
        api.close()
    before = _settled_foreign_state(lab)
    result, elapsed = _play(lab)  # the role defaults
    print("run next to other installers: %.1fs" % elapsed)
    return before, result, _foreign_state(lab)


def test_other_installers_are_left_byte_identical_and_reported_with_where_to_fix_them(other_installers):
    before, result, after = other_installers
    assert result["ok"], result.get("msg")
    assert after == before  # same resourceVersion and JSON: Helm's, the operator's and the managed objects
    for key, obj in after.items():
        assert not any(entry.get("manager") == "gpuharden" for entry in obj["metadata"].get("managedFields") or []
                       if not key.endswith("/%s" % PLUGIN) and not key.endswith("/nvidia-device-plugin-config")), key
    plugin = result["plugin"]
    assert plugin["skipped"] is True and plugin["changed"] is False and plugin["deleted"] == []
    assert {"helm", "gpu-operator"} <= set(plugin["installers"])
    assert [o["action"] for o in plugin["objects"]] == ["skip", "skip"]
    managed = {f["subject"]: f for f in _findings(result, "plugin_managed_by_other_installer")}
    helm = managed["DaemonSet %s/nvdp-nvidia-device-plugin" % HELM_NS]
    assert helm["fix"] == {"installer": "helm", "object": "Helm release %s/nvdp (chart nvidia-device-plugin-0.17.4)" % HELM_NS,
                           "field": "devicePlugin.enabled"}
    assert sorted(helm["found"]) == sorted(lab_nodes(result)) and "adopt_installers: [helm]" in helm["hint"]
    operator = managed["DaemonSet %s/nvidia-device-plugin-daemonset" % OPERATOR_NS]
    assert operator["fix"] == {"installer": "gpu-operator", "object": "ClusterPolicy cluster-policy", "field": "spec.devicePlugin.enabled"}
    assert len(operator["found"]) == 2
    # Drift inside each install, with the field to change there.
    (rename,) = [f for f in _findings(result, "plugin_resource_rename_ignored") if f.get("installer") == "helm"]
    assert "key typo" in rename["hint"] and rename["fix"]["field"] == "config.map" and "value config.map" in rename["hint"]
    (old,) = [f for f in _findings(result, "plugin_version_too_old") if f.get("installer") == "gpu-operator"]
    assert old["fix"]["field"] == "spec.devicePlugin.version" and old["repair"] == "manual"
    # The Helm config reached through config-manager is the plugin's; the MPS control daemon is not a plugin.
    helm_ids = {f["id"] for f in plugin["findings"] if f["subject"] == "DaemonSet %s/nvdp-nvidia-device-plugin" % HELM_NS}
    assert "plugin_config_missing" not in helm_ids and "plugin_no_nvidia_runtime" not in helm_ids
    assert not [f for f in plugin["findings"] if "mps-control-daemon" in f["subject"]]


def lab_nodes(result):
    return result["plugin"]["target_nodes"]
