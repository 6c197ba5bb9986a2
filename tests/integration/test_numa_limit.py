# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 43, item 3: the kubelet's own NUMA limit, on the real kubelet v1.36.3 (the `grace` lab: one GB200 NVL-style
node whose /sys/devices/system/node holds 34 NUMA nodes, 32 of them CPU-less).

First the lab is shown faithful: with topologyManagerPolicy single-numa-node and no max-allowable-numa-nodes, the
real kubelet refuses to start there ("unsupported on machines with more than 8 NUMA Nodes",
pkg/kubelet/cm/topologymanager/topology_manager.go), so it reads the node's NUMA nodes, not the host's.  Then the
role refuses max-allowable-numa-nodes=4 before any write, and a default harden (the role's single-numa-node) leaves
the kubelet running with max-allowable-numa-nodes raised to 34, the node Ready, and a GPU pod admitted under the
policy (the kubelet's hints do not enumerate the 2^34 NUMA sets)."""

from __future__ import annotations

import json
import time

import pytest
from gpuharden_lab import manager, realnode
from kubernetes import client

from tests.builds import skip_unbuilt
from tests.integration.cluster_side import (
    GPUHARDEN_DROPIN,
    KUBEADM_CONFIG,
    admin,
    failures,
    kubelet_config,
    kubelet_configz,
    plugin_sees_the_node_s_pci_devices,
    run,
    wait_for,
)
from tests.integration.test_real_nodes import in_node, node_objects
from tests.labfixtures import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

NODE = "grace-gb200-0"
NUMA_NODES = 34
CONFIG = KUBEADM_CONFIG
# Every file the kubelet's settings come from on this kubeadm v1.36 node: a default harden writes them to gpuharden's
# drop-in and adds --config-dir to /etc/default/kubelet (the durable route), leaving kubeadm's config.yaml alone.
KUBELET_FILES = "for f in %s %s /etc/default/kubelet; do echo \"== $f\"; cat $f 2>&1; done" % (CONFIG, GPUHARDEN_DROPIN)
HEALTHZ = ["curl", "-s", "--max-time", "2", "http://127.0.0.1:10248/healthz"]


@pytest.fixture(scope="module")
def lab():
    if not realnode.available():
        skip_unbuilt("the real kubelet and containerd are not built: run `make real-lab` (or `make real-components`)")
    with running_lab("grace") as state:
        yield state


def healthy(state):
    return in_node(state, NODE, HEALTHZ).stdout == "ok"


def kubelet_log(state):
    return in_node(state, NODE, ["cat", "/var/log/kubelet.log"]).stdout


def ready(state):
    conditions = {c["type"]: c["status"] for c in node_objects(state)[NODE]["status"]["conditions"]}
    return conditions.get("Ready") == "True"


def test_the_node_shows_its_numa_nodes_and_the_real_kubelet_refuses_single_numa_node_over_the_limit(lab):
    listed = in_node(lab, NODE, ["sh", "-c", "ls -d /sys/devices/system/node/node*"]).stdout.split()
    assert len(listed) == NUMA_NODES, listed
    assert healthy(lab)
    config = in_node(lab, NODE, ["cat", CONFIG]).stdout
    node = next(node for node in manager.nodes_from_state(lab) if node.name == NODE)
    node.write_live(CONFIG, config + "topologyManagerPolicy: single-numa-node\n")
    try:
        assert in_node(lab, NODE, ["systemctl", "restart", "kubelet"]).returncode == 0
        wait_for(lambda: "unsupported on machines with more than 8 NUMA Nodes" in kubelet_log(lab), timeout=90,
                 what="the real kubelet refusing single-numa-node on 34 NUMA nodes")
        assert not healthy(lab)
    finally:
        node.write_live(CONFIG, config)
        in_node(lab, NODE, ["systemctl", "restart", "kubelet"])
    wait_for(lambda: healthy(lab), timeout=90, what="the real kubelet healthy again on its own config")


def test_max_allowable_numa_nodes_4_is_refused_before_any_write(lab):
    config_before = in_node(lab, NODE, ["sh", "-c", KUBELET_FILES]).stdout
    pid_before = in_node(lab, NODE, ["systemctl", "show", "-p", "MainPID", "--value", "kubelet"]).stdout.strip()
    found, _stats, _seconds = run(lab, playbook="kubelet_topology.yml",
                                  extravars={"kubelet_topology_topology_manager_policy_options": {"max-allowable-numa-nodes": 4}})
    refused = [r for r in found if r["_event"] == "runner_on_failed" and r["_host"] == NODE]
    assert refused, failures(found)
    assert "kubelet_topology_topology_manager_policy_options=" in refused[0]["msg"] and "at least 8" in refused[0]["msg"]
    assert in_node(lab, NODE, ["sh", "-c", KUBELET_FILES]).stdout == config_before
    assert in_node(lab, NODE, ["systemctl", "show", "-p", "MainPID", "--value", "kubelet"]).stdout.strip() == pid_before
    assert healthy(lab)


def test_a_default_harden_raises_the_limit_and_leaves_the_kubelet_running_and_the_node_ready(lab):
    done = manager.run_harden(lab["inventory"], {}, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:]
    # said on the output: the kubelet_config module's warning (Ansible prints warnings on stderr)
    assert "max-allowable-numa-nodes is set to %d" % NUMA_NODES in done.stdout + done.stderr, done.stderr[-3000:]
    # written where the kubelet reads it (kubeadm's config.yaml with gpuharden's drop-in over it) ...
    config = kubelet_config(lab, NODE)
    assert config.get("topologyManagerPolicy") == "single-numa-node", config
    assert config.get("topologyManagerPolicyOptions", {}).get("max-allowable-numa-nodes") == str(NUMA_NODES), config
    assert healthy(lab) and ready(lab)
    # ... and what the real kubelet runs with: its /configz
    running = kubelet_configz(lab, NODE)
    assert running["topologyManagerPolicy"] == "single-numa-node", running
    assert running.get("topologyManagerPolicyOptions", {}).get("max-allowable-numa-nodes") == str(NUMA_NODES), running
    time.sleep(2)
    assert in_node(lab, NODE, ["systemctl", "is-active", "kubelet"]).stdout.strip() == "active"
    # the real kubelet took the option: its own warning above 8 (policy_options.go), and the policy it runs
    log = kubelet_log(lab)
    assert "max-allowable-numa-nodes is more than the default recommended value" in log
    assert "topologyPolicyName=\"single-numa-node\"" in log or "single-numa-node" in log


def _plugin_reports_numa(core):
    """The plugin pod on NODE is one of the patched template (the node's PCI devices in its sysfs), Ready, and the
    node advertises its GPUs again."""
    pods = [pod for pod in core.list_namespaced_pod("kube-system").items if pod.spec.node_name == NODE and not pod.metadata.deletion_timestamp
            and any(container.name == "nvidia-device-plugin-ctr" for container in pod.spec.containers)]
    ready = [pod for pod in pods if any(volume.name == "lab-pci-devices" for volume in pod.spec.volumes or [])
             and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])]
    node = core.read_node(NODE)
    return len(pods) == 1 and len(ready) == 1 and int((node.status.allocatable or {}).get("nvidia.com/gpu", "0")) > 0


