# SPDX-License-Identifier: GPL-3.0-or-later
"""The scenarios hold what they promise: every seed of seed-failures is really there, mixed-fleet is mixed."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from gpuharden_lab import cluster, layout, manager
from kubernetes import client

from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab

NODE_PYTHON = layout.NODE_PYTHON / "bin/python"
PROCESSES = (
    "%s -c 'import json, pynvml; pynvml.nvmlInit(); print(json.dumps({i: sorted(p.pid for p in "
    "pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))) "
    "for i in range(pynvml.nvmlDeviceGetCount())}))'"
)


@pytest.fixture(scope="module")
def seeded():
    with running_lab("seed-failures") as state:
        yield state, cluster.api_client(state["cluster"]["admin_kubeconfig"])


def _ssh(state, node, command):
    result = manager.ssh(state["nodes"][node]["address"], command)
    assert result.returncode == 0, "%s: %s\n%s" % (node, command, result.stderr)
    return result.stdout


def test_device_permission_seed(seeded):
    state, _api = seeded
    assert _ssh(state, "seed-dev-perm", "stat -c '%U:%G %a %t:%T' /dev/nvidia0").split() == ["root:root", "600", "c3:0"]
    assert _ssh(state, "seed-isolation", "stat -c '%a' /dev/nvidia0").strip() == "666"


# What the seeded plugins advertise: the real plugin v0.15.0 on the real nodes.
PLUGIN_SEEDS = {
    "seed-no-plugin": {},
    # the real plugin ignores the config's renaming (measured with v0.15.0 on the real kubelet; the stand-in follows)
    "seed-resource-typo": {"nvidia.com/gpu": "2"},
    "seed-list-none": {},  # the plugin refuses deviceListStrategy none
    "seed-no-runtime": {},  # no plugin: it could not get NVML there
    "seed-mig-strategy": {},  # MIG on, no MIG monitor capability: the plugin exits (Insufficient Permissions, #399)
    "seed-dev-perm": {"nvidia.com/gpu": "8"},
}


def test_plugin_seeds_show_in_allocatable(seeded):
    state, api = seeded
    # The real plugins start after the lab is up (each pod's sandbox, the toolkit's hook, then the registration).
    deadline = time.monotonic() + 90
    while True:
        summary = cluster.node_summary(api)
        advertised = {name: summary[name]["allocatable_gpu"] for name in PLUGIN_SEEDS}
        if advertised == PLUGIN_SEEDS or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert advertised == PLUGIN_SEEDS
    # seed-mig-strategy advertises nothing because its real plugin exited, not because it has not started yet
    log = "/var/log/pods/kube-system_nvidia-device-plugin-daemonset-*/nvidia-device-plugin-ctr/*.log"
    while "Insufficient Permissions" not in _ssh(state, "seed-mig-strategy", "cat %s 2>/dev/null || true" % log):
        assert time.monotonic() < deadline + 60, _ssh(state, "seed-mig-strategy", "tail -c 2000 %s 2>/dev/null || true" % log)
        time.sleep(2)


def test_kubelet_seeds(seeded):
    state, _api = seeded
    assert _ssh(state, "seed-stale-cpu-state", "systemctl is-active kubelet || true").strip() == "failed"
    assert "please drain this node and delete the CPU manager checkpoint file" in _ssh(
        state, "seed-stale-cpu-state", "cat /var/log/kubelet.log"
    )
    config = yaml.safe_load(_ssh(state, "seed-topology-none", "cat /var/lib/kubelet/config.yaml"))
    assert config["topologyManagerPolicy"] == "none"
    assert _ssh(state, "seed-topology-none", "systemctl is-active kubelet").strip() == "active"


def test_runtime_seeds(seeded):
    state, api = seeded
    assert "nvidia" not in _ssh(state, "seed-no-runtime", "cat /etc/containerd/config.toml /etc/containerd/conf.d/*.toml 2>/dev/null || true")
    assert 'runtimes.nvidia' in _ssh(state, "seed-isolation", "cat /etc/containerd/config.toml")
    classes = {rc.metadata.name: rc for rc in client.NodeV1Api(api).list_runtime_class().items}
    assert classes["nvidia"].handler == "nvidia-legacy"
    assert classes["nvidia-overhead"].overhead.pod_fixed["nvidia.com/gpu"] == "1"


def test_pods_are_real_on_both_sides(seeded):
    state, api = seeded
    pods = {p.metadata.name: p for p in client.CoreV1Api(api).list_namespaced_pod("ml").items}
    placed = {pod["name"]: pod for pod in state["pods"]}
    assert set(pods) == set(placed)
    for name, pod in placed.items():
        assert pods[name].metadata.uid == pod["uid"]
        assert pods[name].status.phase == "Running"
        # The container's init process lives in the kubelet's cgroup for that pod, inside the node.
        cgroup = _ssh(state, pod["node"], "cat /proc/%d/cgroup" % pod["pid"])
        assert pod["uid"].replace("-", "_") in cgroup and pod["container_id"] in cgroup
    # GPU-using containers are NVML processes on the GPUs they can open.
    processes = json.loads(_ssh(state, "seed-isolation", PROCESSES % NODE_PYTHON))
    sneaky = placed["sneaky-all-gpus"]["pid"]
    assert all(sneaky in pids for pids in processes.values())  # NVIDIA_VISIBLE_DEVICES=all: on every GPU
    assert sum(placed["train-ok"]["pid"] in pids for pids in processes.values()) == 1


def test_memory_view_and_inventory(seeded):
    state, _api = seeded
    with open(state["inventory"]) as handle:
        inventory = yaml.safe_load(handle)["all"]["children"]["gpu_nodes"]["hosts"]
    assert all(host["gpuharden_cgroup_root"] == "/var/lib/gpuharden-memcg" for host in inventory.values())
    highs = _ssh(state, "seed-memory-high", "find /var/lib/gpuharden-memcg -name memory.high | xargs cat | sort | uniq -c")
    assert highs.split() == ["6", "max"]  # pod + container cgroups of infer-0, infer-1 and notebook (no limit)
    maxes = _ssh(state, "seed-memory-high", "find /var/lib/gpuharden-memcg -name memory.max | xargs cat | sort | uniq -c")
    assert maxes.split() == ["4", "17179869184", "2", "max"]
