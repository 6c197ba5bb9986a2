# SPDX-License-Identifier: GPL-3.0-or-later
"""Do no harm on the seed-failures lab: the first harden run restarts each kubelet at most once (counted in the lab
systemctl's log), and a DGX (4+4 GPUs per NUMA node) with an 8-GPU workload is not switched to single-numa-node
unless asked (the admission check before a Topology Manager policy that can refuse pods).

A module of its own: one lab per module (tests/labfixtures.py holds the machine's lab lock while it is up).
"""

from __future__ import annotations

import json
import re

import pytest
from gpuharden_lab import manager

from tests.integration.cluster_side import admin, kubelet_config
from tests.integration.test_disruption import _core, failed_hosts, harden
from tests.integration.test_rollout import drift
from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab

# One line per start of the kubelet process, in the lab systemctl's log (units are named with their .service suffix).
KUBELET_STARTS = re.compile(r": (kubelet|k3s-agent)\.service: started supervisor ")




DGX = "seed-topology-none"  # dgx-a100-80gb: GPUs 0-3 on NUMA node 0, 4-7 on NUMA node 1; kubelet on none/none


@pytest.fixture(scope="module")
def seeded():
    with running_lab("seed-failures") as state:
        yield state


def kubelet_starts(state):
    counts = {}
    for node in state["nodes"]:
        log = manager.ssh(state["nodes"][node]["address"], "cat /var/log/gpuharden-systemctl.log 2>/dev/null").stdout
        counts[node] = sum(1 for line in log.splitlines() if KUBELET_STARTS.search(line))
    return counts


def eight_gpu_deployment(state):
    from kubernetes import client

    core = _core(state)
    core.patch_node(DGX, {"metadata": {"labels": {"gpuharden.io/test-pool": "train-8g"}}})
    try:
        core.create_namespace({"metadata": {"name": "train"}})
    except client.ApiException as error:
        assert error.status == 409
    client.AppsV1Api(admin(state)).create_namespaced_deployment("train", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train-8g", "namespace": "train"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "train-8g"}},
                 "template": {"metadata": {"labels": {"app": "train-8g"}},
                              "spec": {"nodeSelector": {"gpuharden.io/test-pool": "train-8g"},
                                       "containers": [{"name": "trainer", "image": "registry.invalid/train:1",
                                                       "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}})


def test_first_run_restarts_each_kubelet_at_most_once_and_keeps_a_dgx_with_an_8_gpu_workload(seeded):
    eight_gpu_deployment(seeded)
    before = kubelet_starts(seeded)
    rc, events, _stats, output = harden(seeded, extravars={"gpuharden_mig_strategy": "mixed", "runtime_class_force": True},
                                       tags=["device_permissions", "container_runtime", "kubelet_topology", "cgroup_limits"])
    after = kubelet_starts(seeded)
    restarts = {node: after[node] - before[node] for node in after}
    assert all(count <= 1 for count in restarts.values()), restarts
    assert restarts["seed-stale-cpu-state"] == 1 and restarts["seed-memory-high"] == 1, restarts
    # the DGX keeps its Topology and CPU Manager policies, and the run says which workload and which policy
    config = kubelet_config(seeded, DGX)
    assert config.get("topologyManagerPolicy") == "none" and config.get("cpuManagerPolicy") == "none", config
    assert "Not switching %s to topologyManagerPolicy" % DGX in output
    assert "train/train-8g" in output and "restricted" in output
    assert DGX not in failed_hosts(events), output[-4000:]
    assert rc == 0 or set(failed_hosts(events)) <= {"seed-pcie", "seed-isolation"}, (failed_hosts(events), output[-4000:])
    # Issue 43, item 8: drift predicts the admission check (real apiserver, the workload's template): the manager
    # settings harden keeps are reported as kept, not as remediable drift that every --remediate would retry.
    report = drift(seeded, "-l", DGX, "--json")
    node = json.loads(report.stdout)["nodes"][DGX]
    managers = [finding for finding in node["findings"] if finding["id"] == "kubelet_setting"
                and finding["subject"] in ("topologyManagerPolicy", "cpuManagerPolicy")]
    assert len(managers) == 2, node["findings"]
    for finding in managers:
        assert finding["remediable"] is False and "train/train-8g" in finding["kept"], finding
    # kubeadm's config.yaml still holds the kept managers, which harden never moves to its drop-in on this node: the
    # kubeadm revert finding is kept too (drift.apply_kept)
    reverts = [finding for finding in node["findings"] if finding["id"] == "kubelet_reverts_on_kubeadm_upgrade"]
    assert all(finding["remediable"] is False and "train/train-8g" in finding["kept"] for finding in reverts), reverts
    assert "kubelet_topology" not in node["remediable_stages"], node
    # the judge: harden again changes nothing on the DGX, so nothing there was remediable
    rc, events, stats, output = harden(seeded, tags=["kubelet_topology", "cgroup_limits"], limit=DGX)
    assert rc == 0 and not stats.get("changed", {}).get(DGX), output[-4000:]


def test_override_switches_the_dgx_anyway(seeded):
    rc, events, _stats, output = harden(seeded, extravars={"kubelet_topology_ignore_unadmittable_workloads": True},
                                        tags=["kubelet_topology"], limit=DGX)
    assert rc == 0, output[-4000:]
    assert "Applying anyway (kubelet_topology_ignore_unadmittable_workloads)" in output
    config = kubelet_config(seeded, DGX)
    assert config["topologyManagerPolicy"] == "single-numa-node" and config["cpuManagerPolicy"] == "static", config
    assert json.dumps(failed_hosts(events)) == "[]"