def test_a_gpu_pod_is_admitted_under_single_numa_node_on_34_numa_nodes(lab):
    """The kubelet v1.36.3 computes device hints over the NUMA nodes the devices are on (devicemanager/topology_hints.go),
    so raising the limit to 34 does not make admission enumerate 2^34 NUMA sets: the pod is admitted at once.  The
    plugin sees the node's PCI devices (a real node's sysfs; cluster_side.plugin_sees_the_node_s_pci_devices), so the
    GPUs carry their NUMA node and the kubelet really aligns: its checkpoint files the device under that NUMA node."""
    api = admin(lab)
    core = client.CoreV1Api(api)
    image = realnode.sandbox_image_name(in_node(lab, NODE, ["cat", "/etc/containerd/config.toml"]).stdout)
    plugin_sees_the_node_s_pci_devices(lab, "kube-system", "nvidia-device-plugin-daemonset")
    wait_for(lambda: _plugin_reports_numa(core), timeout=180, what="the plugin with the node's PCI devices, advertising the GPUs")
    try:
        core.create_namespaced_pod("default", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "numa-probe"},
            "spec": {"nodeName": NODE, "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                     "runtimeClassName": "nvidia",
                     "containers": [{"name": "probe", "image": image, "imagePullPolicy": "Never", "command": ["/pause"],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})

        def admitted():
            pod = core.read_namespaced_pod("numa-probe", "default")
            assert pod.status.phase != "Failed", (pod.status.reason, pod.status.message)
            return pod.status.phase == "Running"

        started = time.monotonic()
        wait_for(admitted, timeout=120, what="the GPU pod admitted and running")
        assert time.monotonic() - started < 120
        assert healthy(lab)
        # the allocation the device manager checkpointed: under the GPU's NUMA node, not "-1" (no topology)
        uid = core.read_namespaced_pod("numa-probe", "default").metadata.uid
        checkpoint = json.loads(in_node(lab, NODE, ["cat", "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"]).stdout)
        entries = [entry for entry in checkpoint["Data"]["PodDeviceEntries"] if entry["PodUID"] == uid and entry["ResourceName"] == "nvidia.com/gpu"]
        assert entries and all(int(numa) >= 0 for entry in entries for numa in entry["DeviceIDs"]), entries
    finally:
        core.delete_namespaced_pod("numa-probe", "default", grace_period_seconds=0)
        api.close()
