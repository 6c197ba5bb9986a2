# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 43 item 4 on the gpu-operator lab: a node the NVIDIA GPU Operator runs is byte-identical after a default harden,
and the harden run and the drift report name what was deferred to the operator.

The node (scenarios/gpu-operator.yaml, lab operatornode.py) runs the real kubelet and containerd 2.4.2 with what the
operator's toolkit and driver containers leave on a node: the real toolkit under /usr/local/nvidia/toolkit behind its
wrappers, the toolkit's containerd drop-in with the runtimes nvidia, nvidia-cdi and nvidia-legacy, and a driver root at
/run/nvidia/driver; it carries the operator's deploy labels.  Here, as the operator would, the API server gets the
ClusterPolicy (under its CRD), the RuntimeClass nvidia and the device plugin DaemonSet, both owned by the ClusterPolicy:
the real plugin v0.18.2 runs in the DaemonSet's pod through the toolkit's runtime and registers the GPUs with the real
kubelet, so the node is as an operator-run node is before gpuharden comes.

Then the product's harden_gpu_nodes.yml runs as the lab inventory sets it up (a default run): the node stages the
operator owns (container_runtime, device_permissions) defer, the device plugin stage leaves the operator's plugin, and
the kubelet needs nothing: the scenario lays it out as gpuharden leaves a kubeadm v1.36 node (its drop-in, read through
--config-dir in /etc/default/kubelet).  Every managed path of the node is compared before and after: content, type,
mode, owner, device numbers and link target.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
from gpuharden_lab import manager, realnode
from gpuharden_lab.noderoot import load_fixture
from kubernetes import client

from tests.integration.cluster_side import admin, ensure_namespace, recap_changed, wait_for
from tests.integration.test_device_plugin import CRD  # the ClusterPolicy CRD, its schema left open
from tests.integration.test_real_nodes import gpu_resources, in_node
from tests.labfixtures import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

NODE = "gpu-operator-0"
OPERATOR_NS = "gpu-operator"
PLUGIN_IMAGE = "%s:%s" % (realnode.DEVICE_PLUGIN_IMAGE, realnode.versions()["NVIDIA_DEVICE_PLUGIN_VERSION"])
# As the chart's default values leave it: every component enabled by default (clusterpolicy_types.go IsEnabled)
POLICY = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
          "spec": {"operator": {"defaultRuntime": "containerd", "runtimeClass": "nvidia"}, "toolkit": {"enabled": True},
                   "driver": {"enabled": True}, "devicePlugin": {"enabled": True}, "cdi": {"enabled": True}}}
# The node paths gpuharden's node stages write and the operator's containers own.
WATCHED = ("/etc/containerd", "/usr/local/nvidia", "/run/nvidia", "/etc/modprobe.d", "/etc/udev/rules.d", "/etc/default",
           "/etc/systemd/system", "/etc/kubernetes/kubelet.conf.d", "/var/lib/kubelet/config.yaml",
           "/var/lib/kubelet/kubeadm-flags.env", "/var/lib/kubelet/cpu_manager_state", "/dev/char")
SNAPSHOT = ("{ find %s; find /dev -maxdepth 1 -name 'nvidia*'; find /dev/nvidia-caps; } 2>/dev/null | sort -u | while read -r p; do "
            "h=-; if [ -f \"$p\" ] && [ ! -L \"$p\" ]; then h=$(sha256sum < \"$p\" | cut -c1-64); fi; "
            "echo \"$(stat -c '%%n %%F %%a %%U:%%G %%t:%%T %%N' \"$p\") $h\"; done" % " ".join(WATCHED))


def snapshot(state) -> list[str]:
    done = in_node(state, NODE, ["sh", "-c", SNAPSHOT])
    assert done.returncode == 0 and done.stdout, done
    return done.stdout.splitlines()


def _owned_by(policy):
    return [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": policy["metadata"]["name"], "uid": policy["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}]


