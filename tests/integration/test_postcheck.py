# SPDX-License-Identifier: GPL-3.0-or-later
"""Role postcheck on the lab over SSH: every seeded fault nvml_check and topology_check can see is reported on the
right node and GPU (seed-failures), the unprivileged-NVML finding disappears after the device_permissions role, an
8-GPU Deployment is named as unable to fit a 4+4 NUMA DGX under single-numa-node.  The healthy fleet's post-check is
in test_postcheck_healthy.py.  Both share their scenario's lab with other modules (tests/xdist_shared_lab.py)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from gpuharden_lab import REPO_ROOT

from tests.labfixtures import shared_lab

pytestmark = pytest.mark.lab

PLAYBOOK = REPO_ROOT / "tests/integration/playbooks/postcheck.yml"
SEVERE = ("warning", "error", "critical")
DGX_SINGLE_NUMA = ("seed-dev-perm", "seed-memory-high", "seed-pcie", "seed-isolation")
DEPLOYMENT = {
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "train-8g", "namespace": "default"},
    "spec": {
        "replicas": 0,  # the template is what can land; no pod needs to be admitted for the check
        "selector": {"matchLabels": {"app": "train-8g"}},
        "template": {
            "metadata": {"labels": {"app": "train-8g"}},
            "spec": {
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "trainer", "image": "registry.example/train:1",
                                "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            },
        },
    },
}


def _play(state, *args, hosts="gpu_nodes"):
    """Run the test playbook with the admin identity for the API steps; ({host: saved result}, seconds)."""
    with tempfile.TemporaryDirectory() as results:
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"))
        started = time.monotonic()
        completed = subprocess.run(
            ["ansible-playbook", "-i", state["inventory"], str(PLAYBOOK), "-e", "postcheck_test_results=%s" % results,
             "-e", "postcheck_test_hosts=%s" % hosts, "-e", "postcheck_kubeconfig=%s" % state["cluster"]["admin_kubeconfig"], *args],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - started
        saved = {name[:-5]: json.loads(Path(results, name).read_text()) for name in os.listdir(results)}
    assert saved, "no result saved: %s\n%s" % (completed.stdout[-3000:], completed.stderr[-3000:])
    return saved, elapsed


def _found(saved, node, ident):
    return [entry for entry in saved[node]["findings"] if entry["id"] == ident]


def _severe(saved, node):
    return sorted((entry["id"], (entry.get("gpu") or {}).get("index")) for entry in saved[node]["findings"] if entry["severity"] in SEVERE)


class TestSeedFailures:
    @pytest.fixture(scope="class")
    @classmethod
    def lab(cls):
        # The shared lab's next users (tests/xdist_shared_lab.py) get it without the Deployment.
        with shared_lab("seed-failures") as state:
            from kubernetes import client, config

            api = config.new_client_from_config(config_file=state["cluster"]["admin_kubeconfig"])
            apps = client.AppsV1Api(api)
            apps.create_namespaced_deployment("default", DEPLOYMENT)
            try:
                yield state
            finally:
                apps.delete_namespaced_deployment(DEPLOYMENT["metadata"]["name"], "default")
                api.close()

    @pytest.fixture(scope="class")
    @classmethod
    def first(cls, lab):
        saved, elapsed = _play(lab)
        print("postcheck on %d nodes: %.1fs" % (len(saved), elapsed))
        return saved

    def test_every_node_was_checked_and_the_workloads_listed(self, lab, first):
        assert set(first) == set(lab["nodes"])
        assert not any(entry["workloads_failed"] for entry in first.values())

    def test_unprivileged_nvml_fails_on_gpu0_of_the_0600_node(self, first):
        denied = _found(first, "seed-dev-perm", "nvml_unprivileged_gpu_denied")
        assert [(entry["gpu"]["index"], entry["gpu"]["minor"], entry["found"]["nvml_return"], entry["found"]["return_name"])
                for entry in denied] == [(0, 0, 4, "NO_PERMISSION")]
        assert denied[0]["node"] == "seed-dev-perm" and denied[0]["severity"] == "error"
        assert first["seed-dev-perm"]["ok"] is False  # at or above the default threshold: the host fails
        assert not _found(first, "seed-isolation", "nvml_unprivileged_gpu_denied")  # same fixture, nodes at 0666

    def test_pcie_trained_down_on_gpu3_with_the_ratio(self, first):
        (pcie,) = _found(first, "seed-pcie", "pcie_link_degraded")
        assert pcie["gpu"]["index"] == 3 and pcie["gpu"]["pci_bus_id"] == "00000000:4E:00.0"
        assert pcie["expected"] == {"gen": 4, "width": 16, "bandwidth_gbps": 31.508}
        assert pcie["found"] == {"gen": 3, "width": 8, "bandwidth_gbps": 7.877, "bandwidth_ratio": 0.25}
        assert [entry["gpu"]["index"] for entry in _found(first, "seed-pcie", "nvlink_down")] == [3]
        assert first["seed-pcie"]["ok"] is False

    def test_topology_policy_none_is_reported(self, first):
        (entry,) = _found(first, "seed-topology-none", "topology_policy_no_alignment")
        assert entry["found"] == {"topologyManagerPolicy": "none"}

    def test_the_8_gpu_deployment_cannot_fit_a_4_plus_4_dgx(self, first):
        for node in DGX_SINGLE_NUMA:
            (entry,) = _found(first, node, "workload_cannot_fit_numa")
            assert entry["workload"] == {"kind": "Deployment", "namespace": "default", "name": "train-8g"}
            assert entry["found"]["gpus"] == {"trainer": 8}
            assert entry["expected"]["numa_nodes"] == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
            assert entry["fitting_policy"] == {"topologyManagerPolicy": "restricted"}
        assert not _found(first, "seed-topology-none", "workload_cannot_fit_numa")  # policy none admits it
        for node in ("seed-no-plugin", "seed-mig-strategy"):  # 2 L4s, 4 H100s: never placed there at all
            assert not _found(first, node, "workload_cannot_fit_numa")

    def test_without_the_consistency_check_gpu_workloads_info_weighs_the_workloads(self, lab):
        """The default run weighs the workloads inside the consistency check's one module run; without that check the
        role lists them with gpu_workloads_info instead, and the same node gets the same finding."""
        saved, _elapsed = _play(lab, "-e", "postcheck_consistency=false", hosts="seed-memory-high")
        (entry,) = _found(saved, "seed-memory-high", "workload_cannot_fit_numa")
        assert entry["workload"] == {"kind": "Deployment", "namespace": "default", "name": "train-8g"}
        assert not saved["seed-memory-high"]["workloads_failed"]

    def test_gpu_processes_and_mig_devices_are_listed(self, first):
        memory = [proc["used_memory_mib"] for proc in first["seed-isolation"]["nvml"]["processes"]]
        assert 4096 in memory and 2048 in memory  # train-ok and sneaky-all-gpus (NVIDIA_VISIBLE_DEVICES=all)
        assert first["seed-mig-strategy"]["nvml"]["mig_device_count"] > 0

    def test_unprivileged_nvml_passes_after_the_device_permissions_role(self, lab, first):
        assert _found(first, "seed-dev-perm", "nvml_unprivileged_gpu_denied")
        saved, _elapsed = _play(lab, "-e", "postcheck_test_fix_permissions=true", hosts="seed-dev-perm")
        assert not _found(saved, "seed-dev-perm", "nvml_unprivileged_gpu_denied")
        assert saved["seed-dev-perm"]["nvml"]["unprivileged"]["gpus"][0]["error"] is None
