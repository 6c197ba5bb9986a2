# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's cluster half: a real apiserver with kwok Nodes, kubelet stand-ins that behave like the kubelet."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from gpuharden_lab import cluster, manager
from kubernetes import client

from tests.lab.test_lab_lifecycle import host_files_changed_since
from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab

PLUGIN = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
    "spec": {
        "selector": {"matchLabels": {"name": "nvidia-device-plugin-ds"}},
        "template": {
            "metadata": {"labels": {"name": "nvidia-device-plugin-ds"}},
            "spec": {
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}],
            },
        },
    },
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    marker = tmp_path_factory.mktemp("marker") / "marker"
    marker.write_text("")
    # The stand-ins' own fleet (the healthy scenario runs the real kubelet and containerd).
    held = []
    try:
        with running_lab("mixed-fleet") as state:
            # Hold each node's network namespace open until the check below: a namespace the lab's down released
            # could otherwise give its inode number to a namespace another lab instance makes meanwhile, and that
            # lab's processes would be counted as this one's leftovers.
            held = [os.open("/run/netns/" + info["netns"], os.O_RDONLY | os.O_CLOEXEC) for info in state["nodes"].values()]
            netns_inodes = {os.fstat(handle).st_ino for handle in held}
            assert _processes_in(netns_inodes), "the nodes' services should be running in their network namespaces"
            yield state, cluster.api_client(state["cluster"]["admin_kubeconfig"])
        # Services in the nodes wrote logs, state and checkpoints: all of it stayed inside the nodes.
        assert host_files_changed_since(str(marker)) == []
        # ... and the services themselves (started at boot through the node's systemctl) died with the lab: no process
        # is left in this lab's nodes (by namespace, not by name: another lab instance's stand-ins may be running beside
        # it).  A process SIGKILLed by the down may take a moment to go.
        deadline = time.monotonic() + 10.0
        while _processes_in(netns_inodes) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert _processes_in(netns_inodes) == []
    finally:
        for handle in held:
            os.close(handle)


def _processes_in(netns_inodes):
    """The command lines of the processes living in one of these network namespaces."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "ns" / "net").stat().st_ino in netns_inodes:
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def _wait(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError("condition not met within %.0fs" % timeout)


def _address(state, node):
    return state["nodes"][node]["address"]


def test_nodes_ready_and_kubelets_healthy(lab):
    state, api = lab
    summary = cluster.node_summary(api)
    assert set(summary) == set(state["nodes"])
    assert all(info["ready"] for info in summary.values())
    for node in manager.nodes_from_state(state):  # the k3s node's kubelet runs in its k3s-agent unit
        result = manager.ssh(_address(state, node.name), "systemctl is-active %s && curl -sf http://127.0.0.1:10248/healthz" % node.spec.kubelet_unit)
        assert result.stdout.split() == ["active", "ok"], (node.name, result.stdout + result.stderr)


def test_tool_identity_is_the_shipped_service_account_and_not_admin(lab):
    state, _api = lab
    assert state["cluster"]["tool_identity"] == "system:serviceaccount:gpuharden-system:gpuharden"
    tool = cluster.api_client(state["cluster"]["tool_kubeconfig"])
    assert client.CoreV1Api(tool).list_node().items  # granted by deploy/rbac
    with pytest.raises(client.exceptions.ApiException) as raised:
        client.CoreV1Api(tool).list_secret_for_all_namespaces()
    assert raised.value.status == 403


def test_device_plugin_registration_is_mirrored(lab):
    state, api = lab
    expected = {"dgx-a100-0": "8", "hgx-h100-0": "4", "l4-k3s-0": "2", "cpu-0": None}
    allocatable = lambda: {n: i["allocatable_gpu"].get("nvidia.com/gpu") for n, i in cluster.node_summary(api).items()}  # noqa: E731
    assert all(not info["allocatable_gpu"] for info in cluster.node_summary(api).values())  # no plugin yet
    cluster.apply_objects(api, [PLUGIN])
    _wait(lambda: allocatable() == expected)
    client.AppsV1Api(api).delete_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system")
    _wait(lambda: all(not info["allocatable_gpu"] for info in cluster.node_summary(api).values()))
    cluster.apply_objects(api, [PLUGIN])
    _wait(lambda: allocatable() == expected)


def test_kubelet_refuses_a_config_the_real_validation_rejects(lab):
    state, _api = lab
    address = _address(state, "hgx-h100-0")
    config = "/var/lib/kubelet/config.yaml"
    broken = manager.ssh(
        address,
        "cp %s /run/config.good && sed -i 's/^topologyManagerPolicy: .*/topologyManagerPolicy: bogus/' %s "
        "&& systemctl restart kubelet; sleep 2; systemctl is-active kubelet; curl -s -o /dev/null -w '%%{http_code}' "
        "http://127.0.0.1:10248/healthz; echo; grep -c 'failed to validate kubelet configuration' /var/log/kubelet.log" % (config, config),
    )
    lines = broken.stdout.split()
    assert lines[0] == "failed", broken.stdout + broken.stderr
    assert lines[1] == "000"  # nothing listens: the kubelet is not running
    assert int(lines[2]) >= 1
    fixed = manager.ssh(
        address,
        "cp /run/config.good %s && systemctl restart kubelet; for i in $(seq 50); do "
        "curl -sf http://127.0.0.1:10248/healthz && break; sleep 0.2; done; echo; systemctl is-active kubelet" % config,
    )
    assert fixed.stdout.split() == ["ok", "active"], fixed.stdout + fixed.stderr