def _plugin_daemonset(policy):
    labels = {"app": "nvidia-device-plugin-daemonset"}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": OPERATOR_NS, "ownerReferences": _owned_by(policy),
                         "labels": dict(labels, **{"app.kubernetes.io/managed-by": "gpu-operator"})},
            "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"}, "runtimeClassName": "nvidia",
                "priorityClassName": "system-node-critical",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "nvidia-device-plugin", "image": PLUGIN_IMAGE, "imagePullPolicy": "Never",
                                "securityContext": {"privileged": True},
                                "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "true"}],
                                "volumeMounts": [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}]}],
                "volumes": [{"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}]}}}}


@pytest.fixture(scope="module")
def lab():
    with running_lab("gpu-operator") as state:
        yield state


@pytest.fixture(scope="module")
def operator(lab):
    """The operator's objects in the API server, and its plugin advertising the node's GPUs through its toolkit."""
    api = admin(lab)
    try:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(CRD)
        custom = client.CustomObjectsApi(api)

        def created():  # served once the CRD is Established
            try:
                return custom.create_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", POLICY)
            except client.exceptions.ApiException as error:
                assert error.status == 404, error
                return None

        policy = wait_for(created, timeout=60, what="the ClusterPolicy CRD to be served")
        client.NodeV1Api(api).create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "nvidia",
                                                    "metadata": {"name": "nvidia", "ownerReferences": _owned_by(policy)}})
        ensure_namespace(client.CoreV1Api(api), OPERATOR_NS)
        client.AppsV1Api(api).create_namespaced_daemon_set(OPERATOR_NS, _plugin_daemonset(policy))
    finally:
        api.close()
    gpus = str(len(load_fixture("l4")[1]["gpus"]))
    wait_for(lambda: gpu_resources(lab, NODE).get("nvidia.com/gpu") == gpus, timeout=300, interval=2,
             what="the operator's plugin to advertise %s GPUs through the toolkit's runtime" % gpus)
    return lab


def test_the_node_is_byte_identical_after_a_default_harden_and_the_deferrals_are_named(operator):
    before = snapshot(operator)
    assert any(line.startswith("/etc/containerd/conf.d/99-nvidia.toml ") for line in before), before
    assert any(line.startswith("/etc/kubernetes/kubelet.conf.d/50-gpuharden.conf ") for line in before), before
    started = time.monotonic()
    done = manager.run_harden(operator["inventory"], {}, timeout=900)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    after = snapshot(operator)
    assert after == before, [line for line in after if line not in before] + ["--- gone:"] + [line for line in before if line not in after]
    output = done.stdout + done.stderr
    # the plan's audit names each deferral with why and the fix (node_audit's warnings)
    assert "containerd check: containerd's nvidia runtime (/etc/containerd/conf.d/99-nvidia.toml): not changed (refused)" in output, output[-8000:]
    assert "device_nodes check: the NVIDIA device nodes" in output and "driver container owns it" in output
    assert "ClusterPolicy cluster-policy runs the GPU Operator's container toolkit on this node" in output
    assert "gpuharden_operator_takeover: [container_runtime]" in output
    # nothing changed anywhere (cluster side included): no task of the run reports a change
    assert recap_changed(done.stdout)[NODE] == 0, done.stdout[-8000:]
    # the device plugin stage left the operator's plugin alone and applied none of its own; the node still advertises
    api = admin(operator)
    try:
        apps = client.AppsV1Api(api)
        assert apps.list_daemon_set_for_all_namespaces(label_selector="app.kubernetes.io/managed-by=gpuharden").items == []
        assert apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", OPERATOR_NS).metadata.generation == 1
    finally:
        api.close()
    assert gpu_resources(operator, NODE).get("nvidia.com/gpu") == str(len(load_fixture("l4")[1]["gpus"]))
    print("default harden on the operator node: %.0f s" % seconds)


def test_drift_reports_the_deferred_checks_as_refused_not_drift(operator):
    with tempfile.TemporaryDirectory() as tmp:
        report_path = os.path.join(tmp, "report.json")
        done = subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-i", operator["inventory"], "-q", "--report", report_path],
                              cwd=realnode.REPO_ROOT, capture_output=True, text=True, check=False, timeout=600,
                              env=dict(os.environ, ANSIBLE_CONFIG=str(realnode.REPO_ROOT / "ansible.cfg")))
        assert os.path.exists(report_path), done.stdout[-4000:] + done.stderr[-4000:]
        with open(report_path) as handle:
            report = json.load(handle)
    node = report["nodes"][NODE]
    assert node["status"] == "clean" and node["findings"] == [], (node, done.stdout[-3000:])
    checks = node["checks"]
    for name, owner in (("containerd", "container toolkit"), ("device_nodes", "driver container")):
        assert checks[name]["status"] == "ok" and checks[name]["would_change"] is False, checks[name]
        [entry] = checks[name]["refused"]
        assert ("the NVIDIA GPU Operator's %s owns it" % owner) in entry["why"] and "ClusterPolicy cluster-policy" in entry["why"], entry
        assert "gpuharden_operator_takeover" in entry["fix"], entry
